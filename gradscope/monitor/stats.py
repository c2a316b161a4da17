"""Gradient statistics on the device, at the cost of about one read of the gradients.

The cost model (what a logged step pays, by setting):

* **norms** (every logged step): one ``torch._foreach_norm`` per dtype group of gradients (one
  pass over the gradients, no work buffer: the kernel reads them where they lie), stacked into
  one vector. A non-finite norm is how NaN/Inf is detected: a p-norm (p > 0) is NaN when the
  tensor holds a NaN and infinite when it holds an infinity (or overflows), so a finite norm
  proves the tensor finite. The exact counts (``nonfinite_counts``) run only for the tensors of
  a step whose norm is not finite, after the host has seen the norms.
* **full statistics** (every ``full_every``-th logged step, or when asked): per tensor one
  ``aminmax`` (max abs) and one ``count_nonzero`` (zero fraction), and |g| summed in pieces of
  64K elements through one scratch buffer of that size (mean abs; float32 sums of a piece stay
  accurate): about three more reads, and no per-element buffer.
* **update-to-weight ratios** (full steps, with an optimizer): estimated on a fixed lattice
  sample of each weight (``sample_views``): at most ``k`` elements per tensor, every ``s``-th
  element from a random offset, with the stride ``s`` made coprime with the last dimension so
  the sample walks across rows and columns alike. A tensor of at most ``k`` elements is
  sampled whole (exact ratio). Only the sampled elements are copied before the step (a
  transient buffer of ``sum(min(numel, k))`` elements, freed after it), so no weight is copied
  whole; ``k`` (default 4096) is lowered when needed so that buffer stays under 0.4% of the
  parameters' elements (``sample_size``). With Gaussian-like weights and updates the relative
  error of the estimate is about ``1 / sqrt(k)`` (1.6% at ``k = 4096``, 3% at 1024;
  ``tests/monitor/test_monitor.py`` checks it against the exact ratio).

Everything here queues device work and returns device tensors; nothing synchronises with the
device. The caller moves one packed vector to the host per logged step. The statistics are
additive or maxima (the norm's p-th power, |g| sums, counts; max abs), so shards of one
tensor on several processes combine exactly: ``combine_shards`` reduces them on the host after
one all-gather.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .._torch import torchcompat

#: row 0 of a step's matrix (one column per tensor): the norm; alone on steps without full
#: statistics. Row ``1 + k`` holds ``FULL_STATS[k]`` (below) on full steps.
NORM = 0
# rows of the update matrix: norm of the sampled change, norm of the sampled old weights
UPD, WGT = range(2)

#: |g| is summed in pieces of at most this many elements, through a scratch buffer that size
_SUM_CHUNK = 1 << 16

#: elements per tensor in the update-ratio sample (a smaller tensor is taken whole)
UPDATE_SAMPLE = 4096
#: the whole sample stays under this fraction of the parameters' elements (or SAMPLE_FLOOR)
SAMPLE_FRACTION = 0.004
SAMPLE_FLOOR = 1 << 16

_HALF = (torch.float16, torch.bfloat16)
_F64 = torch.float64


_TINY32 = torch.finfo(torch.float32).tiny
_TINY64 = torch.finfo(torch.float64).tiny


def underflow_bound(norm_type: float, dtype: torch.dtype = torch.float32) -> float:
    """A p-norm computed in ``dtype`` (float32 for float32 and half gradients) below this may
    have lost part of its value (or all of it) to underflow: |g|^p of its elements fell below
    the dtype's smallest normal number. Such norms are recomputed scaled
    (``nonfinite_counts``). 0 for p <= 1 and the max norm (no power below 1 to underflow)."""
    if math.isinf(norm_type) or norm_type <= 1:
        return 0.0
    tiny = _TINY64 if dtype in (_F64, torch.complex128) else _TINY32
    return tiny ** (1.0 / norm_type) * 1e4


def local(grad: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor (its shard on this process); other tensors as they are."""
    return torchcompat.local_tensor(grad)


def _groups(tensors: Sequence[torch.Tensor]) -> list[list[int]]:
    """Indices of ``tensors`` grouped by (device, dtype), in first-seen order."""
    first = tensors[0]
    key0 = (first.device, first.dtype)
    if all((t.device, t.dtype) == key0 for t in tensors):
        return [list(range(len(tensors)))]
    groups: dict[Any, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.device, t.dtype), []).append(i)
    return list(groups.values())


