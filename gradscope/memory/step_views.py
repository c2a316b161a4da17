"""Renderings of a training step's memory (``StepMemory``): the peak and its categories as a
rich table, and the timeline as a PNG stacked by category (matplotlib)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table

from ..graph.nodes import format_bytes
from ..output.formats import register_renderer
from ..output.plots import pyplot, save_png
from ..output.style import cell
from .step_records import CATEGORIES, StepMemory


def render_step_memory(mem: StepMemory) -> Group:
    """The peak line, where it occurs, and the bytes by category at that moment."""
    head = (f"step peak {format_bytes(mem.peak)} in the {mem.peak_phase}"
            + (f" of step {mem.peak_step}" if mem.optimizer is not None else "")
            + (f" on rank {mem.rank} of {mem.world_size}" if mem.rank is not None else ""))
    where = f"at {mem.peak_at}"
    parts: list[Any] = [cell(head), cell(where)]
    if mem.optimizer is not None:
        parts.append(cell(f"first step {format_bytes(mem.first_step)}, steady state "
                          f"{format_bytes(mem.steady_state)} ({mem.optimizer})"))
    if mem.measured is not None:
        parts.append(cell(f"measured ({mem.measured_method}): {format_bytes(mem.measured)}"))
    table = Table(box=None, pad_edge=False, show_edge=False)
    table.add_column("at the peak", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    for c in CATEGORIES:
        n = mem.at_peak.get(c, 0)
        if c in _DISTRIBUTED and not n and mem.rank is None:
            continue  # FSDP2's categories, shown where there is a process group
        share = f"{100 * n / mem.peak:.1f}%" if mem.peak else "-"
        table.add_row(cell(c.replace("_", " ")), cell(format_bytes(n)), cell(share))
    parts.append(table)
    for note in mem.notes:
        parts.append(cell(f"note: {note}"))
    return Group(*parts)


_COLOURS = {"parameters": "tab:blue", "gradients": "tab:orange",
            "optimizer_state": "tab:purple", "activations": "tab:green",
            "temporaries": "tab:grey", "inputs": "tab:cyan",
            "gathered_parameters": "tab:olive", "communication": "tab:red"}
_DISTRIBUTED = ("gathered_parameters", "communication")


def plot_step_memory(mem: StepMemory, path: str | Path, *, title: str = "") -> Path:
    """The timeline stacked by category, the peak marked, the measured peak as a line."""
    plt = pyplot("the step-memory plot")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    try:
        xs = [p.index for p in mem.timeline]
        ys = [[p.bytes[k] / 2**20 for p in mem.timeline] for k in range(len(CATEGORIES))]
        ax.stackplot(xs, ys, labels=[c.replace("_", " ") for c in CATEGORIES],
                     colors=[_COLOURS[c] for c in CATEGORIES], alpha=0.8, step="post")
        top = max(mem.timeline, key=lambda p: p.total) if mem.timeline else None
        if top is not None:
            ax.scatter([top.index], [top.total / 2**20], marker="*", s=140, color="red",
                       zorder=4, label=f"peak {format_bytes(mem.peak)} ({mem.peak_phase})")
        if mem.measured is not None:
            ax.axhline(mem.measured / 2**20, color="black", linestyle=":",
                       label=f"measured {format_bytes(mem.measured)}")
        ax.set(xlabel="event (dispatched op)", ylabel="live (MiB)",
               title=title or "memory of a training step" + (
                   f" (rank {mem.rank} of {mem.world_size})" if mem.rank is not None else ""))
        ax.legend(fontsize=7, loc="upper left")
    except BaseException:
        plt.close(fig)
        raise
    return save_png(fig, path)


register_renderer("step_memory", render_step_memory)
register_renderer("step_memory_plot", plot_step_memory)
