"""Gradient statistics on the device: nine ops, one packed tensor, one host transfer.

Every logged step packs the statistics of all watched tensors into one float64 matrix (one row
per statistic, the rows below; one column per tensor) that is moved to the host with a single
``.tolist()``. Nothing here synchronises with the device; the caller decides when the one
transfer happens.

On a small model the cost of a logged step is the number of ops (each a dispatcher call and a
kernel launch, and right after a training step each distinct one starts with cold caches), not
the bytes. So the number of ops is fixed, whatever the number of parameters, and so is their
variety:

1. one ``_foreach_copy_`` copies every gradient into row ``SUM_ABS`` of a reused float64 work
   buffer (float64 accumulation, whatever the gradients' dtype), each tensor starting on a block
   of ``_BLOCK`` elements, so that no block holds two tensors;
2. ``abs_`` on that row, ``mul`` (or ``pow``) into row ``POW``, and one broadcast ``gt`` against
   the column ``(0, max float, -1)`` into rows ``NONZERO`` (non-zero, not NaN), ``INF`` and
   ``NOT_NAN`` (not NaN: the padding counts too, see ``SLOTS``);
3. per block: one ``sum`` of all rows, one ``amax`` of ``|g|``;
4. one ``gather`` lays the block results out as ``[tensor, block]``, padded with an empty
   block, and one ``sum`` and one ``amax`` over the blocks write each tensor's sums and max
   straight into the output (NaN propagates through the maxima, as it should; a NaN or an
   infinity stays in the column of its own tensor).

Zero padding maps to zero in every row but ``NOT_NAN``, where each tensor's column counts
``SLOTS`` elements in all, so ``NaN count = SLOTS - NOT_NAN``. The buffers, the views of the work
buffer shaped like the gradients, the index and the output (whose constant rows ``NUMEL`` and
``SLOTS`` are filled once) form a ``_Layout``, kept in the caller's cache from step to step (the
shapes repeat every step), so a step allocates nothing. When padding every tensor to the block
count of the largest would waste too much, step 4 is a sparse product with a 0/1 CSR matrix and
a ``segment_reduce`` instead. A model larger than ``_CHUNK_NUMEL`` elements is processed chunk
by chunk, with layouts made afresh each step whose rows share one work buffer kept in the cache
(cleared where padding must be zero), so the work buffers never take more than ~90 MB.

With an optimizer, ``snapshot`` copies the weights into a flat buffer laid out like a row before
the step, and ``add_update`` then reduces ``(w_new - w_old)^2`` and ``w_old^2`` per tensor the
same way, in rows ``NONZERO`` and ``INF`` of the work buffer (the next step rewrites them).

The norm is not taken on the device: the matrix holds the sum of ``|g|^p``, which is additive,
and the host takes its p-th root (``norm_of``). So every row but ``MAX_ABS`` is a sum, and across
processes the matrix is all-gathered in one collective and reduced locally: sums for the
additive rows, a max for the maxima. One all-gather of a few floats per tensor replaces a SUM
and a MAX all-reduce, which would be two.
"""

from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch

# Rows of the packed matrix (one column per tensor). POW: sum |g|^p (left 0 for p = 1 and
# p = inf, whose norms are SUM_ABS and MAX_ABS); NONZERO: values neither 0 nor NaN; NOT_NAN:
# values that are not NaN, padding included; SLOTS: elements counted by NOT_NAN (constant);
# NUMEL: the tensor's size, 0 for a tensor without gradient (constant).
POW, SUM_ABS, NONZERO, INF, NOT_NAN, MAX_ABS, NUMEL, SLOTS, UPDATE_SQ, WEIGHT_SQ = range(10)
NCOLS = 10
# rows POW..NOT_NAN of the work buffer are summed into the rows of the same names
_ROWS = 5
# what |g| is compared with (greater than) to fill rows NONZERO, INF and NOT_NAN
_THRESHOLDS = (0.0, torch.finfo(torch.float64).max, -1.0)

