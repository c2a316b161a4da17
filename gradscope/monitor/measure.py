"""One measurement of the watched gradients, and the step's one transfer to the host.

``measure`` queues a step's statistics on the device (no host sync) as a ``Measure``;
``Packet`` gathers what a logged step moves to the host, each part under a field name of
``PACKET_FIELDS``, and unpacks it by the same names after ONE ``.tolist()``; ``recheck``
is the second, rare transfer: exact NaN/Inf counts and float64 norms of the few columns whose
norm in the working dtype is not finite or may have underflowed.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

import torch

# the kernels' module itself, not names from it: what is set on it (a patched kernel) is seen
import gradscope.monitor.stats as S

from .._torch import torchcompat
from .._torch.torchcompat import is_dtensor
from .distributed import Sharding

#: what one logged step moves to the host, in this order (each optional): the statistics
#: matrix ("table": rows x parameters, or ranks x rows x parameters when shards are gathered),
#: the ranks' replication checksums, the probe measured at optimizer.step(), the module rows,
#: the activation flags, the update rows an earlier step left on the device
PACKET_FIELDS = ("table", "checksums", "probe", "modules", "flags", "previous", "loss")


class Packet:
    """The device tensors of one logged step, by field name; ``to_host`` moves them in one
    transfer and gives each back under its name, as nested lists of its declared shape."""

    __slots__ = ("parts",)

    def __init__(self) -> None:
        self.parts: dict[str, tuple[torch.Tensor, tuple[int, ...]]] = {}

    def put(self, field: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
        if field not in PACKET_FIELDS:
            raise KeyError(f"{field!r} is not a packet field ({', '.join(PACKET_FIELDS)})")
        self.parts[field] = (tensor, shape)

    def to_host(self) -> dict[str, Any]:
        present = [(f, self.parts[f]) for f in PACKET_FIELDS if f in self.parts]
        flat = [t.reshape(-1) for _, (t, _) in present]
        if len(flat) == 1:
            packed = flat[0].to(torch.float64)
        else:
            device = flat[0].device
            packed = torch.cat([t.to(device=device, dtype=torch.float64) for t in flat])
        values = packed.tolist()  # the one device-to-host transfer of this step
        out: dict[str, Any] = {}
        pos = 0
        for field, (_, shape) in present:
            n = math.prod(shape)
            out[field] = nest(values[pos : pos + n], shape)
            pos += n
        return out


def nest(values: list[float], shape: tuple[int, ...]) -> Any:
    """A flat list as nested lists of ``shape`` (row-major)."""
    if len(shape) <= 1:
        return values
    inner = math.prod(shape[1:])
    return [nest(values[k * inner : (k + 1) * inner], shape[1:]) for k in range(shape[0])]


class Measure:
    """The device-side figures of one measurement, waiting for the step's one transfer."""

    __slots__ = ("matrix", "cols", "grads", "versions", "at", "full", "inv")

    def __init__(
        self,
        matrix: torch.Tensor,
        cols: list[int],
        grads: list[torch.Tensor],
        at: str,
        full: bool,
        inv: torch.Tensor | None = None,
        local: bool = True,
    ) -> None:
        self.inv = inv  # 1 / the GradScaler's scale, when the gradients were still scaled
        self.matrix = matrix  # [rows, len(cols)]: NORM (+ the FULL_STATS rows)
        self.cols = cols  # column j: parameter index cols[j]
        self.grads = grads  # the gradient tensors measured (column order)
        # ``local``: some may be DTensors, whose local shard holds the version
        self.versions = torchcompat.tensor_versions(
            [S.local(g) for g in grads] if local else grads
        )
        self.at = at
        self.full = full


class Layout:
    """What a measurement can know once per set of watched parameters: whether the fast path
    applies (no DTensor, no empty tensor) and the (device, dtype) groups of their gradients. A
    gradient has its parameter's device and dtype (autograd refuses any other), so the groups
    are the parameters'; a gradient that is sparse, or missing, sends a step down the general
    path."""

    __slots__ = ("dense", "groups")

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        self.dense = bool(params) and not any(p.numel() == 0 or is_dtensor(p) for p in params)
        groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
        for i, p in enumerate(params):
            groups.setdefault((p.device, p.dtype), []).append(i)
        self.groups = list(groups.values())


