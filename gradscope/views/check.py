"""The rich rendering of a ``CheckResult``: verdict, notes, the worst mismatch per block, and
small Jacobians (numerical and analytical) side by side, mismatches starred."""

from __future__ import annotations

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ..model.check import CheckResult, JacobianBlock
from ..model.formats import register_renderer
from .style import cell

#: Jacobians are drawn only up to this many rows and columns.
_DRAW = 12


def _failure_table(result: CheckResult) -> Table:
    """One row per failing block. Numbers and element indices are never cut: the columns do
    not wrap, and the light box keeps a row within 80 columns for the usual indices."""
    table = Table(title="worst mismatch per input/output pair", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("order", justify="right", no_wrap=True)
    table.add_column("in", justify="right", no_wrap=True)
    table.add_column("out", justify="right", no_wrap=True)
    table.add_column("element (in / out)", no_wrap=True, overflow="fold")
    for name in ("numerical", "analytical", "|diff|"):
        table.add_column(cell(name), justify="right", no_wrap=True)
    for f in result.failures:
        table.add_row(
            cell(f.order), cell(f.input_index), cell(f.output_index), cell(result.where(f)),
            cell(f"{f.numerical:.6g}"), cell(f"{f.analytical:.6g}"),
            cell(f"{f.diff:.3g}", "bold red"),
        )
    return table


def _matrix(values: list[list[float]], bad: set[tuple[int, int]], worst: tuple[int, int] | None,
            title: str) -> Table:
    ncols = len(values[0]) if values else 0
    table = Table(title=cell(title), show_header=True, header_style="dim", box=None, pad_edge=False,
                  padding=(0, 0, 0, 1), title_justify="left")
    table.add_column("in\\out", style="dim", justify="right")
    for c in range(ncols):
        table.add_column(cell(c), justify="right")
    for r, row in enumerate(values):
        cells = [cell(r)]
        for c, v in enumerate(row):
            if (r, c) in bad:  # the '*' keeps mismatches visible without colour
                style = "bold reverse red" if (r, c) == worst else "bold red"
                cells.append(cell(f"{v:.3g}*", style))
            else:
                cells.append(cell(f"{v:.3g}"))
        table.add_row(*cells)
    return table


class _SideBySide:
    """Two tables side by side when the console is wide enough, else one above the other."""

    def __init__(self, left: Table, right: Table) -> None:
        self.left, self.right = left, right

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        widths = [Measurement.get(console, options, t).maximum for t in (self.left, self.right)]
        if sum(widths) + 4 <= options.max_width:
            grid = Table.grid(padding=(0, 4))
            tables = (self.left, self.right)  # renderables, not text
            grid.add_row(*tables)
            yield grid
        else:
            yield self.left
            yield self.right


def _block_view(block: JacobianBlock) -> RenderableType:
    rows, cols = len(block.numerical), len(block.numerical[0]) if block.numerical else 0
    head = (f"order {block.order}: d output {block.output_index} / d input {block.input_index} "
            f"({rows}x{cols}; rows: input elements, columns: output elements)")
    worst = block.worst()
    if rows > _DRAW or cols > _DRAW:
        text = f"{head}: too large to draw"
        if worst is not None:
            text += (f"; worst entry {block.element(worst.index)}: {worst.numerical:.6g} vs "
                     f"{worst.analytical:.6g}")
        return cell(text)
    bad = set(block.mismatches)
    at = worst.index if worst else None
    body = _SideBySide(
        _matrix(block.numerical, bad, at, "numerical"),
        _matrix(block.analytical, bad, at, "analytical"),
    )
    legend = " (* marks entries outside atol + rtol*|numerical|)" if bad else ""
    return Group(cell(head + legend, "bold red" if bad else "bold green"), body)


def _render(result: CheckResult) -> RenderableType:
    mark = Text("PASS ", style="bold green") if result.ok else Text("FAIL ", style="bold red")
    parts: list[RenderableType] = [mark + cell(result.summary())]
    for note in result.notes:
        parts.append(cell(f"note: {note}", "yellow"))
    if result.failures:
        parts.append(_failure_table(result))
    shown = [b for b in result.jacobians if b.mismatches] or (
        result.jacobians if result.ok else []
    )
    for block in shown[:6]:
        parts.append(_block_view(block))
    if len(shown) > 6:
        parts.append(cell(f"... {len(shown) - 6} more Jacobian blocks not shown"))
    return Group(*parts)


register_renderer("check", _render)
