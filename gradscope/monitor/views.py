"""Views of a GradMonitor's history: rich report, JSON Lines, CSV, TensorBoard, PNG plot.

Each takes the monitor's plain-data ``MonitorLog`` (never the live monitor) and returns a value
or writes a file; none prints.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..output.envelope import dumps, envelope
from ..output.files import write_atomic, write_with
from ..output.formats import register_renderer
from ..output.plots import pyplot, save_png
from ..output.style import clean_rich, clean_text
from .incident import alert_line
from .log import (
    ALERT_KINDS,
    STAT_FIELDS,
    Alert,
    MonitorLog,
    first_record,
    log_header,
    nonfinite_kind,
    step_record,
)
from .spikes import SPIKE_MIN_VALUES
from .spikes import signals as spike_signals

_BARS = "▁▂▃▄▅▆▇█"
_MAX_ALERT_LINES = 5
_MAX_INCIDENTS = 3
_FIELDS = STAT_FIELDS


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


def _statuses(log: MonitorLog) -> dict[str, str]:
    """The most severe alert kind of each parameter (an alert concerns all of its names)."""
    out: dict[str, str] = {}
    for a in log.alerts:
        for name in a.names:
            if name not in out or _severity(a.kind) < _severity(out[name]):
                out[name] = a.kind
    return out


def _mark_nonfinite(log: MonitorLog, statuses: dict[str, str]) -> None:
    """Mark "nan" / "inf" every parameter whose gradient held one at some logged step (kept or
    dropped), not only those an alert named (NaN and Inf alert once for the whole model, when
    they start)."""
    seen: dict[str, str] = {}
    for kind, names in (("nan", log.dropped.nan), ("inf", log.dropped.inf)):
        for name in names:
            seen.setdefault(name, kind)
    for st in log.steps:
        if st.skipped:
            continue
        for name, ps in st.params.items():
            found = nonfinite_kind(ps)
            if found is not None and (name not in seen or found == "nan"):
                seen[name] = found
    for name, kind in seen.items():
        if _severity(kind) < _severity(statuses.get(name, "ok")):
            statuses[name] = kind


def _severity(kind: str) -> int:
    return ALERT_KINDS.index(kind) if kind in ALERT_KINDS else len(ALERT_KINDS)


def _most(counts: list[int | None]) -> str:
    """The largest count of one logged step ("?" when one could not be counted)."""
    known = [c for c in counts if c is not None]
    top = max(known, default=0)
    return str(top) if len(known) == len(counts) or top else ">0"


def render_report(log: MonitorLog, *, width: int = 24) -> Group:
    """The terminal report (see ``GradMonitor.report``). The nan and inf columns are per-step
    counts: the most seen in one logged step (not a sum over steps).

    Numbers are never cut: their columns do not wrap; at 80 columns a long parameter name wraps
    onto a second line (whole) and the history sparkline shortens to what fits."""
    lines = [Text(summary(log))]
    above = incident_lines(log)
    if log.distributed:
        lines.append(Text(f"distributed: {log.distributed}"))
    first = next((a for a in log.alerts if a.kind in ("nan", "inf", "forward_nonfinite")), None)
    if first is not None:
        # a value the batch already held: the replay named the input, not the first module
        held = next((i.input for i in log.incidents if i.step == first.step and i.input), None)
        what = f"{held} (before the forward)" if held else first.name
        lines.append(Text(f"first non-finite: {clean_text(what)} at step {first.step}",
                          style="bold red"))
    shown = log.alerts[:_MAX_ALERT_LINES]
    lines.extend(Text(f"  {a.kind}: {clean_text(alert_line(a, log.incidents))}") for a in shown)
    if len(log.alerts) > len(shown):
        lines.append(Text(f"  ... {len(log.alerts) - len(shown)} more alerts in .alerts / --json"))
    # names are text (Text never reads markup), their control characters made visible
    return Group(
        *(clean_rich(line) for line in above),
        _ReportTable(log, width),
        *(clean_rich(line) for line in lines),
    )


def incident_lines(log: MonitorLog) -> list[Text]:
    """The incidents (first bad steps and their origin), for above the report's table."""
    out: list[Text] = []
    for inc in log.incidents[:_MAX_INCIDENTS]:
        head, *rest = inc.summary().splitlines()
        out.append(Text(f"incident: {head}", style="bold red"))
        out.extend(Text(line) for line in rest)
    if len(log.incidents) > _MAX_INCIDENTS:
        out.append(Text(f"... {len(log.incidents) - _MAX_INCIDENTS} more in .incidents / --json"))
    return out


