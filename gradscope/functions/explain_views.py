"""Drawings of an ``Explanation``: a rich table with the index -> storage picture from the
course (every index of the view mapped to its element of the storage), and the same picture as
SVG text written here directly, so no Graphviz is needed."""

from __future__ import annotations

from html import escape

from rich.console import Group, RenderableType
from rich.table import Table

from ..output.formats import register_renderer
from ..output.style import cell
from .explain_records import Explanation

#: the picture is drawn up to this many view elements and storage elements
_DRAW = 64
_DRAW_STORAGE = 128


def render_explanation(e: Explanation) -> RenderableType:
    """The metadata table and the index -> storage picture."""
    return Group(_facts_table(e), *_picture(e))


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _facts_table(e: Explanation) -> Table:
    table = Table(title="tensor internals", title_justify="left", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    rows = [
        ("shape", str(list(e.shape))),
        ("stride", str(e.stride)),
        ("storage_offset", str(e.storage_offset)),
        ("is_contiguous", str(e.is_contiguous)),
        ("dtype / device", f"{e.dtype} / {e.device}"),
        ("storage", f"{e.storage_numel} x {e.dtype} = {e.storage_nbytes} bytes at {e.data_ptr:#x}"),
        ("version counter", str(e.version)),
        ("is_leaf / requires_grad", f"{e.is_leaf} / {e.requires_grad}"),
        ("grad_fn", str(e.grad_fn)),
        ("is_view", str(e.is_view)),
    ]
    for i, desc in enumerate(e.others):
        same = "shares this storage" if i in e.shares_storage_with else "own storage"
        rows.append((f"other {i}", f"{desc}: {same}"))
    for key, value in rows:
        table.add_row(cell(key), cell(value))
    return table


def _index_label(idx: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, idx)) + "]"


def _picture(e: Explanation) -> list[RenderableType]:
    if e.mapping is None or len(e.mapping) > _DRAW or e.storage_numel > _DRAW_STORAGE:
        return [cell(
            f"index -> storage picture not drawn: {len(e.mapping or []) or 'over 4096'} view "
            f"elements over a storage of {e.storage_numel} (drawn up to {_DRAW} / {_DRAW_STORAGE})",
            style="dim",
        )]
    return [
        cell(f"view {list(e.shape)}: each cell shows the storage position it reads", "bold"),
        _view_grid(e),
        cell(f"storage: {e.storage_numel} x {e.dtype}, one-dimensional", "bold"),
        _storage_strip(e),
    ]


def _view_grid(e: Explanation) -> Table:
    """The view's elements in their logical layout, each showing its storage position."""
    assert e.mapping is not None
    if len(e.shape) == 2:
        rows, cols = e.shape
        table = Table(show_header=True, header_style="dim")
        table.add_column("", style="dim")
        for c in range(cols):
            table.add_column(cell(c), justify="right")
        for r in range(rows):
            cells = [cell(pos) for _, pos in e.mapping[r * cols:(r + 1) * cols]]
            table.add_row(cell(r), *cells)
        return table
    table = Table()
    table.add_column("index")
    table.add_column("storage position", justify="right")
    for idx, pos in e.mapping:
        table.add_row(cell(_index_label(idx)), cell(pos))
    return table


def _storage_strip(e: Explanation) -> Table:
    """The one-dimensional storage, each element labelled with the view index that reads it:
    a row like the course's picture when short, one line per element when long."""
    assert e.mapping is not None
    users: dict[int, str] = {}
    for idx, pos in e.mapping:
        users[pos] = users[pos] + " " + _index_label(idx) if pos in users else _index_label(idx)
    values = e.storage_values
    if e.storage_numel <= 16:
        table = Table(show_header=True, header_style="dim")
        table.add_column("position", style="dim")
        for pos in range(e.storage_numel):
            table.add_column(cell(pos), justify="right", style="" if pos in users else "dim")
        if values is not None:
            table.add_row("value", *(cell(_fmt(v)) for v in values))
        table.add_row("view index", *(cell(users.get(p, "-")) for p in range(e.storage_numel)))
        return table
    table = Table()
    table.add_column("position", justify="right")
    if values is not None:
        table.add_column("value", justify="right")
    table.add_column("view index")
    for pos in range(e.storage_numel):
        cells = [cell(pos)] + ([cell(_fmt(values[pos]))] if values is not None else [])
        table.add_row(*cells, cell(users.get(pos, "-")), style="" if pos in users else "dim")
    return table


