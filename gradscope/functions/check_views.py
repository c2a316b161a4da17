"""The rich rendering of a ``CheckResult``: verdict, notes, the worst mismatch per block, and
small Jacobians (numerical and analytical) side by side, mismatches starred."""

from __future__ import annotations

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ..output.formats import register_renderer
from ..output.style import cell
from .check_records import CheckResult, JacobianBlock

#: Jacobians are drawn only up to this many rows and columns.
_DRAW = 12


class _TableOrLines:
    """The table when the console is wide enough for it, else the same facts one failure per
    paragraph (wrapped at spaces): a number is never cut to ``-2…``."""

    def __init__(self, table: Table, lines: list[Text]) -> None:
        self.table, self.lines = table, lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        wide = options.update_width(10_000)
        if Measurement.get(console, wide, self.table).maximum <= options.max_width:
            yield self.table
        else:
            yield cell(str(self.table.title or ""))
            yield from self.lines


def _failures(result: CheckResult) -> _TableOrLines:
    lines = [
        cell(f"order {f.order}, input {f.input_index}, output {f.output_index}, "
             f"{result.where(f)}: numerical {f.numerical:.6g}, analytical {f.analytical:.6g}, "
             f"|diff| {f.diff:.3g}")
        for f in result.failures
    ]
    return _TableOrLines(_failure_table(result), lines)


def _failure_table(result: CheckResult) -> Table:
    """One row per failing block. Numbers and element indices are never cut: the columns do
    not wrap, and the light box keeps a row within 80 columns for the usual indices (a
    narrower console gets ``_failures``' lines instead)."""
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


def _cells(values: list[list[float]], bad: set[tuple[int, int]],
           worst: tuple[int, int] | None) -> list[list[Text]]:
    rows = []
    for r, row in enumerate(values):
        cells = []
        for c, v in enumerate(row):
            if (r, c) in bad:  # the '*' keeps mismatches visible without colour
                style = "bold reverse red" if (r, c) == worst else "bold red"
                cells.append(cell(f"{v:.3g}*", style))
            else:
                cells.append(cell(f"{v:.3g}"))
        rows.append(cells)
    return rows


def _table(title: str, rows: list[list[Text]], columns: range) -> Table:
    table = Table(title=cell(title) if title else None, show_header=True, header_style="dim",
                  box=None, pad_edge=False, padding=(0, 0, 0, 1), title_justify="left")
    table.add_column("in\\out", style="dim", justify="right", no_wrap=True)
    for c in columns:
        table.add_column(cell(c), justify="right", no_wrap=True)
    for r, row in enumerate(rows):
        cells = [row[c] for c in columns]  # Text made by cell() in _cells
        table.add_row(cell(r), *cells)
    return table


class _Matrix:
    """A Jacobian as a table of numbers, never cut: when it is wider than the console its
    columns are drawn in slices that fit (``numerical, columns 0-5``, then ``6-11``), each
    number whole with its ``*``."""

    def __init__(self, values: list[list[float]], bad: set[tuple[int, int]],
                 worst: tuple[int, int] | None, title: str) -> None:
        self.title = title
        self.rows = _cells(values, bad, worst)
        self.ncols = len(values[0]) if values else 0

    def _width(self, console: Console, options: ConsoleOptions, columns: range) -> int:
        return Measurement.get(console, options.update_width(10_000),
                               _table(self.title, self.rows, columns)).maximum

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        width = self._width(console, options, range(self.ncols))
        return Measurement(min(width, options.max_width), width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        if self._width(console, options, range(self.ncols)) <= width:
            yield _table(self.title, self.rows, range(self.ncols))
            return
        start = 0
        while start < self.ncols:
            stop = start + 1  # at least one column per slice, however narrow the console
            while stop < self.ncols and self._width(console, options,
                                                    range(start, stop + 1)) <= width:
                stop += 1
            title = f"{self.title}, columns {start}-{stop - 1}" if stop - start > 1 else (
                f"{self.title}, column {start}")
            yield cell(title)  # a line of its own: a table's title wraps to the table's width
            yield _table("", self.rows, range(start, stop))
            start = stop


class _SideBySide:
    """Two tables side by side when the console is wide enough, else one above the other."""

    def __init__(self, left: _Matrix, right: _Matrix) -> None:
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
        _Matrix(block.numerical, bad, at, "numerical"),
        _Matrix(block.analytical, bad, at, "analytical"),
    )
    legend = " (* marks entries outside atol + rtol*|numerical|)" if bad else ""
    return Group(cell(head + legend, "bold red" if bad else "bold green"), body)


def _render(result: CheckResult) -> RenderableType:
    mark = Text("PASS ", style="bold green") if result.ok else Text("FAIL ", style="bold red")
    parts: list[RenderableType] = [mark + cell(result.summary())]
    for note in result.notes:
        parts.append(cell(f"note: {note}", "yellow"))
    if result.failures:
        parts.append(_failures(result))
    shown = [b for b in result.jacobians if b.mismatches] or (
        result.jacobians if result.ok else []
    )
    for block in shown[:6]:
        parts.append(_block_view(block))
    if len(shown) > 6:
        parts.append(cell(f"... {len(shown) - 6} more Jacobian blocks not shown"))
    return Group(*parts)


register_renderer("check", _render)