def wrap_dotted(name: str, width: int) -> str:
    """``name`` on lines of at most ``width`` characters, broken after dots where it can be
    (``encoder.layers.0.`` / ``self_attn.in_proj_weight``): whole, never elided.

    Example:
        >>> print(wrap_dotted("encoder.layers.0.self_attn.in_proj_weight", 24))
        encoder.layers.0.
        self_attn.in_proj_weight
    """
    if len(name) <= width or width < 1:
        return name
    parts = [p + "." for p in name.split(".")]
    parts[-1] = parts[-1][:-1]
    lines: list[str] = []
    line = ""
    for part in parts:
        while len(part) > width:  # one component longer than the column: cut it hard
            if line:
                lines.append(line)
                line = ""
            lines.append(part[:width])
            part = part[width:]
        if len(line) + len(part) > width:
            lines.append(line)
            line = ""
        line += part
    if line:
        lines.append(line)
    return "\n".join(lines)


class _ReportTable:
    """The per-parameter table, sized to the console it is printed on."""

    #: narrowest name column before the sparkline gives way (names fold beyond it)
    MIN_NAME = 24
    MIN_SPARK = 6

    def __init__(self, log: MonitorLog, width: int) -> None:
        self.log, self.width = log, width

    def rows(self) -> list[tuple[str, str, list[float], str, str, str, str]]:
        log = self.log
        statuses = _statuses(log)
        _mark_nonfinite(log, statuses)
        out: list[tuple[str, str, list[float], str, str, str, str]] = []
        for name in log.names:
            seen = [st.params[name] for st in log.steps if name in st.params]
            if not seen:
                out.append((clean_text(name), "-", [], "-", "0", "0", "no grad"))
                continue
            last = seen[-1]
            max_abs = next((s.max_abs for s in reversed(seen) if s.max_abs is not None), None)
            out.append((
                clean_text(name),  # what is shown, and measured for width
                f"{last.norm:.3g}",
                [s.norm for s in seen],
                "-" if max_abs is None else f"{max_abs:.3g}",
                _most([s.nan for s in seen]),
                _most([s.inf for s in seen]),
                statuses.get(name, "ok"),
            ))
        return out

    def __rich_console__(self, console: Any, options: Any) -> Any:
        rows = self.rows()
        heads = ("parameter", "norm", "history", "max abs", "nan", "inf", "status")
        fixed = sum(max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(heads)
                    if i not in (0, 2))
        longest = max([len(heads[0])] + [len(r[0]) for r in rows])
        overhead = 3 * len(heads) - 1  # padding of each column, a rule between two
        room = options.max_width - fixed - overhead
        spark = max(self.MIN_SPARK, min(self.width, room - min(longest, self.MIN_NAME)))
        steps = max((len(r[2]) for r in rows), default=0)
        drawn = max(len(heads[2]), min(spark, steps))  # what the history column will take
        name_width = max(len(heads[0]), min(longest, room - drawn))
        table = Table(title="gradient report", title_justify="left", show_edge=False)
        table.add_column(heads[0], no_wrap=True, width=name_width)
        for col, just in zip(heads[1:], ("right", "left", "right", "right", "right", "left")):
            table.add_column(col, justify=just, no_wrap=True)  # type: ignore[arg-type]
        for name, norm, norms, max_abs, nan, inf, status in rows:
            table.add_row(  # a str cell would be read as markup: the name is a Text
                Text(wrap_dotted(clean_text(name), name_width)), norm, sparkline(norms, spark),
                max_abs, nan, inf,
                Text(status, style="" if status == "ok" else "bold red"),
            )
        yield table