def _acc(dtype: torch.dtype) -> torch.dtype | None:
    # half-precision gradients are reduced in float32, as get_total_norm's kernels do
    return torch.float32 if dtype in _HALF else None


def norms(
    tensors: Sequence[torch.Tensor], norm_type: float, groups: list[list[int]] | None = None
) -> tuple[torch.Tensor, Sequence[int]]:
    """The norm of every tensor: one ``_foreach_norm`` per (device, dtype) group (``groups``:
    the indices of each group when the caller knows them).

    Returns the norms as one vector (float32 for float32/half tensors, float64 once a float64
    group is present) and ``order``: entry ``j`` of the vector is the norm of
    ``tensors[order[j]]``.
    """
    if groups is None:
        groups = _groups(tensors)
    if len(groups) == 1:
        acc = _acc(tensors[0].dtype)
        out = torch._foreach_norm(list(tensors), norm_type, dtype=acc)
        return torch.stack(out), range(len(tensors))
    parts, order = [], []
    for idx in groups:
        group = [tensors[i] for i in idx]
        parts.append(torch.stack(torch._foreach_norm(group, norm_type, dtype=_acc(group[0].dtype))))
        order += idx
    dtype = _F64 if any(p.dtype == _F64 for p in parts) else torch.float32
    return torch.cat([p.to(dtype) for p in parts]), order


