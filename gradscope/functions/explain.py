"""``gs.explain``: what a tensor is made of -- a one-dimensional storage seen through a shape,
strides and an offset -- measured here; the result is the plain ``Explanation`` record
(``gradscope.functions.explain_records``), drawn by ``gradscope.functions.explain_views``
(a rich table, or SVG).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from .._torch import torchcompat
from ..errors import ExplainInputError
from .explain_records import Explanation

#: the mapping is computed up to this many view elements
_MAX_MAP = 4096
_DRAW_STORAGE = 128


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
        version=torchcompat.tensor_version(tensor) or 0,
        is_leaf=tensor.is_leaf,
        requires_grad=tensor.requires_grad,
        grad_fn=None if tensor.grad_fn is None else type(tensor.grad_fn).__name__,
        is_view=tensor._is_view(),
        shares_storage_with=shared,
        others=[_describe(o) for o in others],
        mapping=_mapping(tensor),
        storage_values=_storage_values(tensor, numel),
    )