def summary(log: MonitorLog) -> str:
    """One line: logged steps, the latest total norm and its range, non-finite and skipped
    steps, the alerts by kind."""
    if not log.steps:
        return "no step logged yet: run a backward (or optimizer step) inside the monitor"
    totals = [st.total_norm for st in log.steps if not st.skipped]
    finite = [t for t in totals if math.isfinite(t)]
    span = f" (min {min(finite):.3g}, max {max(finite):.3g})" if finite else ""
    latest = f"{totals[-1]:.3g}" if totals else "-"
    counts: dict[str, int] = {}
    for a in log.alerts:
        counts[a.kind] = counts.get(a.kind, 0) + 1
    alerts = ", ".join(f"{k} {v}" for k, v in counts.items()) or "none"
    extra = ""
    bad = sum(1 for st in log.steps if not st.skipped and not math.isfinite(st.total_norm))
    if bad:
        extra += f"; {bad} with non-finite gradients"
    skipped = sum(1 for st in log.steps if st.skipped)
    if skipped:
        extra += f"; {skipped} skipped by the GradScaler"
    dropped = log.dropped
    if dropped.steps:
        extra += (
            f"; {dropped.steps} earlier logged steps not kept (steps {dropped.first_step}-"
            f"{dropped.last_step}"
            + (f", max total norm {dropped.max_total_norm:.3g}"
               if dropped.max_total_norm is not None else "")
            + (f", {dropped.nonfinite_steps} non-finite" if dropped.nonfinite_steps else "")
            + ")"
        )
    return (
        f"{len(log.steps)} logged steps (every {log.every}), total norm {latest}"
        f"{span}{extra}; alerts: {alerts}"
    )


def write_jsonl(log: MonitorLog, path: Path) -> Path:
    """One JSON object per logged step: step, total_norm, full, skipped, scope, measured_at,
    forward_nonfinite, params, modules, alerts (each with the names it concerns), and on the
    first step of an event its ``incident`` (``Incident.to_dict()``). The first line starts
    with the envelope (``{"gradscope": 2, "kind": "monitor", ...}``) and also carries
    ``"log"`` (names, element counts, thresholds...: what ``read_jsonl`` needs to read it back
    and replay the alert rules)."""
    lines = []
    for k, obj in enumerate(_step_records(log)):
        lines.append(dumps(first_record(obj, log) if k == 0 else obj, indent=None) + "\n")
    return write_atomic(path, "".join(lines))


def write_json(log: MonitorLog, path: Path) -> Path:
    """The same records as ``write_jsonl`` in ONE JSON document: the envelope
    (``{"gradscope": 2, "kind": "monitor"}``), ``"log"`` (what reading it back needs) and
    ``"steps"`` (one record per logged step). ``read_jsonl`` reads either form."""
    body = {"log": log_header(log), "steps": list(_step_records(log))}
    return write_atomic(path, dumps(envelope("monitor", body)) + "\n")


def _step_records(log: MonitorLog) -> Iterator[dict[str, Any]]:
    by_step: dict[int, list[Alert]] = {}
    for a in log.alerts:
        by_step.setdefault(a.step, []).append(a)
    incidents = {inc.step: inc for inc in log.incidents}
    for st in log.steps:
        yield step_record(st, by_step.get(st.step, []), incidents.get(st.step))


#: what starts a formula in a spreadsheet cell (=, +, -, @, and the tab and carriage return
#: some readers strip first)
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_text(name: str) -> str:
    """A name from the model as one CSV cell that a spreadsheet shows as text, never runs as a
    formula (``=cmd|' /C calc'!A0`` becomes ``'=cmd|' /C calc'!A0``), and that encodes as
    UTF-8 (a lone surrogate as its escape).

    Example:
        >>> csv_text("=1+2"), csv_text("encoder.0.weight")
        ("'=1+2", 'encoder.0.weight')
    """
    text = name.encode("utf-8", "backslashreplace").decode("utf-8")
    return "'" + text if text.startswith(_FORMULA_START) else text