_grad_of = operator.attrgetter("grad")
_layout_of = operator.attrgetter("layout")
_STRIDED = {torch.strided}


def _measure_dense(
    params: Sequence[torch.Tensor], layout: Layout, norm_type: float, at: str, full: bool,
    inv: torch.Tensor | None,
) -> Measure | None:
    """``measure`` without Python work per parameter beyond reading its ``.grad``: every
    watched parameter has a dense gradient (else None: the general path)."""
    grads = list(map(_grad_of, params))
    if any(map(operator.is_, grads, repeat(None))):
        return None
    if set(map(_layout_of, grads)) != _STRIDED:  # a sparse gradient (some torch reduces
        return None  # one in _foreach_norm, but nothing after it does)
    try:
        norms, order = S.norms(grads, norm_type, layout.groups)
    except (NotImplementedError, RuntimeError):  # no foreach kernel for these tensors
        return None
    if len(layout.groups) > 1:
        grads = [grads[o] for o in order]
        order = list(order)
    matrix = norms[None]
    if full:
        matrix = torch.cat([norms.to(torch.float64)[None],
                            S.full_rows(grads, range(len(grads)))])
    if inv is not None:
        matrix = S.unscale(matrix, inv)
    return Measure(matrix, list(order), grads, at, full, inv, local=False)


def measure(
    params: Sequence[torch.Tensor],
    norm_type: float,
    at: str,
    full: bool,
    inv: torch.Tensor | None,
    device: torch.device,
    layout: Layout | None = None,
) -> Measure:
    """Queue the statistics of ``params``' gradients on the device (no host sync). Call it
    under inference mode. Parameters without a gradient (or without elements) get no column;
    ``device`` holds the empty matrix when none has one."""
    if layout is not None and layout.dense:
        fast = _measure_dense(params, layout, norm_type, at, full, inv)
        if fast is not None:
            return fast
    cols: list[int] = []
    grads: list[torch.Tensor] = []
    tensors: list[torch.Tensor] = []
    sparse: list[int] = []
    for i, p in enumerate(params):
        g = p.grad
        if g is None or (p.numel() == 0):
            continue
        t = S.local(g).detach()
        if t.is_sparse:
            sparse.append(len(cols))
        cols.append(i)
        grads.append(g)
        tensors.append(t)
    if not cols:
        empty = torch.zeros(S.FULL_ROWS if full else 1, 0, dtype=torch.float64, device=device)
        return Measure(empty, [], [], at, full)
    if sparse:
        matrix = _with_sparse(tensors, sparse, full, norm_type)
    else:
        norms, order = S.norms(tensors, norm_type)
        if not isinstance(order, range) and order != list(range(len(order))):
            cols = [cols[o] for o in order]
            grads = [grads[o] for o in order]
        if full:
            matrix = torch.cat([norms.to(torch.float64)[None], S.full_rows(tensors, order)])
        else:
            matrix = norms[None]
    if inv is not None:
        matrix = S.unscale(matrix, inv)
    return Measure(matrix, cols, grads, at, full, inv)


def _with_sparse(
    tensors: list[torch.Tensor], sparse: list[int], full: bool, norm_type: float
) -> torch.Tensor:
    dense = [i for i in range(len(tensors)) if i not in set(sparse)]
    columns: list[torch.Tensor | None] = [None] * len(tensors)
    if dense:
        part = [tensors[i] for i in dense]
        norms, order = S.norms(part, norm_type)
        rows = [norms.to(torch.float64)[None]]
        if full:
            rows.append(S.full_rows(part, order))
        block = torch.cat(rows)
        for j, o in enumerate(order):
            columns[dense[o]] = block[:, j]
    for i in sparse:
        columns[i] = S.sparse_stats(tensors[i], norm_type)[: S.FULL_ROWS if full else 1]
    return torch.stack(columns, dim=1)  # type: ignore[arg-type]