def to_device(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """A small int64 constant on ``device`` without waiting for the device: a blocking copy
    from host memory (what ``torch.tensor(..., device=...)`` does) synchronises the stream. The
    copy is queued instead; pageable host memory is staged by the driver at once."""
    t = torch.tensor(values, dtype=torch.int64)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


def _abs_sums(ordered: Sequence[torch.Tensor]) -> torch.Tensor:
    """sum |t| of each tensor (float64 vector): |t| goes through one scratch buffer of
    ``_SUM_CHUNK`` elements per dtype, a piece of a contiguous tensor at a time, and each piece
    is summed on its own (float32 sums of 64K elements stay accurate, and a piece's NaN stays
    in its tensor); the pieces' sums are added per tensor by one ``segment_reduce``."""
    scratch: dict[torch.dtype, torch.Tensor] = {}
    runs: list[torch.Tensor] = []  # the piece sums, stacked per run of one sum dtype
    run: list[torch.Tensor] = []
    pieces: list[int] = []
    for t in ordered:
        parts = t.view(-1).split(_SUM_CHUNK) if t.is_contiguous() and t.numel() else (t,)
        acc = _F64 if t.dtype in (_F64, torch.complex128) else torch.float32
        if run and run[-1].dtype != acc:
            runs.append(torch.stack(run).to(_F64))
            run = []
        for part in parts:
            if part.is_contiguous() and 0 < part.numel() <= _SUM_CHUNK and not t.is_complex():
                buf = scratch.get(t.dtype)
                if buf is None or buf.numel() < part.numel():  # grows to _SUM_CHUNK at most
                    buf = scratch[t.dtype] = torch.empty_like(part.view(-1))
                view = buf[: part.numel()]
                torch.abs(part.view(-1), out=view)
                run.append(view.sum(dtype=acc))
            else:  # empty, or not contiguous: a temporary of its own
                run.append(part.abs().sum(dtype=acc))
        pieces.append(len(parts))
    if run:
        runs.append(torch.stack(run).to(_F64))
    sums = runs[0] if len(runs) == 1 else torch.cat(runs)
    if len(sums) == len(ordered):
        return sums
    return torch.segment_reduce(sums, "sum", lengths=to_device(pieces, sums.device))


def _max_abs_rows(ordered: Sequence[torch.Tensor]) -> torch.Tensor:
    """max |t| of each tensor (float64 vector): one ``aminmax`` per tensor (no |t| buffer); an
    empty tensor (an empty shard) gives 0."""
    return torch.stack([_max_abs(t.reshape(-1)) for t in ordered])


def _nonzero_rows(ordered: Sequence[torch.Tensor]) -> torch.Tensor:
    """The non-zero count of each tensor (float64 vector; NaN counts as non-zero)."""
    return torch.stack([torch.count_nonzero(t) for t in ordered]).to(_F64)


def _max_abs(flat: torch.Tensor) -> torch.Tensor:
    """max |t| (float64 scalar): one ``aminmax`` of a real tensor (no |t| buffer); a complex
    tensor's moduli, through one temporary; 0 for an empty tensor."""
    if flat.numel() == 0:
        return torch.zeros((), dtype=_F64, device=flat.device)
    if flat.is_complex():
        return flat.abs().amax().to(_F64)
    lo, hi = torch.aminmax(flat)
    return torch.maximum(hi.abs(), lo.abs()).to(_F64)


# ---------------------------------------------------------------- the full statistics
@dataclass(frozen=True)
class FullStat:
    """One statistic of full steps: one row of a step's matrix, one ``ParamStats`` field.

    ``rows`` queues the raw value of each tensor of a list (a float64 vector; device work
    only, empty tensors included). ``combine`` says how the raw values of a tensor's shards on
    several ranks, and of a module's several calls in one step, add up: ``"max"`` or ``"sum"``.
    ``scales``: the raw value scales with the gradient (it is divided by a GradScaler's scale
    while the gradients are still scaled). ``finish`` turns the combined raw value and the
    tensor's element count into the figure reported under ``field``.
    """

    field: str
    rows: Callable[[Sequence[torch.Tensor]], torch.Tensor]
    combine: str
    scales: bool
    finish: Callable[[float, int], float]


def _as_is(raw: float, numel: int) -> float:
    return raw


def _per_element(raw: float, numel: int) -> float:
    return raw / numel


def _zero_fraction(nonzero: float, numel: int) -> float:
    return (numel - nonzero) / numel


#: The statistics of full steps, in row order. Adding one is one entry here (and its field,
#: ``float | None``, on ``log.ParamStats``, which ``tests/monitor/test_stat_table.py`` checks):
#: the measurement of dense, sparse and module gradients, the GradScaler's unscaling, the
#: shards' and calls' combination, the records, the JSON Lines and CSV logs follow this table.
FULL_STATS: tuple[FullStat, ...] = (
    FullStat("max_abs", _max_abs_rows, "max", True, _as_is),
    FullStat("mean_abs", _abs_sums, "sum", True, _per_element),
    FullStat("zero_frac", _nonzero_rows, "sum", False, _zero_fraction),
)
#: rows of a full-statistics matrix: the norm and one per ``FULL_STATS`` entry
FULL_ROWS = 1 + len(FULL_STATS)


def full_rows(tensors: Sequence[torch.Tensor], order: Sequence[int]) -> torch.Tensor:
    """``[len(FULL_STATS), n]`` float64: the raw full statistics of each tensor in ``order``
    (as returned by ``norms``): for the built-in ones, one ``aminmax``, one |g| sum through a
    scratch buffer and one ``count_nonzero`` per tensor."""
    ordered = [tensors[i] for i in order]
    return torch.stack([stat.rows(ordered) for stat in FULL_STATS])


def sparse_stats(grad: torch.Tensor, norm_type: float) -> torch.Tensor:
    """``[FULL_ROWS]`` float64: the norm and the raw full statistics of a sparse COO gradient,
    from its coalesced values (its implicit zeros are zeros; nothing is densified)."""
    values = grad.coalesce().values().reshape(-1)
    acc = torch.float32 if values.dtype in _HALF else None
    norm = torch.linalg.vector_norm(values, norm_type, dtype=acc).to(_F64)
    return torch.cat([norm[None], *(stat.rows([values]) for stat in FULL_STATS)])


def _wide(t: torch.Tensor) -> torch.dtype:
    return torch.complex128 if t.is_complex() else _F64


def nonfinite_counts(tensors: Sequence[torch.Tensor], norm_type: float) -> torch.Tensor:
    """``[3, n]`` float64: NaN count, Inf count and the norm computed in float64, scaled by
    the largest |g| before the powers (finite and exact when the working dtype's norm only
    overflowed or underflowed: float64 gradients of 1e300 or 1e-300 too), for the few tensors
    of a step whose norm is not finite or tiny."""
    rows = []
    for t in tensors:
        v = t.coalesce().values() if t.is_sparse else t
        rows.append(
            torch.stack(
                [
                    torch.isnan(v).sum().to(_F64),
                    torch.isinf(v).sum().to(_F64),
                    _scaled_norm(v, norm_type),
                ]
            )
        )
    return torch.stack(rows, dim=1)


def _scaled_norm(v: torch.Tensor, norm_type: float) -> torch.Tensor:
    """``top * ||v / top||`` in float64 (complex128), ``top`` = max |v|: no power of an
    element overflows or underflows. The plain norm when ``top`` is 0 or not finite."""
    wide = v.to(_wide(v)).reshape(-1)
    if wide.numel() == 0:
        return torch.zeros((), dtype=_F64, device=v.device)
    top = wide.abs().amax()
    safe = torch.where(torch.isfinite(top) & (top > 0), top, torch.ones_like(top))
    return (torch.linalg.vector_norm(wide / safe, norm_type) * safe).to(_F64)


# ---------------------------------------------------------------- update-to-weight ratios
def _lattice(numel: int, last: int, k: int, seed: int) -> tuple[int, int, int]:
    """(offset, stride, count) of a lattice sample of ``k`` of ``numel`` elements."""
    if numel <= k:
        return 0, 1, numel
    stride = numel // k
    while stride > 1 and math.gcd(stride, last) != 1:
        stride -= 1
    span = stride * (k - 1) + 1
    offset = seed % (numel - span + 1)
    return offset, stride, k


def sample_size(numels: Sequence[int], k: int) -> int:
    """The per-tensor sample size: ``k``, lowered until the whole sample, sum(min(numel, k)),
    is at most SAMPLE_FRACTION of all the elements (or SAMPLE_FLOOR elements, so a small model
    is sampled whole)."""
    budget = max(SAMPLE_FLOOR, int(SAMPLE_FRACTION * sum(numels)))
    if sum(min(n, k) for n in numels) <= budget:
        return k
    lo, hi = 1, k  # the largest size that fits the budget
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if sum(min(n, mid) for n in numels) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def sample_views(
    params: Sequence[torch.Tensor], k: int, seeds: Sequence[int]
) -> list[torch.Tensor]:
    """1-D strided views of each parameter's sampled elements (no copy)."""
    out = []
    for p, seed in zip(params, seeds, strict=True):
        t = local(p).detach()
        flat = t.view(-1) if t.is_contiguous() else t.reshape(-1)
        last = t.shape[-1] if t.dim() else 1
        offset, stride, count = _lattice(flat.numel(), last, k, seed)
        step = flat.stride(0)
        out.append(
            flat.as_strided((count,), (stride * step,), flat.storage_offset() + offset * step)
        )
    return out


class UpdateSample:
    """The sampled weights of one optimizer step, copied before it (``take``) and compared with
    the weights after it (``rows``)."""

    def __init__(self, params: Sequence[torch.Tensor], k: int, seeds: Sequence[int]) -> None:
        self.params = list(params)
        self.k = k
        self.seeds = list(seeds)
        views = sample_views(self.params, k, self.seeds)
        self.old = [torch.empty_like(v) for v in views]
        torch._foreach_copy_(self.old, views)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.old)

    def rows(self, order: Sequence[int] | None = None) -> torch.Tensor:
        """``[2, n]`` float64: norm of the sampled change and of the sampled old weights."""
        new = sample_views(self.params, self.k, self.seeds)
        wgt, _ = norms(self.old, 2.0)
        torch._foreach_sub_(self.old, new)  # old - new, in place: no second sample-sized buffer
        upd, _ = norms(self.old, 2.0)
        out = torch.stack([upd.to(_F64), wgt.to(_F64)])
        return out if order is None else out[:, list(order)]


