"""What ``gs.explain`` found about a tensor, as plain data (no reference to the tensor is kept):
its shape, strides, offset, storage, and where each of its elements lives in that storage."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FormatError
from ..output.files import write_atomic
from ..output.formats import Shown, renderer


@dataclass
class Explanation(Shown):
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

    VIEW = "explain"

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
    def to_svg(self) -> str:
        """The index -> storage picture, with the metadata, as SVG text."""
        return str(renderer("explain_svg")(self))

    def save(self, path: str | Path) -> Path:
        """Write the picture as SVG to ``path`` (which must end in ``.svg``)."""
        path = Path(path)
        if path.suffix.lower() != ".svg":
            raise FormatError(
                f"explain pictures are saved as SVG, got {path.name!r}; use a path ending in .svg"
            )
        return write_atomic(path, self.to_svg())