def write_csv(log: MonitorLog, path: Path) -> Path:
    """Long format: one row per (step, parameter), with the step's total norm on each row (an
    empty cell: not measured at that step). Parameter names are written as text
    (``csv_text``)."""

    def write(f: Any) -> None:
        w = csv.writer(f)
        w.writerow(["step", "param", *_FIELDS, "total_norm"])
        for st in log.steps:
            for name, ps in st.params.items():
                row = ["" if v is None else v for v in (getattr(ps, x) for x in _FIELDS)]
                w.writerow([st.step, csv_text(name), *row, st.total_norm])

    return write_with(path, write)


def write_tensorboard(log: MonitorLog, writer: Any) -> None:
    """Scalars per step and a histogram of the per-parameter norms per step."""
    import numpy as np

    for st in log.steps:
        writer.add_scalar("grad_norm/total", st.total_norm, st.step)
        for name, ps in st.params.items():
            writer.add_scalar(f"grad_norm/{name}", ps.norm, st.step)
            if ps.nan is not None and ps.inf is not None:
                writer.add_scalar(f"grad_nonfinite/{name}", ps.nan + ps.inf, st.step)
            if ps.update_ratio is not None:
                writer.add_scalar(f"update_ratio/{name}", ps.update_ratio, st.step)
        norms = np.array([ps.norm for ps in st.params.values() if math.isfinite(ps.norm)])
        if norms.size:  # histograms cannot hold NaN/Inf; those are in grad_nonfinite/*
            writer.add_histogram("grad_norm/per_parameter", norms, st.step)


def plot_series(log: MonitorLog) -> dict[str, list[Any]]:
    """What ``plot_png`` draws in its total-norm and loss panels: the steps with a finite
    positive total norm and their values, the steps whose total norm is not finite, the
    skipped steps; the spike baseline of each signal (``baseline_steps``, ``baseline``: the
    median of its last ``Thresholds.spike_window`` logged values, first ``spike_warmup``
    ignored, once ``SPIKE_MIN_VALUES`` are in; ``limit``: baseline x ``Thresholds.spike``,
    above which a value is a spike), the same for the loss (``loss_*``, when the monitor was
    given the loss), and ``spikes``: one ``(step, signal, ratio)`` per spike incident. With
    ``Thresholds.spike`` None (detection off) the bands are empty."""
    ok = [st for st in log.steps if not st.skipped and _plottable(st.total_norm) == st.total_norm]
    out: dict[str, list[Any]] = {
        "steps": [st.step for st in ok],
        "total": [st.total_norm for st in ok],
        "nonfinite": [
            st.step for st in log.steps if not st.skipped and not math.isfinite(st.total_norm)
        ],
        "skipped": [st.step for st in log.steps if st.skipped],
    }
    losses = [(st.step, st.loss) for st in log.steps
              if not st.skipped and st.loss is not None and math.isfinite(st.loss)]
    out["loss_steps"] = [s for s, _ in losses]
    out["loss"] = [v for _, v in losses]
    for prefix, signal in (("", "grad_norm"), ("loss_", "loss")):
        factor = log.thresholds.spike
        band = [] if factor is None else _baseline(log, signal)
        out[f"{prefix}baseline_steps"] = [s for s, _ in band]
        out[f"{prefix}baseline"] = [m for _, m in band]
        out[f"{prefix}limit"] = [m * factor for _, m in band] if factor is not None else []
    out["spikes"] = [(inc.step, inc.signal, inc.ratio) for inc in log.incidents
                     if inc.kind == "spike"]
    return out


def _baseline(log: MonitorLog, signal: str) -> list[tuple[int, float]]:
    """(step, median its value is compared with) for each logged step that has one, by the
    rule of ``gradscope.monitor.spikes`` (from the steps the history still holds)."""
    th = log.thresholds
    window: deque[float] = deque(maxlen=th.spike_window)
    seen = 0
    out = []
    for st in log.steps:
        if st.skipped or not math.isfinite(st.total_norm):
            continue
        value = spike_signals(st).get(signal)
        if value is None:
            continue
        if seen < th.spike_warmup:
            seen += 1
            continue
        if len(window) >= SPIKE_MIN_VALUES:
            out.append((st.step, statistics.median(window)))
        window.append(value)
    return out