# ---------------------------------------------------------------- module gradient outputs
def module_row(grad: torch.Tensor, norm_type: float) -> torch.Tensor:
    """``[MODULE_ROW]`` float64 statistics of one module output's gradient: the norm, the raw
    ``FULL_STATS``, the NaN count, the Inf count and numel (combined over the calls of a step
    by ``combine_calls``)."""
    g = grad.detach()
    acc = torch.float32 if g.dtype in _HALF else None
    flat = g.reshape(-1)
    return torch.cat(
        [
            torch.linalg.vector_norm(flat, norm_type, dtype=acc).to(_F64)[None],
            *(stat.rows([flat]) for stat in FULL_STATS),
            torch.stack(
                [
                    torch.isnan(flat).sum().to(_F64),
                    torch.isinf(flat).sum().to(_F64),
                    torch.full((), flat.numel(), dtype=_F64, device=flat.device),
                ]
            ),
        ]
    )


MODULE_ROW = FULL_ROWS + 3


# ---------------------------------------------------------------- host-side arithmetic
def pnorm(values: Sequence[float], norm_type: float) -> float:
    """The p-norm of a list of norms (how get_total_norm combines per-tensor norms, and how
    the norms of a tensor's shards combine); NaN if any is NaN."""
    if any(v != v for v in values):
        return math.nan
    if not values:
        return 0.0
    if math.isinf(norm_type):
        return max(values)
    if norm_type == 1:
        return math.fsum(values)
    top = max(values)
    if top == 0 or top == math.inf:
        return top
    if not 1e-150 < top < 1e150:  # scaled: no square (power) overflows or underflows
        return top * math.fsum((v / top) ** norm_type for v in values) ** (1.0 / norm_type)
    if norm_type == 2:
        return math.sqrt(math.fsum(v * v for v in values))
    return math.fsum(v**norm_type for v in values) ** (1.0 / norm_type)


