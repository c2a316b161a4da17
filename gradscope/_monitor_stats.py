"""Gradient statistics on the device: batched ops, one packed tensor, one host transfer.

Every logged step packs the statistics of all watched tensors into one float64 matrix (one row
per tensor, the columns below) that is moved to the host with a single ``.tolist()``. Nothing
here synchronises with the device; the caller decides when the one transfer happens.

The gradients are concatenated into one flat buffer (chunk by chunk for large models), so the
number of kernels per logged step does not grow with the number of parameters: norms and maxima
all come from a handful of ops on that buffer, in float64 whatever the gradients' dtype: sparse
products with a 0/1 segment matrix sum ``|g|^p``, ``|g|`` and three 0/1 indicator columns
(non-zero, non-finite, NaN) per parameter, and one ``segment_reduce`` takes the maxima.

Across processes the matrix is all-gathered in one collective and reduced locally: sums for the
additive columns (``|g|^p`` sums, ``|g|`` sums, counts, sizes), a max for the maxima. One
all-gather of a few floats per tensor replaces a SUM and a MAX all-reduce, which would be two.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch._utils import _flatten_dense_tensors

# column layout of the packed matrix
NORM, SUM_ABS, MAX_ABS, NONZERO, NONFINITE, NAN, NUMEL, PRESENT, UPDATE_SQ, WEIGHT_SQ = range(10)
NCOLS = 10

# the flat buffer and its temporaries are made chunk by chunk, so a large model never needs more
# than ~150 MB of them at once (a larger single tensor is a chunk of its own)
_CHUNK_NUMEL = 1 << 21

_F64 = torch.float64
_F32 = torch.float32


def _chunks(tensors: Sequence[torch.Tensor]) -> list[list[torch.Tensor]]:
    out: list[list[torch.Tensor]] = [[]]
    size = 0
    for t in tensors:
        if out[-1] and size + t.numel() > _CHUNK_NUMEL:
            out.append([])
            size = 0
        out[-1].append(t)
        size += t.numel()
    return out


_SEGMENTS: dict[tuple[tuple[int, ...], torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def _segments(sizes: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A sparse ``[n, sum(sizes)]`` 0/1 matrix whose row i sums segment i (one sparse product
    sums every segment of a column at once), and the segment lengths. Cached while small: the
    sizes repeat every step."""
    key = (sizes, device)
    found = _SEGMENTS.get(key)
    if found is not None:
        return found
    total = sum(sizes)
    # int32 indices when they fit: the sparse kernels would convert int64 ones on every call
    index = torch.int32 if total < 2**31 else torch.int64
    crow = torch.tensor((0, *sizes), device=device).cumsum(0).to(index)
    with warnings.catch_warnings():  # "sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        matrix = torch.sparse_csr_tensor(
            crow,
            torch.arange(total, device=device, dtype=index),
            torch.ones(total, dtype=_F64, device=device),
            size=(len(sizes), total),
        )
    lengths = torch.tensor(sizes, device=device)
    if total <= _CHUNK_NUMEL:
        if len(_SEGMENTS) >= 16:
            _SEGMENTS.clear()
        _SEGMENTS[key] = (matrix, lengths)
    return matrix, lengths


def _indicators(mag: torch.Tensor) -> list[torch.Tensor]:
    """0/1 columns marking, in ``mag = |g|``: non-zero non-NaN values, non-finite values, NaNs.
    Made of float ops only: on the CPU they are several times faster than the boolean ``==`` /
    ``isnan`` / ``isinf``. ``x * 0`` is NaN exactly where ``x`` is NaN or infinite; clamping
    first keeps infinities finite, so ``min(x, 1) * 0`` is NaN exactly at the NaNs."""
    nonzero = torch.nan_to_num(torch.sign(mag), nan=0.0)  # sign(NaN) is 0 or NaN by backend
    nonfinite = torch.nan_to_num(mag * 0, nan=1.0)
    nan = torch.nan_to_num(mag.clamp(max=1.0) * 0, nan=1.0)
    return [nonzero, nonfinite, nan]


