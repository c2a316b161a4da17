"""Renderings of activation reports and checkpoint plans: the per-module table (rich), the
plan with its verification, and the memory-vs-recompute curve (matplotlib PNG)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table

from ..graph.nodes import format_bytes, plural
from ..output.formats import register_renderer
from ..output.plots import pyplot, save_png
from ..output.style import cell
from .activations_records import (
    SEGMENT,
    ActivationReport,
    ModuleRow,
    Plan,
    Verification,
    format_flops,
)


def _label(path: str) -> str:
    return "(model)" if path == "" else path


def ranked(report: ActivationReport) -> list[ModuleRow]:
    """Rows ranked by what a checkpoint of the module frees, then by activation bytes."""
    return sorted(report.rows,
                  key=lambda r: (-max(r.checkpoint_saves, 0), -r.activation_bytes, r.path))


def render_activations(report: ActivationReport, *, top: int = 20) -> Group:
    """The summary line and the table: one row per module, ranked by ``checkpoint_saves``;
    columns for the autocast and batch what-ifs when the report has them."""
    parts: list[Any] = [cell(report.summary())]
    table = Table(box=None, pad_edge=False, show_edge=False)
    table.add_column("module", overflow="fold", ratio=1)
    table.add_column("activations", justify="right", no_wrap=True)
    table.add_column("ckpt frees", justify="right", no_wrap=True)
    table.add_column("recompute", justify="right", no_wrap=True)
    if report.autocast is not None:
        table.add_column(cell(report.autocast), justify="right", no_wrap=True)
    if report.batch_scale is not None:
        table.add_column(cell(f"batch x{report.batch_scale:g}"), justify="right", no_wrap=True)
    rows = ranked(report)
    for r in rows[:top]:
        cells = [cell(_label(r.path)), cell(format_bytes(r.activation_bytes)),
                 cell(format_bytes(r.checkpoint_saves) if r.checkpoint_saves > 0 else "-"),
                 cell(format_flops(r.recompute_flops))]
        if report.autocast is not None:
            cells.append(cell(format_bytes(r.autocast_bytes or 0)))
        if report.batch_scale is not None:
            cells.append(cell(format_bytes(r.scaled_bytes or 0)))
        table.add_row(*cells)
    if len(rows) > top:
        table.add_row(cell(f"… {len(rows) - top} more modules"), "", "", "")
    parts.append(table)
    extra = []
    if report.autocast_total is not None:
        extra.append(f"under {report.autocast} autocast: {format_bytes(report.autocast_total)}")
    if report.scaled_total is not None:
        extra.append(f"at batch x{report.batch_scale:g}: {format_bytes(report.scaled_total)} "
                     "(linear extrapolation)")
    if extra:
        parts.append(cell("; ".join(extra)))
    for note in report.notes:
        parts.append(cell(f"note: {note}"))
    return Group(*parts)


def render_plan(plan: Plan, verification: Verification | None = None,
                every_block: Plan | None = None) -> Group:
    """The plan in words, its modules one per line, the "every block" rule beside it and
    the verification run."""
    parts: list[Any] = [cell(plan.summary())]
    for m in plan.modules:
        n = m.count(SEGMENT) + 1
        parts.append(cell(f"  {_label(m)}" + (f"  (segment: {n} modules as one)" if n > 1 else "")))
    if every_block is not None and every_block.modules:
        parts.append(cell(
            f"checkpoint every block ({plural(len(every_block.modules), 'module')}): "
            f"{format_bytes(every_block.predicted)} predicted, recomputing "
            f"{format_flops(every_block.recompute_flops)}"
        ))
    if verification is not None:
        parts.append(cell(verification.summary()))
    return Group(*parts)


def plot_curve(sweep: Sequence[Plan], path: str | Path, *, every_block: Plan | None = None,
               chosen: Plan | None = None, measured: int | None = None,
               title: str = "") -> Path:
    """The memory-vs-recompute curve of a budget sweep as a PNG: predicted activation bytes
    against recompute FLOPs, the "checkpoint every block" rule and the chosen plan (with its
    measured bytes) marked."""
    plt = pyplot("the memory plot")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    try:
        pts = sorted(sweep, key=lambda p: p.recompute_flops)
        ax.plot([p.recompute_flops / 1e9 for p in pts], [p.predicted / 2**20 for p in pts],
                marker="o", drawstyle="steps-post", label="plans (predicted)")
        if every_block is not None and every_block.modules:
            ax.scatter([every_block.recompute_flops / 1e9], [every_block.predicted / 2**20],
                       marker="s", color="tab:orange", zorder=3, label="checkpoint every block")
        if chosen is not None:
            ax.scatter([chosen.recompute_flops / 1e9], [chosen.predicted / 2**20], marker="*",
                       s=140, color="tab:green", zorder=4, label="chosen plan")
            if chosen.budget is not None:
                ax.axhline(chosen.budget / 2**20, color="grey", linestyle=":", label="budget")
            if measured is not None:
                ax.scatter([chosen.recompute_flops / 1e9], [measured / 2**20], marker="x",
                           color="red", zorder=5, label="measured")
        ax.set(xlabel="recompute (GFLOP)", ylabel="activations held (MiB)",
               title=title or "memory vs recompute")
        ax.legend(fontsize=8)
    except BaseException:
        plt.close(fig)
        raise
    return save_png(fig, path)


def plot_report(report: ActivationReport, path: str | Path, *, chosen: Plan | None = None,
                measured: int | None = None, title: str = "") -> Path:
    """``ActivationReport.plot``: the report's budget sweep drawn by ``plot_curve``."""
    blocks = report.blocks()
    return plot_curve(report.sweep(), path, every_block=report.evaluate(blocks) if blocks else None,
                      chosen=chosen, measured=measured, title=title)


register_renderer("activations", render_activations)
register_renderer("activations_plot", plot_report)
register_renderer("plan", render_plan)