def inverse_scale(scaler: Any, optimizer: Any) -> torch.Tensor | None:
    """1 / the GradScaler's scale (a device tensor) while the gradients are still scaled
    (before ``scaler.unscale_`` or ``scaler.step``); None otherwise."""
    if scaler is None:
        return None
    scale = torchcompat.grad_scaler_scale(scaler)
    if scale is None:
        return None
    if optimizer is not None and torchcompat.grad_scaler_unscaled(scaler, optimizer):
        return None  # already unscaled
    return scale.to(torch.float64).reciprocal()


_WIDE = (torch.float64, torch.complex128)

#: (nan count, inf count, norm in float64), or (None, None, norm) when not countable
Recount = tuple[int | None, int | None, float]


def recheck(
    m: Measure,
    params: Sequence[torch.Tensor],
    norms: list[float],
    norm_type: float,
    sharding: Sharding | None,
    gather: Callable[[torch.Tensor, Any], torch.Tensor],
    suspect: list[int] | None = None,
) -> dict[int, Recount]:
    """Exact NaN/Inf counts and the float64 norm of the columns whose norm is not finite or so
    small that it may have underflowed in the working dtype (a second transfer, on such steps
    only): column -> (nan, inf, norm in float64). ``suspect``: with ``sharding``, those
    columns as every rank's own norms say (``transfer.suspects``): the same on all ranks."""
    isfinite = math.isfinite
    tiny32 = S.underflow_bound(norm_type)
    tiny64 = S.underflow_bound(norm_type, torch.float64)
    if suspect is not None:
        bad = suspect
    elif not norms or (isfinite(math.fsum(norms)) and min(norms) >= tiny32):
        return {}  # the usual step, at C speed: every norm finite and none near underflow
    else:
        bad = [
            j
            for j, v in enumerate(norms)
            if not isfinite(v)
            or v < (tiny64 if S.local(m.grads[j]).dtype in _WIDE else tiny32)
        ]
    if not bad:
        return {}
    tensors = [S.local(m.grads[j]).detach() for j in bad]
    changed = [
        params[m.cols[j]].grad is not m.grads[j]
        or torchcompat.tensor_version(S.local(m.grads[j])) != m.versions[j]
        for j in bad
    ]
    with torchcompat.inference_mode(True):
        counts = S.nonfinite_counts(tensors, norm_type)
        if m.inv is not None:  # the float64 norms of scaled gradients
            counts = torch.cat([counts[:2], counts[2:] * m.inv.to(counts)])
        if sharding is not None:
            counts = gather(counts, sharding.group)
        flat = counts.reshape(-1).tolist()
    if sharding is not None:
        per_rank = nest(flat, (sharding.world, 3, len(bad)))
        values = sharding.combine(per_rank, ["sum", "sum", "norm"], norm_type,
                                  [m.cols[j] for j in bad])
    else:
        values = nest(flat, (3, len(bad)))
    out: dict[int, Recount] = {}
    for k, j in enumerate(bad):
        if not changed[k]:
            out[j] = (int(values[0][k]), int(values[1][k]), values[2][k])
        elif isfinite(norms[j]):  # a finite norm in the working dtype proved it finite
            out[j] = (0, 0, norms[j])
        elif _overflowed(norms[j], values[0][k], values[1][k], values[2][k], norm_type):
            out[j] = (0, 0, values[2][k])
        else:
            out[j] = (None, None, norms[j])
    return out


#: a float32 p-norm (float32 and half gradients are reduced in float32) overflows above this
_F32_MAX = torch.finfo(torch.float32).max


def _overflowed(norm: float, nan: float, inf: float, norm64: float, norm_type: float) -> bool:
    """Whether an infinite norm of a gradient changed in place since (``grad.mul_(1.0)``, a
    hand-written unscale by 1) is the overflow of finite values, as the gradient is now:
    finite, and so large that the sum of its |g|^p overflows float32 too (1.8e19 for p = 2).
    An in-place op does not turn an infinity into a finite value that large (clipping, the
    usual change, makes it NaN or leaves it infinite, and shrinks finite ones), so the figure
    is the gradient's as it is now; otherwise it stays not countable."""
    if not math.isinf(norm) or nan or inf or not math.isfinite(norm64) or norm_type <= 0:
        return False
    if math.isinf(norm_type):
        return False  # the max of finite values does not overflow
    return norm64 >= 0.99 * _F32_MAX ** (1.0 / norm_type)