def _chunk_matrix(chunk: list[torch.Tensor], norm_type: float) -> torch.Tensor:
    """``[len(chunk), 6]`` float64: norm, sum |g|, max |g|, non-zeros, non-finite, NaNs."""
    sizes = tuple(g.numel() for g in chunk)
    flat = _flatten_dense_tensors(chunk) if len(chunk) > 1 else chunk[0].reshape(-1)
    mag = flat.abs().to(_F64)  # float64 accumulation, whatever the gradients' dtype
    segments, lengths = _segments(sizes, flat.device)
    powered = not (norm_type == 1 or math.isinf(norm_type))
    cols = ([mag * mag if norm_type == 2 else mag.pow(norm_type)] if powered else []) + [mag]
    # one sparse matrix-vector product per column: stacking the columns side by side first
    # costs more than the products themselves
    sums = torch.stack([torch.mv(segments, c) for c in cols + _indicators(mag)], dim=1)
    max_abs = torch.segment_reduce(mag, "max", lengths=lengths)  # NaN propagates, as it should
    sum_abs = sums[:, -4]
    if math.isinf(norm_type):
        norm = max_abs
    else:
        norm = sums[:, 0].pow(1.0 / norm_type) if powered else sum_abs
    return torch.cat([torch.stack([norm, sum_abs, max_abs], dim=1), sums[:, -3:]], dim=1)


def grad_matrix(
    grads: Sequence[torch.Tensor], norm_type: float, numel: torch.Tensor
) -> torch.Tensor:
    """The packed ``[len(grads), NCOLS]`` float64 statistics of ``grads`` (on their device).

    ``numel`` is a float64 device tensor of the tensors' sizes, made once by the caller.
    Every tensor must have at least one element.
    """
    chunks = [_chunk_matrix(c, norm_type) for c in _chunks(grads)]
    stats = chunks[0] if len(chunks) == 1 else torch.cat(chunks)
    n, dev = len(grads), stats.device
    ones = torch.ones(n, 1, dtype=torch.float64, device=dev)
    update = torch.zeros(n, NCOLS - PRESENT - 1, dtype=torch.float64, device=dev)
    return torch.cat([stats, numel.view(-1, 1), ones, update], dim=1)


def add_update(
    matrix: torch.Tensor, old: Sequence[torch.Tensor], new: Sequence[torch.Tensor]
) -> torch.Tensor:
    """Fill the update columns: ``||w_new - w_old||^2`` and ``||w_old||^2`` per tensor."""
    delta = torch._foreach_sub(list(new), list(old))
    upd = torch.stack(list(torch._foreach_norm(delta, 2, dtype=_F32))).to(torch.float64)
    wgt = torch.stack(list(torch._foreach_norm(list(old), 2, dtype=_F32))).to(torch.float64)
    matrix = matrix.clone()
    matrix[:, UPDATE_SQ] = upd.square()
    matrix[:, WEIGHT_SQ] = wgt.square()
    return matrix


def combine(stacked: torch.Tensor, norm_type: float, *, mean: bool = False) -> torch.Tensor:
    """Reduce a ``[k, n, NCOLS]`` stack of matrices over its first axis: norms as p-norms of
    norms, maxima by max, everything else summed (averaged when ``mean``)."""
    powed = stacked.clone()
    if not math.isinf(norm_type):
        powed[..., NORM] = stacked[..., NORM].pow(norm_type)
    out = powed.sum(dim=0)
    if mean:
        out = out / stacked.shape[0]
    out[:, MAX_ABS] = stacked[..., MAX_ABS].amax(dim=0)
    if math.isinf(norm_type):
        out[:, NORM] = stacked[..., NORM].amax(dim=0)
    else:
        out[:, NORM] = out[:, NORM].pow(1.0 / norm_type)
    return out


def reduce_across_ranks(
    matrix: torch.Tensor, norm_type: float, *, replicated: bool, group: Any = None
) -> torch.Tensor:
    """Combine every rank's matrix with ONE collective (an all-gather) and reduce locally.

    ``replicated``: every rank holds the same (already averaged) gradients, as under DDP; the
    additive columns are then averaged rather than summed so figures are not counted twice.
    """
    import torch.distributed as dist

    world = dist.get_world_size(group)
    rows, cols = matrix.shape
    # concatenated along dim 0 (the layout every backend accepts), then viewed per rank
    gathered = torch.empty((world * rows, cols), dtype=matrix.dtype, device=matrix.device)
    dist.all_gather_into_tensor(gathered, matrix.contiguous(), group=group)
    return combine(gathered.view(world, rows, cols), norm_type, mean=replicated)


def total_norm(norms: Sequence[float], norm_type: float) -> float:
    """The norm of per-tensor norms, as ``torch.nn.utils.get_total_norm`` defines it."""
    if not norms:
        return 0.0
    if math.isinf(norm_type):
        return max(norms, key=lambda v: math.inf if math.isnan(v) else v)
    if any(math.isnan(v) for v in norms):
        return math.nan
    return math.fsum(v**norm_type for v in norms) ** (1.0 / norm_type)


def module_row(grad: torch.Tensor, norm_type: float) -> torch.Tensor:
    """The packed statistics of one module's gradient output (one row)."""
    numel = torch.tensor([float(grad.numel())], dtype=torch.float64, device=grad.device)
    return grad_matrix([grad], norm_type, numel)[0]