def plot_png(log: MonitorLog, path: Path) -> Path:
    """Each parameter's gradient norm over the steps above (the largest ones coloured and
    named in the legend, the others thin and grey), and below the total norm over steps and
    (when the monitor was given it) the loss, each with its spike band (the running median and
    the median x ``Thresholds.spike``, clipped to the data's range: it never stretches the
    axis) and each spike incident marked; steps with non-finite gradients are red marks along
    the top of the total-norm panel (skipped steps grey), so the panel covers every logged
    step. Every label is horizontal and at least 9 points."""
    plt = pyplot("GradMonitor.plot")
    names = [n for n in log.names if any(n in st.params for st in log.steps)]
    series = plot_series(log)
    has_loss = bool(series["loss"])
    with plt.rc_context({"font.size": 10, "axes.titlesize": 11, "legend.fontsize": 9,
                         "xtick.labelsize": 9, "ytick.labelsize": 9}):
        fig = plt.figure(figsize=(12, 8.5))
        grid = fig.add_gridspec(2, 2 if has_loss else 1, height_ratios=[1.2, 1])
        ax_history = fig.add_subplot(grid[0, :])
        ax_total = fig.add_subplot(grid[1, 0], sharex=ax_history)
        try:
            _history(ax_history, log, names)
            _total_panel(ax_total, log, series)
            if has_loss:
                ax_loss = fig.add_subplot(grid[1, 1], sharex=ax_total)
                _spike_panel(ax_loss, series, "loss_", series["loss_steps"], series["loss"],
                             "loss", "loss", log.thresholds.spike)
                ax_loss.legend(loc="best")
        except BaseException:
            plt.close(fig)
            raise
        save_png(fig, path)
    return path


#: The parameters named (and coloured) in the history panel: the largest peak norms.
_NAMED = 8


def _history(ax: Any, log: MonitorLog, names: list[str]) -> None:
    """One line per parameter: its gradient norm at each logged step (log scale); NaN/Inf
    norms are gaps, marked in red at the top."""
    lines = {}
    for n in names:
        points = [(st.step, st.params[n].norm) for st in log.steps
                  if n in st.params and not st.skipped]
        lines[n] = points
    peak = {n: max((_plottable_key(v) for _, v in pts), default=-1.0) for n, pts in lines.items()}
    named = sorted(names, key=lambda n: -peak[n])[:_NAMED]
    others = [n for n in names if n not in named]
    for i, n in enumerate(others):
        xs, ys = zip(*lines[n], strict=True) if lines[n] else ((), ())
        ax.plot(xs, [_plottable(v) for v in ys], color="0.75", linewidth=0.8, zorder=1,
                label=f"{len(others)} other parameters" if i == 0 else None)
    colors = plt_colors()
    for i, n in enumerate(named):
        xs, ys = zip(*lines[n], strict=True) if lines[n] else ((), ())
        ax.plot(xs, [_plottable(v) for v in ys], color=colors[i % len(colors)], linewidth=1.6,
                marker="." if len(xs) <= 60 else None, label=_short(n), zorder=2)
    bad = sorted({s for pts in lines.values() for s, v in pts if not math.isfinite(v)})
    if bad:
        top = ax.get_xaxis_transform()
        ax.scatter(bad, [0.97] * len(bad), transform=top, color="red", marker="x",
                   label="NaN/Inf gradient", zorder=3, clip_on=False)
    ax.set(title="gradient norm per parameter" + (
        f" (the {len(named)} largest named)" if others else ""), ylabel="gradient norm")
    if any(_plottable(v) == v for pts in lines.values() for _, v in pts):
        ax.set_yscale("log")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    ax.grid(True, which="major", alpha=0.3)


def plt_colors() -> list[str]:
    """Eight colours told apart in print and by most colour-blind readers (tab10, no grey)."""
    return ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown",
            "tab:pink", "tab:olive"]


