"""Views of a GradMonitor's history: rich report, JSON Lines, CSV, TensorBoard, PNG plot.

Each takes the monitor's plain-data history and returns a value or writes a file; none prints.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..errors import MissingExtraError
from ..model.files import atomic_path, write_atomic, write_with
from ..model.formats import register_renderer

# The monitor is passed in (its history, alerts, names and settings are read); views import
# nothing of capture, so it is typed loosely here.
GradMonitor = Any
ParamStats = Any

_BARS = "▁▂▃▄▅▆▇█"
_MAX_ALERT_LINES = 5
_FIELDS = ("norm", "max_abs", "mean_abs", "nan", "inf", "zero_frac", "update_ratio")


def sparkline(values: list[float], width: int) -> str:
    """One character per value (the last ``width``), on a log scale; ``!`` marks non-finite."""
    values = values[-width:]
    finite = [math.log10(v) for v in values if math.isfinite(v) and v > 0]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    out = []
    for v in values:
        if not math.isfinite(v):
            out.append("!")
        elif v <= 0:
            out.append(" ")
        else:
            frac = (math.log10(v) - lo) / (hi - lo) if hi > lo else 0.5
            out.append(_BARS[min(len(_BARS) - 1, int(frac * len(_BARS)))])
    return "".join(out)


def _status(mon: GradMonitor, name: str) -> str:
    kinds = sorted({a.kind for a in mon.alerts if a.name == name}, key=_severity)
    return kinds[0] if kinds else "ok"


def _severity(kind: str) -> int:
    return ("nan", "inf", "exploding", "vanishing", "forward_nonfinite", "leak").index(kind)


def render_report(mon: GradMonitor, *, width: int = 24) -> Group:
    """The terminal report (see ``GradMonitor.report``)."""
    table = Table(title="gradient report", title_justify="left", show_edge=False)
    for col, just in (
        ("parameter", "left"),
        ("norm", "right"),
        ("history", "left"),
        ("max abs", "right"),
        ("nan", "right"),
        ("inf", "right"),
        ("status", "left"),
    ):
        table.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
    for name in mon.names:
        seen = [st.params[name] for st in mon.history if name in st.params]
        if not seen:
            table.add_row(name, "-", "", "-", "0", "0", "no grad")
            continue
        last = seen[-1]
        status = _status(mon, name)
        table.add_row(
            name,
            f"{last.norm:.3g}",
            sparkline([s.norm for s in seen], width),
            f"{last.max_abs:.3g}",
            str(sum(s.nan for s in seen)),
            str(sum(s.inf for s in seen)),
            Text(status, style="" if status == "ok" else "bold red"),
        )
    lines = [Text(summary(mon))]
    first = next((a for a in mon.alerts if a.kind in ("nan", "inf", "forward_nonfinite")), None)
    if first is not None:
        lines.append(Text(f"first non-finite: {first.name} at step {first.step}", style="bold red"))
    shown = mon.alerts[:_MAX_ALERT_LINES]
    lines.extend(Text(f"  {a.kind}: {a.message}") for a in shown)
    if len(mon.alerts) > len(shown):
        lines.append(Text(f"  ... {len(mon.alerts) - len(shown)} more alerts in .alerts / --json"))
    return Group(table, *lines)


def summary(mon: GradMonitor) -> str:
    """One line: logged steps, the latest total norm and its range, the alerts by kind."""
    if not mon.history:
        return "no step logged yet: run a backward (or optimizer step) inside the monitor"
    totals = [st.total_norm for st in mon.history]
    finite = [t for t in totals if math.isfinite(t)]
    span = f" (min {min(finite):.3g}, max {max(finite):.3g})" if finite else ""
    counts: dict[str, int] = {}
    for a in mon.alerts:
        counts[a.kind] = counts.get(a.kind, 0) + 1
    alerts = ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"
    return (
        f"{len(mon.history)} logged steps (every {mon.every}), total norm {totals[-1]:.3g}"
        f"{span}; alerts: {alerts}"
    )


def _finite_or_none(v: float | None) -> float | None:
    return v if v is None or math.isfinite(v) else None


def _stats_dict(ps: ParamStats) -> dict[str, Any]:
    return {
        f: _finite_or_none(getattr(ps, f)) if f not in ("nan", "inf") else getattr(ps, f)
        for f in _FIELDS
    }


def write_jsonl(mon: GradMonitor, path: Path) -> Path:
    """One JSON object per logged step: step, total_norm, params, modules, alerts."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    for a in mon.alerts:
        by_step.setdefault(a.step, []).append(
            {"kind": a.kind, "name": a.name, "message": a.message}
        )
    lines = []
    for st in mon.history:
        obj = {
            "step": st.step,
            "total_norm": _finite_or_none(st.total_norm),
            "params": {n: _stats_dict(ps) for n, ps in st.params.items()},
            "modules": {n: _stats_dict(ps) for n, ps in st.modules.items()},
            "alerts": by_step.get(st.step, []),
        }
        lines.append(json.dumps(obj, allow_nan=False) + "\n")
    return write_atomic(path, "".join(lines))