def combine_calls(calls: Sequence[Sequence[float]], norm_type: float) -> list[float]:
    """Combine the ``module_row``s of the calls of one module in one step."""
    if len(calls) == 1:
        return list(calls[0])
    cols = list(zip(*calls))
    return [
        pnorm(cols[0], norm_type),
        *[_combine(stat.combine, c) for stat, c in zip(FULL_STATS, cols[1:FULL_ROWS])],
        *[math.fsum(c) for c in cols[FULL_ROWS:]],  # NaN, Inf, numel
    ]


def _combine(kind: str, values: Sequence[float]) -> float:
    return max(values, key=nan_first) if kind == "max" else math.fsum(values)


def unscale(rows: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """``rows`` (a step's matrix, or a ``module_row``: the norm, then the ``FULL_STATS``, then
    anything else, along dim 0) of gradients still scaled by a GradScaler, unscaled: the norm
    and the statistics that ``scales`` are multiplied by ``inv`` (1 / the scale); the rest
    (counts) stay. Float64; no host sync."""
    out = rows.to(torch.float64)
    scaled = [NORM] + [1 + k for k, stat in enumerate(FULL_STATS) if stat.scales]
    factor = torch.ones(out.shape[0], dtype=out.dtype, device=out.device)
    factor[[i for i in scaled if i < out.shape[0]]] = inv.to(out.device, out.dtype)
    return out * (factor if out.dim() == 1 else factor[:, None])


def row_kinds(full: bool) -> list[str]:
    """How each row of a step's matrix combines over shards (``combine_shards``): the norm, then
    the ``FULL_STATS`` on a full step."""
    return ["norm"] + ([stat.combine for stat in FULL_STATS] if full else [])


def finish(raw: Sequence[float], numel: int) -> dict[str, float]:
    """The ``FULL_STATS`` figures by field from their combined raw values (``FULL_STATS``
    order) and the tensor's element count."""
    return {stat.field: stat.finish(v, numel) for stat, v in zip(FULL_STATS, raw, strict=True)}


def combine_shards(
    per_rank: Sequence[Sequence[Sequence[float]]], kinds: Sequence[str], norm_type: float
) -> list[list[float]]:
    """The rows of whole tensors from the same rows of their shards on every rank.

    ``per_rank[r][i]``: row ``i`` on rank ``r``; ``kinds[i]`` says how that row combines:
    ``"norm"`` (the p-norm of the shards' norms), ``"norm2"`` (the same with p = 2), ``"max"``
    or ``"sum"``."""
    out = []
    for i, kind in enumerate(kinds):
        cols = list(zip(*(rank[i] for rank in per_rank)))
        if kind == "norm":
            out.append([pnorm(c, norm_type) for c in cols])
        elif kind == "norm2":
            out.append([pnorm(c, 2.0) for c in cols])
        else:
            out.append([_combine(kind, c) for c in cols])
    return out


def nan_first(v: float) -> float:
    """The key of a ``max`` that NaN wins."""
    return math.inf if v != v else v
