"""What the walk reads of one tensor besides its dtype and device: its shape (``_shape``; nested
and jagged tensors too, a ragged dimension as None), its bytes (``_nbytes``; sparse tensors
too) and a stable id per storage (``_Storages``: ``s0``, ``s1``... in order of first sight).

The compiled walk (``_cwalk.c``) reads plain tensors itself and falls back on these, through
what ``gradscope.graph.walk`` hands it: ``_storage_key``, a walk's ``_Storages.by_key`` and
``record_of``, ``_Walker.shape_of`` (``_shape``) and ``_Walker.saved_record`` (``_nbytes``).
"""

from __future__ import annotations

from typing import Any

import torch

from .._torch import torchcompat

#: The address of a tensor's StorageImpl: one key per storage (raises for storage-less tensors).
_storage_key = torchcompat.storage_key


def _nbytes(t: torch.Tensor) -> int:
    """``t.nbytes``; for sparse tensors (which refuse it) the bytes of their index and value
    tensors, which is what the graph holds."""
    try:
        return t.nbytes
    except RuntimeError:
        layout = t.layout
        parts: tuple[torch.Tensor, ...]
        if layout == torch.sparse_coo:
            parts = (t._indices(), t._values())
        elif layout in (torch.sparse_csr, torch.sparse_bsr):
            parts = (t.crow_indices(), t.col_indices(), t.values())
        elif layout in (torch.sparse_csc, torch.sparse_bsc):
            parts = (t.ccol_indices(), t.row_indices(), t.values())
        else:
            return 0
        return sum(p.nbytes for p in parts)


def _dim(d: Any) -> int | None:
    """One size of a tensor's shape: an int, or None for a dimension with no single size (the
    ragged dimension of a jagged nested tensor is a symbolic "nested int")."""
    if type(d) is int:
        return d
    try:
        return int(d)
    except Exception:  # a nested int refuses int() (with AttributeError, in torch 2.13)
        return None


def _nested_shape(t: torch.Tensor) -> list[int | None]:
    """The shape of a strided nested tensor (which has no ``.shape``): the number of
    components, then each dimension's size where all components agree, else None."""
    n = t.size(0)
    rest = t.dim() - 1
    try:  # (components, dims) sizes, kept on the CPU whatever the tensor's device
        rows = t._nested_tensor_size().tolist()
    except (RuntimeError, NotImplementedError, AttributeError):
        rows = []
    out: list[int | None] = [n]
    for j in range(rest):
        sizes = {row[j] for row in rows if len(row) > j}
        out.append(sizes.pop() if len(sizes) == 1 else None)
    return out


def _shape(t: torch.Tensor) -> list[int | None]:
    """``list(t.shape)``, also for nested tensors: a dimension without a single size (a ragged
    one) is None, the form the JSON schema documents (``null``) and renderers draw as ``*``."""
    try:
        shape: list[int | None] = list(t.shape)
    except RuntimeError:  # a strided nested tensor: "NestedTensorImpl doesn't support sizes"
        if not t.is_nested:
            raise
        return _nested_shape(t)
    if t.is_nested:  # jagged: the ragged size is a SymInt, which must not reach the model
        return [_dim(d) for d in shape]
    return shape


class _Storages:
    """Gives each distinct storage a stable id (``s0``, ``s1``...) in order of first sight."""

    _NONE = (None, None)

    def __init__(self) -> None:
        # storage key -> (id, untyped_storage().nbytes()); the compiled walk is given it, and
        # reads and fills it too (one dict operation per saved tensor: on a big graph each is
        # a cache miss)
        self.by_key: dict[int, tuple[str, int]] = {}

    def record_of(self, t: torch.Tensor) -> tuple[str, int] | tuple[None, None]:
        """``(storage id, bytes of the whole storage)``, or ``(None, None)`` for a tensor
        without a storage (sparse, nested...)."""
        try:
            key = _storage_key(t)
        except (RuntimeError, NotImplementedError, AttributeError):
            return self._NONE
        found = self.by_key.get(key)
        if found is None:
            found = self.by_key[key] = ("s%d" % len(self.by_key), t.untyped_storage().nbytes())
        return found

    def id_of(self, t: torch.Tensor) -> str | None:
        return self.record_of(t)[0]



def holds_data(t: torch.Tensor) -> bool:
    """Whether ``t``'s storage holds every element it views: FSDP2 frees a gathered
    parameter's storage (``resize_(0)``) between its uses while the tensor and the graph's
    references to it stay, and reading such a tensor reads freed memory."""
    if t.numel() == 0:
        return True
    try:
        last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride(),
                                                                   strict=True))
        return t.untyped_storage().nbytes() >= (last + 1) * t.element_size()
    except (RuntimeError, NotImplementedError, TypeError):  # no storage of its own (a
        return True  # functorch wrapper, a subclass): read as any other tensor


#: Floating dtypes of one byte (the float8 family): torch implements few reductions for them
#: (``isinf`` for some, ``vector_norm`` and ``aminmax`` for none), so checks read them widened.
_NARROW = frozenset(
    dt for dt in (getattr(torch, name, None) for name in (
        "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu"))
    if dt is not None
)
#: Packed sub-byte floats (two float4 values a byte): not even a copy to float32 exists.
_PACKED = frozenset(
    dt for dt in (getattr(torch, name, None) for name in ("float4_e2m1fn_x2",)) if dt is not None
)


def checkable(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` in a dtype whose NaN/Inf tests and norms torch implements: a float8 tensor is
    widened to float32 (every float8 value, NaN and Inf included, is exact in float32; the
    copy, 4 bytes an element, is made only for these dtypes); None for a packed float4 tensor,
    which nothing can read element by element; any other tensor as it is."""
    dtype = t.dtype
    if dtype in _NARROW:
        return t.float()
    return None if dtype in _PACKED else t
