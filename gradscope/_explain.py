"""``gs.explain``: what a tensor is made of -- a one-dimensional storage seen through a shape,
strides and an offset -- with the picture from the course: every index of the view mapped to
its element of the storage (a 3x4 tensor and its transpose share one storage of 12 floats).

The result is plain data (no reference to the tensor is kept); it renders as a rich table and
saves as SVG text written here directly, so no Graphviz is needed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

import torch
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ._errors import FormatError, GradscopeError

#: the mapping is computed up to this many view elements, and drawn up to ``_DRAW``
_MAX_MAP = 4096
_DRAW = 64
_DRAW_STORAGE = 128


class ExplainInputError(GradscopeError):
    """gs.explain was given something that is not a strided tensor with a storage."""


@dataclass
class Explanation:
    """A tensor's metadata, its storage, and where each of its elements lives in that storage.

    Attributes:
        shape: ``tuple(t.shape)``.
        stride: ``t.stride()``, in elements of the storage.
        storage_offset: ``t.storage_offset()``, the storage position of element ``[0, ..., 0]``.
        is_contiguous: ``t.is_contiguous()``.
        dtype: e.g. ``float32``.
        device: e.g. ``cpu``.
        element_size: bytes per element.
        storage_nbytes: bytes of the whole storage (``untyped_storage().nbytes()``).
        storage_numel: elements of ``dtype`` the storage holds.
        data_ptr: ``untyped_storage().data_ptr()``: equal for tensors sharing a storage.
        shares_storage_with: indices into ``others`` of the tensors on the same storage.
        others: a short description of each of ``others``.
        version: the version counter (``t._version``), bumped by every in-place change.
        is_leaf, requires_grad: as on the tensor.
        grad_fn: the class name of ``t.grad_fn`` (e.g. ``TransposeBackward0``) or None.
        is_view: whether autograd tracks the tensor as a view of another (``t._is_view()``).
        mapping: ``(index, storage_position)`` for every element in row-major order, or None
            when the tensor has more than 4096 elements.
        storage_values: the storage's values (as floats) when it is small enough to draw.
    """

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    is_contiguous: bool
    dtype: str
    device: str
    element_size: int
    storage_nbytes: int
    storage_numel: int
    data_ptr: int
    version: int
    is_leaf: bool
    requires_grad: bool
    grad_fn: str | None
    is_view: bool
    shares_storage_with: list[int] = field(default_factory=list)
    others: list[str] = field(default_factory=list)
    mapping: list[tuple[tuple[int, ...], int]] | None = None
    storage_values: list[float] | None = None

    # ------------------------------------------------------------------ rendering
    def render(self) -> RenderableType:
        """A rich renderable: the metadata table and the index -> storage picture."""
        return Group(_facts_table(self), *_picture(self))

    def __rich__(self) -> RenderableType:
        return self.render()

    def to_svg(self) -> str:
        """The index -> storage picture, with the metadata, as SVG text."""
        return _svg(self)

    def save(self, path: str | Path) -> Path:
        """Write the picture as SVG to ``path`` (which must end in ``.svg``)."""
        path = Path(path)
        if path.suffix.lower() != ".svg":
            raise FormatError(
                f"explain pictures are saved as SVG, got {path.name!r}; use a path ending in .svg"
            )
        path.write_text(self.to_svg(), encoding="utf-8")
        return path


# ---------------------------------------------------------------------------------- capture
def _storage_ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _describe(t: Any) -> str:
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    return f"tensor{list(t.shape)} stride {tuple(t.stride())} offset {t.storage_offset()}"


def _mapping(t: torch.Tensor) -> list[tuple[tuple[int, ...], int]] | None:
    if t.numel() > _MAX_MAP:
        return None
    offset, stride = int(t.storage_offset()), [int(s) for s in t.stride()]
    return [
        (idx, offset + sum(i * s for i, s in zip(idx, stride, strict=True)))
        for idx in itertools.product(*(range(n) for n in t.shape))
    ]


def _storage_values(t: torch.Tensor, numel: int) -> list[float] | None:
    if numel > _DRAW_STORAGE or t.device.type == "meta":
        return None
    # a fresh tensor over the whole storage (no autograd history, the caller's tensor untouched)
    flat = torch.empty(0, dtype=t.dtype, device=t.device)
    flat.set_(t.untyped_storage(), 0, (numel,), (1,))
    try:
        return [float(v) for v in flat.detach().cpu().tolist()]
    except (TypeError, RuntimeError):
        return None


def explain(tensor: torch.Tensor, *others: torch.Tensor) -> Explanation:
    """Explain a tensor's layout: shape, strides, offset, storage, and which others share it.

    Args:
        tensor: a strided tensor (a view, a transpose, a slice, a copy...).
        *others: tensors to compare storages with (e.g. the base a view came from).

    Returns:
        An ``Explanation``: print it with rich to see the table and the index -> storage
        picture, or ``.save("t.svg")`` it.

    Raises:
        ExplainInputError: ``tensor`` is not a tensor, or has no storage (sparse, nested).

    Example:
        >>> import torch, gradscope as gs
        >>> t = torch.arange(12.0).reshape(3, 4)
        >>> e = gs.explain(t.T, t)
        >>> e.stride, e.is_contiguous, e.shares_storage_with
        ((1, 4), False, [0])
    """
    if not isinstance(tensor, torch.Tensor):
        raise ExplainInputError(
            f"gs.explain expects a torch.Tensor, got {type(tensor).__name__}"
        )
    if tensor.layout != torch.strided:
        raise ExplainInputError(
            f"a {tensor.layout} tensor has no single strided storage to explain; "
            "call .to_dense() first"
        )
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError) as exc:
        raise ExplainInputError(f"this tensor has no storage to explain ({exc})") from None
    ptr = storage.data_ptr()
    size = tensor.element_size()
    numel = storage.nbytes() // size
    shared = [
        i for i, o in enumerate(others)
        if isinstance(o, torch.Tensor) and o.layout == torch.strided
        and o.device == tensor.device and _storage_ptr(o) == ptr
    ]
    return Explanation(
        shape=tuple(tensor.shape),
        stride=tuple(tensor.stride()),
        storage_offset=int(tensor.storage_offset()),
        is_contiguous=tensor.is_contiguous(),
        dtype=str(tensor.dtype).removeprefix("torch."),
        device=str(tensor.device),
        element_size=size,
        storage_nbytes=storage.nbytes(),
        storage_numel=numel,
        data_ptr=ptr,
        version=tensor._version,
        is_leaf=tensor.is_leaf,
        requires_grad=tensor.requires_grad,
        grad_fn=None if tensor.grad_fn is None else type(tensor.grad_fn).__name__,
        is_view=tensor._is_view(),
        shares_storage_with=shared,
        others=[_describe(o) for o in others],
        mapping=_mapping(tensor),
        storage_values=_storage_values(tensor, numel),
    )


# ---------------------------------------------------------------------------------- rich
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
        table.add_row(key, value)
    return table


def _index_label(idx: tuple[int, ...]) -> str:
    return "[" + ",".join(map(str, idx)) + "]"


def _picture(e: Explanation) -> list[RenderableType]:
    if e.mapping is None or len(e.mapping) > _DRAW or e.storage_numel > _DRAW_STORAGE:
        return [Text(
            f"index -> storage picture not drawn: {len(e.mapping or []) or 'over 4096'} view "
            f"elements over a storage of {e.storage_numel} (drawn up to {_DRAW} / {_DRAW_STORAGE})",
            style="dim",
        )]
    return [
        Text(f"view {list(e.shape)}: each cell shows the storage position it reads", style="bold"),
        _view_grid(e),
        Text(f"storage: {e.storage_numel} x {e.dtype}, one-dimensional", style="bold"),
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
            table.add_column(str(c), justify="right")
        for r in range(rows):
            cells = [f"{pos}" for _, pos in e.mapping[r * cols:(r + 1) * cols]]
            table.add_row(str(r), *cells)
        return table
    table = Table()
    table.add_column("index")
    table.add_column("storage position", justify="right")
    for idx, pos in e.mapping:
        table.add_row(_index_label(idx), str(pos))
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
            table.add_column(str(pos), justify="right", style="" if pos in users else "dim")
        if values is not None:
            table.add_row("value", *(_fmt(v) for v in values))
        table.add_row("view index", *(users.get(p, "-") for p in range(e.storage_numel)))
        return table
    table = Table()
    table.add_column("position", justify="right")
    if values is not None:
        table.add_column("value", justify="right")
    table.add_column("view index")
    for pos in range(e.storage_numel):
        cells = [str(pos)] + ([_fmt(values[pos])] if values is not None else [])
        table.add_row(*cells, users.get(pos, "-"), style="" if pos in users else "dim")
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
