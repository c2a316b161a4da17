"""Rich renderings of memory records: a ``MemoryReport`` (summary, bytes per module or node,
CUDA figures) and the leak detector's findings."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..graph.graph import format_bytes
from ..graph.nodes import plural
from ..output.formats import register_renderer
from ..output.style import cell
from .saved_records import (
    Leak,
    LeakStep,
    MemoryReport,
    Split,
)


def render_memory(report: MemoryReport, *, depth: int | None = None, top: int = 20) -> Group:
    """A rich renderable: the summary, bytes per module (or per node), CUDA figures.

    Rows are ranked by activation bytes (what only the graph holds; ``share`` is of all
    activations); bytes of storages that alias parameters/inputs (and outputs, when there are
    any) have their own columns, so a layer's weight does not pass for its activations.

    Args:
        report: what ``Graph.memory()`` or ``saved_memory`` measured.
        depth: cut module paths to this many components.
        top: show at most this many rows.
    """
    parts: list[Any] = [cell(report.summary())]
    rows = _rows(report, depth)
    if rows:
        title = "module" if report.by_module and set(report.by_module) != {None} else "node"
        outputs = any(sp.output for _, sp in rows)
        table = Table(title=None, box=None, pad_edge=False, show_edge=False)
        table.add_column(cell(title))
        table.add_column("activations", justify="right")
        table.add_column("share", justify="right")
        table.add_column("params/inputs", justify="right")
        if outputs:
            table.add_column("outputs", justify="right")
        total = report.activation_bytes

        def cells(sp: Split) -> list[Text]:
            share = f"{100.0 * sp.activation / total:.1f}%" if total else "-"
            out = [format_bytes(sp.activation), share, _bytes_or_dash(sp.leaf)]
            return [cell(c) for c in (out + [_bytes_or_dash(sp.output)] if outputs else out)]

        for label, sp in rows[:top]:
            table.add_row(cell(label), *cells(sp))
        if len(rows) > top:
            rest = Split(*(sum(col) for col in zip(*(sp for _, sp in rows[top:]))))
            table.add_row(cell(f"… {len(rows) - top} more"), *cells(rest))
        parts.append(table)
    for snap in report.cuda:
        parts.append(
            cell(
                f"{snap.device} {snap.phase}: allocated {format_bytes(snap.allocated)}, "
                f"reserved {format_bytes(snap.reserved)}, "
                f"max allocated {format_bytes(snap.max_allocated)}"
            )
        )
    return Group(*parts)


def _bytes_or_dash(n: int) -> str:
    return format_bytes(n) if n else "-"


def _rows(report: MemoryReport, depth: int | None) -> list[tuple[str, Split]]:
    """(label, split) per module (or node), ranked by activation bytes, then alias bytes."""
    if report.by_module and set(report.by_module) != {None}:
        items = report.module_split(depth).items()
        rows = [("(outside modules)" if k is None else (k or "(root)"), sp) for k, sp in items]
    else:
        names = report.node_names
        rows = [(f"{nid} {names.get(nid, '')}".rstrip(), sp)
                for nid, sp in report.node_split().items()]
    return sorted((r for r in rows if r[1].total),
                  key=lambda r: (-r[1].activation, -r[1].leaf - r[1].output))




def render_leaks(history: list[LeakStep], leaks: list[Leak]) -> Text:
    """One line per step whose graph leaked, or a clean bill (``LeakCheck.report``)."""
    if not leaks:
        return cell(f"no autograd graph outlived its step ({plural(len(history), 'step')} checked)")
    text = Text()
    last = history[-1]
    text.append(
        f"{len(leaks)} earlier graphs still alive; at step {last.step} they hold "
        f"{format_bytes(last.held_bytes)} of saved tensors\n",
        "bold red",
    )
    for leak in leaks:
        text.append(f"  step {leak.step}: {format_bytes(leak.saved_bytes)} "
                    f"({leak.saved_tensors} saved tensors), seen at step {leak.seen_at}\n")
    return text


register_renderer("memory", render_memory)
register_renderer("leaks", render_leaks)