# ---------------------------------------------------------------------------------- SVG
_BOX = 44
_GAP = 6


def _svg(e: Explanation) -> str:
    lines = [
        f"shape {list(e.shape)}  stride {e.stride}  offset {e.storage_offset}  "
        f"contiguous {e.is_contiguous}",
        f"storage: {e.storage_numel} x {e.dtype} ({e.storage_nbytes} bytes)  version {e.version}"
        f"  grad_fn {e.grad_fn}",
    ]
    drawable = not (e.mapping is None or len(e.mapping) > _DRAW or e.storage_numel > _DRAW_STORAGE)
    n_store = e.storage_numel if drawable else 0
    width = max(640, 20 + n_store * (_BOX + _GAP))
    parts: list[str] = []
    y = 24
    for line in lines:
        parts.append(_text(16, y, line, 14))
        y += 20
    if not drawable:
        parts.append(_text(16, y + 10, "picture not drawn: tensor or storage too large", 12))
        return _wrap(width, y + 30, parts)
    store_y = y + 30
    what = "positions" if e.storage_values is None else "values; positions below"
    parts.append(_text(16, store_y - 8, f"storage, one-dimensional ({what})", 12))
    used = {pos for _, pos in e.mapping or []}
    centers: dict[int, float] = {}
    for pos in range(e.storage_numel):
        x = 16 + pos * (_BOX + _GAP)
        centers[pos] = x + _BOX / 2
        fill = "#add8e6" if pos in used else "#eeeeee"
        label = str(pos) if e.storage_values is None else _fmt(e.storage_values[pos])
        parts.append(_rect(x, store_y, fill))
        parts.append(_text(x + _BOX / 2, store_y + 27, label, 11, anchor="middle"))
        parts.append(_text(x + _BOX / 2, store_y + _BOX + 14, str(pos), 10, anchor="middle"))
    view_y = store_y + _BOX + 80
    parts.append(_text(16, view_y - 8, f"view {list(e.shape)}: index -> storage position", 12))
    cols = e.shape[-1] if len(e.shape) >= 1 and e.shape[-1] > 0 else 1
    bottom = view_y
    cells: list[str] = []  # drawn after every line, so no line crosses a cell
    for k, (idx, pos) in enumerate(e.mapping or []):
        r, c = divmod(k, cols)
        x, yy = 16 + c * (_BOX + _GAP), view_y + r * (_BOX + _GAP)
        parts.append(
            f'<line x1="{x + _BOX / 2:.1f}" y1="{yy}" x2="{centers[pos]:.1f}" '
            f'y2="{store_y + _BOX + 18}" stroke="#7799bb" stroke-opacity="0.5"/>'
        )
        cells.append(_rect(x, yy, "#ffffff"))
        cells.append(_text(x + _BOX / 2, yy + 18, _index_label(idx), 10, anchor="middle"))
        cells.append(_text(x + _BOX / 2, yy + 34, f"-> {pos}", 10, anchor="middle"))
        bottom = max(bottom, yy + _BOX)
    parts.extend(cells)
    return _wrap(max(width, 16 + cols * (_BOX + _GAP) + 16), bottom + 20, parts)


def _rect(x: float, y: float, fill: str) -> str:
    return (f'<rect x="{x}" y="{y}" width="{_BOX}" height="{_BOX}" fill="{fill}" '
            'stroke="#333333"/>')


def _text(x: float, y: float, s: str, size: int, anchor: str = "start") -> str:
    return (f'<text x="{x}" y="{y}" font-family="monospace" font-size="{size}" '
            f'text-anchor="{anchor}">{escape(s)}</text>')


def _wrap(width: float, height: float, parts: list[str]) -> str:
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}">')
    background = '<rect width="100%" height="100%" fill="white"/>'
    return "\n".join([head, background, *parts, "</svg>"]) + "\n"


register_renderer("explain", render_explanation)
register_renderer("explain_svg", _svg)