def write_csv(mon: GradMonitor, path: Path) -> Path:
    """Long format: one row per (step, parameter), with the step's total norm on each row."""
    def write(f: Any) -> None:
        w = csv.writer(f)
        w.writerow(["step", "param", *_FIELDS, "total_norm"])
        for st in mon.history:
            for name, ps in st.params.items():
                row = ["" if v is None else v for v in (getattr(ps, x) for x in _FIELDS)]
                w.writerow([st.step, name, *row, st.total_norm])

    return write_with(path, write)


def write_tensorboard(mon: GradMonitor, writer: Any) -> None:
    """Scalars per step and a histogram of the per-parameter norms per step."""
    import numpy as np

    for st in mon.history:
        writer.add_scalar("grad_norm/total", st.total_norm, st.step)
        for name, ps in st.params.items():
            writer.add_scalar(f"grad_norm/{name}", ps.norm, st.step)
            writer.add_scalar(f"grad_nonfinite/{name}", ps.nan + ps.inf, st.step)
            if ps.update_ratio is not None:
                writer.add_scalar(f"update_ratio/{name}", ps.update_ratio, st.step)
        norms = np.array([ps.norm for ps in st.params.values() if math.isfinite(ps.norm)])
        if norms.size:  # histograms cannot hold NaN/Inf; those are in grad_nonfinite/*
            writer.add_histogram("grad_norm/per_parameter", norms, st.step)


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise MissingExtraError(
            "GradMonitor.plot needs matplotlib, which is not installed; "
            "pip install gradscope[plot] (or pip install matplotlib)"
        ) from None
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def plot_png(mon: GradMonitor, path: Path) -> Path:
    """Gradient flow per layer (latest and max norm) and the total norm over steps, as a PNG."""
    plt = _pyplot()
    names = [n for n in mon.names if any(n in st.params for st in mon.history)]
    fig, (ax_flow, ax_total) = plt.subplots(
        1, 2, figsize=(max(10, 0.25 * len(names) + 6), 4.5), gridspec_kw={"width_ratios": [3, 1]}
    )
    try:
        _flow(ax_flow, mon, names)
        steps = [st.step for st in mon.history]
        ax_total.plot(steps, [_plottable(st.total_norm) for st in mon.history], marker=".")
        ax_total.set(title="total gradient norm", xlabel="step", yscale="log")
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
    finally:
        plt.close(fig)
    return path


def _plottable(v: float) -> float:
    return v if math.isfinite(v) and v > 0 else float("nan")


def _flow(ax: Any, mon: GradMonitor, names: list[str]) -> None:
    latest = [
        next(st.params[n].norm for st in reversed(mon.history) if n in st.params) for n in names
    ]
    peak = [
        max((st.params[n].norm for st in mon.history if n in st.params), key=_plottable_key)
        for n in names
    ]
    xs = list(range(len(names)))
    ax.bar(xs, [_plottable(v) for v in peak], color="lightgray", label="max over steps")
    ax.bar(xs, [_plottable(v) for v in latest], color="steelblue", label="latest")
    bad = [x for x, v in zip(xs, latest, strict=True) if not math.isfinite(v)]
    if bad:
        ax.scatter(bad, [1.0] * len(bad), color="red", marker="x", label="NaN/Inf", zorder=3)
    ax.set_xticks(xs, names, rotation=90, fontsize=7)
    ax.set(title="gradient flow per parameter", yscale="log", ylabel="gradient norm")
    ax.legend(fontsize=7)


def _plottable_key(v: float) -> float:
    return v if math.isfinite(v) else -1.0


register_renderer("monitor_report", render_report)
register_renderer("monitor_jsonl", write_jsonl)
register_renderer("monitor_csv", write_csv)
register_renderer("monitor_tensorboard", write_tensorboard)
register_renderer("monitor_plot", plot_png)