# each tensor starts on a block of this many elements: per-block sums and maxima are dense
# reductions over contiguous memory, and few enough to be combined per tensor cheaply
_BLOCK = 64

# a model larger than this is processed in chunks of about this many elements (a larger single
# tensor is a chunk of its own): 5 float64 rows of it are ~84 MB
_CHUNK_NUMEL = 1 << 21

# layouts kept per cache: a monitor's gradients, and its parameters when some have no gradient
_CACHE_SIZE = 4

_F64 = torch.float64


def to_device(values: Sequence[float], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A small constant tensor on ``device`` without waiting for the device: a blocking copy
    from host memory (what ``torch.tensor(..., device=...)`` does) synchronises the stream,
    which would add host syncs to a logged step on a GPU. The copy is queued instead; pageable
    host memory is staged by the driver at once, so the source may go away."""
    t = torch.tensor(values, dtype=dtype)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


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


class _Geometry:
    """Where each tensor of a chunk lies in a row of the work buffer: from a block boundary;
    one empty block more at the end (the padding of step 4)."""

    def __init__(self, shapes: tuple[torch.Size, ...], device: torch.device) -> None:
        self.shapes = shapes
        self.device = device
        self.sizes = [math.prod(s) for s in shapes]
        self.blocks = [-(-n // _BLOCK) for n in self.sizes]
        self.starts = [_BLOCK * b for b in itertools.accumulate(self.blocks[:-1], initial=0)]
        self.nblocks = sum(self.blocks) + 1
        self.width = _BLOCK * self.nblocks

    def place(self, row: torch.Tensor) -> list[torch.Tensor]:
        """Views of ``row`` shaped like the tensors."""
        return [
            row[s : s + n].view(shape)
            for s, n, shape in zip(self.starts, self.sizes, self.shapes, strict=True)
        ]


class _Layout(_Geometry):
    """The float64 work buffer of one chunk of tensors (``_ROWS`` rows), views of its row
    ``SUM_ABS`` shaped like the tensors, and the buffers and indices that reduce it per tensor
    into ``out``; made once per list of shapes.

    ``work``: a flat float64 buffer that the rows are carved from instead of a buffer of their
    own, shared by the chunks of a large model (a fresh buffer of that size per chunk and step
    would cost more than the statistics). Other chunks leave data in it, so the rows whose
    padding must be zero are cleared before each use (``shared``)."""

    def __init__(
        self,
        shapes: tuple[torch.Size, ...],
        device: torch.device,
        work: torch.Tensor | None = None,
    ) -> None:
        super().__init__(shapes, device)
        n, nb = len(shapes), self.nblocks
        self.shared = work is not None
        if work is None:
            self.rows = torch.zeros(_ROWS, self.width, dtype=_F64, device=device)
        else:
            self.rows = work[: _ROWS * self.width].view(_ROWS, self.width)
        self.row = self.rows.unbind(0)
        self.cleared = self.rows[: SUM_ABS + 1]  # POW (left 0 for p = 1, inf) and SUM_ABS
        mag = self.row[SUM_ABS]
        self.views = self.place(mag)
        self.mag_2d = mag.view(1, -1)
        self.thresholds = to_device(_THRESHOLDS, _F64, device).view(-1, 1)
        self.counts = self.rows[NONZERO : NOT_NAN + 1]
        # per block: rows 0.._ROWS-1 the sums of the rows, row _ROWS (= MAX_ABS) the max of |g|
        self.block = torch.empty(_ROWS + 1, nb, dtype=_F64, device=device)
        self.by_block = self.rows.view(_ROWS, nb, _BLOCK)
        self.mag_by_block = mag.view(nb, _BLOCK)
        # rows NONZERO and INF, side by side: the work rows of the update-to-weight ratios
        self.update_rows = self.rows[NONZERO : INF + 1]
        self.update_by_block = self.update_rows.view(2, nb, _BLOCK)
        self.out = torch.zeros(NCOLS, n, dtype=_F64, device=device)
        widest = max(self.blocks, default=0)
        # step 4 dense (padded to the widest tensor) unless that is much more than the blocks
        self.dense = n * widest <= 4 * nb + 1024
        if self.dense:
            # row i: the blocks of tensor i, then the empty last block as often as needed
            blocks = to_device(self.blocks, torch.int64, device)
            first = torch.cumsum(blocks, 0) - blocks
            j = torch.arange(widest, device=device)
            index = torch.where(j < blocks[:, None], first[:, None] + j, nb - 1)
            # one row of block indices per row of ``block`` (torch.gather wants it so)
            self.index = index.view(1, -1).expand(_ROWS + 1, -1).contiguous()
            self.gathered = torch.empty(_ROWS + 1, n * widest, dtype=_F64, device=device)
            self.per_tensor = self.gathered.view(_ROWS + 1, n, widest)
            slots = [_BLOCK * widest] * n
        else:
            # int32 indices when they fit: the sparse kernels would convert int64 ones each call
            itype = torch.int32 if nb < 2**31 else torch.int64
            crow = to_device((0, *self.blocks), torch.int64, device).cumsum(0).to(itype)
            with warnings.catch_warnings():  # "sparse CSR tensor support is in beta state"
                warnings.simplefilter("ignore", UserWarning)
                self.segments = torch.sparse_csr_tensor(
                    crow,
                    torch.arange(nb - 1, device=device, dtype=itype),
                    torch.ones(nb - 1, dtype=_F64, device=device),
                    size=(n, nb),
                )
            self.lengths = to_device(self.blocks, torch.int64, device)
            slots = [_BLOCK * b for b in self.blocks]
        self.out[NUMEL] = to_device(self.sizes, _F64, device)
        self.out[SLOTS] = to_device(slots, _F64, device)
        self.snapshots: dict[torch.dtype, tuple[torch.Tensor, list[torch.Tensor]]] = {}

    def per_tensor_sums(self, rows: slice, out: torch.Tensor) -> None:
        """Write into ``out`` (``[rows, n]``) the per-tensor sums of ``self.block[rows]``."""
        if self.dense:
            torch.gather(self.block[rows], 1, self.index[rows], out=self.gathered[rows])
            torch.sum(self.per_tensor[rows], dim=2, out=out)
        else:
            out.copy_(torch.mm(self.segments, self.block[rows].T).T)

    def snapshot_buffer(self, dtype: torch.dtype) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A zeroed buffer laid out like one row, in ``dtype``, and its views per tensor."""
        found = self.snapshots.get(dtype)
        if found is None:
            flat = torch.zeros(self.width, dtype=dtype, device=self.device)
            found = self.snapshots[dtype] = (flat, self.place(flat))
        return found


def _key(tensors: Sequence[torch.Tensor]) -> tuple[tuple[torch.Size, ...], torch.device]:
    return tuple([t.shape for t in tensors]), tensors[0].device


def _cached(tensors: Sequence[torch.Tensor], cache: dict | None) -> _Layout | None:
    """The layout of ``tensors`` from ``cache``, made and kept there if need be; None when
    there is no cache or ``tensors`` are more than one chunk."""
    if cache is None:
        return None
    key = _key(tensors)
    found = cache.get(key)
    if found is None and len(_chunks(tensors)) == 1:
        if len(cache) >= _CACHE_SIZE:
            cache.clear()
        found = cache[key] = _Layout(*key)
    return found


def _chunk_matrix(grads: list[torch.Tensor], norm_type: float, lay: _Layout) -> torch.Tensor:
    """``[NCOLS, len(grads)]`` float64 (update rows zero): ``lay.out``, overwritten next call."""
    row, out = lay.row, lay.out
    mag = row[SUM_ABS]
    if lay.shared:
        lay.cleared.zero_()
    torch._foreach_copy_(lay.views, grads)  # to float64, whatever the gradients' dtype
    mag.abs_()
    if norm_type == 2:
        torch.mul(mag, mag, out=row[POW])
    elif not (norm_type == 1 or math.isinf(norm_type)):
        torch.pow(mag, norm_type, out=row[POW])
    torch.gt(lay.mag_2d, lay.thresholds, out=lay.counts)
    torch.sum(lay.by_block, dim=2, out=lay.block[:_ROWS])
    torch.amax(lay.mag_by_block, dim=1, out=lay.block[_ROWS])
    if lay.dense:
        torch.gather(lay.block, 1, lay.index, out=lay.gathered)
        torch.sum(lay.per_tensor[:_ROWS], dim=2, out=out[:_ROWS])
        torch.amax(lay.per_tensor[_ROWS], dim=1, out=out[MAX_ABS])
    else:
        out[:_ROWS] = torch.mm(lay.segments, lay.block[:_ROWS].T).T
        out[MAX_ABS] = torch.segment_reduce(lay.block[_ROWS, :-1], "max", lengths=lay.lengths)
    return out


def grad_matrix(
    grads: list[torch.Tensor], norm_type: float, cache: dict | None = None
) -> torch.Tensor:
    """The packed ``[NCOLS, len(grads)]`` float64 statistics of ``grads`` (on their device),
    update rows zero. Call under ``torch.no_grad()`` or inference mode (the layout's buffers
    are then inference tensors, to be used in inference mode only); the gradients are only read.

    ``cache``: a dict the caller keeps from step to step, for the layout (buffers) of a model
    that is one chunk; the result is then a buffer of that layout, valid until the next call.
    The chunks of a larger model get fresh layouts, one at a time, whose rows share one work
    buffer kept in ``cache``.
    """
    lay = _cached(grads, cache)
    if lay is not None:
        return _chunk_matrix(grads, norm_type, lay)
    chunks = _chunks(grads)
    work = _work([_Geometry(*_key(c)) for c in chunks], cache)
    parts = [_chunk_matrix(c, norm_type, _Layout(*_key(c), work)) for c in chunks]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


def _work(geos: Sequence[_Geometry], cache: dict | None) -> torch.Tensor | None:
    """The work buffer that the layouts of the chunks ``geos`` share, kept in ``cache``
    (None without a cache: each layout then has buffers of its own)."""
    if cache is None:
        return None
    device = geos[0].device
    size = _ROWS * max(g.width for g in geos)
    found = cache.get(("work", device))
    if found is None or found.numel() < size:
        cache.pop(("work", device), None)  # freed before its successor is made
        found = cache[("work", device)] = torch.empty(size, dtype=_F64, device=device)
    return found


Snapshot = list[tuple[_Geometry, torch.Tensor]]


def snapshot(params: list[torch.Tensor], cache: dict | None = None) -> Snapshot:
    """Copies of the weights before an optimizer step, for ``add_update``: per chunk, one flat
    buffer in the weights' (promoted) dtype, laid out like a row of the work buffer."""
    lay = _cached(params, cache)
    out: Snapshot = []
    for chunk in [params] if lay is not None else _chunks(params):
        dtype = chunk[0].dtype
        for p in chunk[1:]:
            if p.dtype != dtype:
                dtype = torch.promote_types(dtype, p.dtype)
        if lay is not None:
            geo: _Geometry = lay
            flat, views = lay.snapshot_buffer(dtype)
        else:  # a chunk of a large model: a fresh buffer, and no work buffer held meanwhile
            geo = _Geometry(*_key(chunk))
            flat = torch.zeros(geo.width, dtype=dtype, device=geo.device)
            views = geo.place(flat)
        torch._foreach_copy_(views, chunk)
        out.append((geo, flat))
    return out


def add_update(
    matrix: torch.Tensor, old: Snapshot, new: Sequence[torch.Tensor], cache: dict | None = None
) -> torch.Tensor:
    """Fill the update rows of ``matrix`` (in place, and return it), in float64:
    ``||w_new - w_old||^2`` and ``||w_old||^2`` per tensor. ``old``: the ``snapshot`` of the same
    tensors before the step; ``cache``: the one given to ``snapshot``."""
    work = None if isinstance(old[0][0], _Layout) else _work([g for g, _ in old], cache)
    start = 0
    for geo, flat in old:
        lay = geo if isinstance(geo, _Layout) else _Layout(geo.shapes, geo.device, work)
        n = len(lay.shapes)
        part = list(new[start : start + n])
        rows = lay.update_rows  # [new - old, old], in rows the next measure rewrites
        rows[1].copy_(flat)
        if lay.shared:
            lay.row[SUM_ABS].zero_()
        torch._foreach_copy_(lay.views, part)
        torch.sub(lay.row[SUM_ABS], rows[1], out=rows[0])
        rows.square_()
        torch.sum(lay.update_by_block, dim=2, out=lay.block[:2])
        lay.per_tensor_sums(slice(0, 2), matrix[UPDATE_SQ:, start : start + n])
        start += n
    return matrix


def norm_of(pow_sum: float, sum_abs: float, max_abs: float, norm_type: float) -> float:
    """The norm of one tensor from its packed statistics."""
    if norm_type == 2:
        return math.sqrt(pow_sum)
    if norm_type == 1:
        return sum_abs
    if math.isinf(norm_type):
        return max_abs
    return pow_sum ** (1.0 / norm_type)


def combine(stacked: torch.Tensor, *, mean: bool = False) -> torch.Tensor:
    """Reduce a ``[k, NCOLS, n]`` stack of matrices over its first axis: maxima by max,
    everything else (sums of ``|g|^p`` included) summed, or averaged when ``mean``."""
    out = stacked.sum(dim=0)
    if mean:
        out = out / stacked.shape[0]
    out[MAX_ABS] = stacked[:, MAX_ABS].amax(dim=0)
    return out


def reduce_across_ranks(
    matrix: torch.Tensor, *, replicated: bool, group: Any = None
) -> torch.Tensor:
    """Combine every rank's matrix with ONE collective (an all-gather) and reduce locally.

    ``replicated``: every rank holds the same (already averaged) gradients, as under DDP; the
    additive rows are then averaged rather than summed so figures are not counted twice.
    """
    import torch.distributed as dist

    world = dist.get_world_size(group)
    rows, cols = matrix.shape
    # concatenated along dim 0 (the layout every backend accepts), then viewed per rank
    gathered = torch.empty((world * rows, cols), dtype=matrix.dtype, device=matrix.device)
    dist.all_gather_into_tensor(gathered, matrix.contiguous(), group=group)
    return combine(gathered.view(world, rows, cols), mean=replicated)


def total_norm(stats: Sequence[Sequence[float]], norm_type: float) -> float:
    """The norm over all tensors, as ``torch.nn.utils.get_total_norm`` defines it (the norm of
    the per-tensor norms), from the rows of a packed matrix moved to the host: the p-th root of
    the sum of the tensors' sums of ``|g|^p``. NaN if any value is NaN."""
    if math.isinf(norm_type):
        maxima = [m for m, n in zip(stats[MAX_ABS], stats[NUMEL], strict=True) if n > 0]
        return max(maxima, key=lambda v: math.inf if math.isnan(v) else v, default=0.0)
    if norm_type == 1:
        return sum(stats[SUM_ABS])
    total = sum(stats[POW])
    return math.sqrt(total) if norm_type == 2 else total ** (1.0 / norm_type)


def module_row(grad: torch.Tensor, norm_type: float) -> torch.Tensor:
    """The packed statistics of one module's gradient output (one column)."""
    return grad_matrix([grad], norm_type)[:, 0]