def _short(name: str, limit: int = 40) -> str:
    """A legend entry: a long parameter path keeps its end (``…layers.11.mlp.c_fc.weight``)."""
    return name if len(name) <= limit else "…" + name[-(limit - 1):]


def _total_panel(ax: Any, log: MonitorLog, series: dict[str, list[Any]]) -> None:
    _spike_panel(ax, series, "", series["steps"], series["total"], "grad_norm",
                 "total gradient norm", log.thresholds.spike)
    top = ax.get_xaxis_transform()  # x in data, y in axes fraction
    if series["nonfinite"]:
        ax.scatter(series["nonfinite"], [0.97] * len(series["nonfinite"]), transform=top,
                   color="red", marker="x", label="NaN/Inf", zorder=3, clip_on=False)
    if series["skipped"]:
        ax.scatter(series["skipped"], [0.92] * len(series["skipped"]), transform=top,
                   color="gray", marker="|", label="skipped (GradScaler)", zorder=3)
    steps = [st.step for st in log.steps]
    if steps:
        ax.set_xlim(min(steps) - 0.5, max(steps) + 0.5)
    ax.legend(loc="best")


def _spike_panel(ax: Any, series: dict[str, list[Any]], prefix: str, xs: list[int],
                 ys: list[float], signal: str, title: str, factor: float | None) -> None:
    """One signal over steps: the line, the band [median, median x spike], the spikes. The
    axis is the data's (with a margin): the band is drawn inside it, clipped, so a 10x limit
    never squeezes the line into the bottom of the panel."""
    ax.plot(xs, ys, marker="." if len(xs) <= 200 else None, color="steelblue", label=title,
            zorder=2)
    # a log axis when the values span a decade or more; within one, its labels read badly
    log_scale = bool(ys) and min(ys) > 0 and max(ys) >= 10 * min(ys)
    if log_scale:
        ax.set_yscale("log")
    value = dict(zip(xs, ys, strict=True))
    marks = [(s, r, sig) for s, sig, r in series["spikes"] if s in value]
    if marks:
        ax.scatter([s for s, _, _ in marks], [value[s] for s, _, _ in marks], s=90,
                   facecolors="none", edgecolors="red", linewidths=1.5, zorder=3,
                   label="spike")
        for s, r, sig in marks:
            if sig == signal:
                ax.annotate(f"step {s}: x{r:.3g}", (s, value[s]), textcoords="offset points",
                            xytext=(6, 4), fontsize=9, color="red")
    if ys:
        ax.set_ylim(*_data_limits(ys, log_scale))
    band_x = series[f"{prefix}baseline_steps"]
    if band_x:  # after the limits are fixed: the band does not take part in autoscaling
        ax.autoscale(False)
        ax.fill_between(band_x, series[f"{prefix}baseline"], series[f"{prefix}limit"],
                        step="mid", color="tab:green", alpha=0.15,
                        label=f"running median .. {factor:g}x it (a spike above)")
        ax.plot(band_x, series[f"{prefix}limit"], color="tab:green", linewidth=0.8,
                drawstyle="steps-mid")
    ax.set(title=title, xlabel="step")


def _data_limits(ys: list[float], log_scale: bool) -> tuple[float, float]:
    """The y range of the data with a margin (a factor on a log axis), never empty."""
    lo, hi = min(ys), max(ys)
    if log_scale:
        if hi <= lo:
            return lo / 2, hi * 2
        pad = (hi / lo) ** 0.08
        return lo / pad, hi * pad
    if hi <= lo:
        return lo - 1, hi + 1
    pad = 0.08 * (hi - lo)
    return lo - pad, hi + pad


def _plottable(v: float) -> float:
    return v if math.isfinite(v) and v > 0 else float("nan")


def _plottable_key(v: float) -> float:
    return v if math.isfinite(v) else -1.0


register_renderer("monitor_report", render_report)
register_renderer("monitor_jsonl", write_jsonl)
register_renderer("monitor_json", write_json)
register_renderer("monitor_csv", write_csv)
register_renderer("monitor_tensorboard", write_tensorboard)
register_renderer("monitor_plot", plot_png)
