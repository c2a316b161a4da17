"""The monitor across processes: DTensor sharding, the all-gathers, the replication check.

* DTensor parameters (FSDP2 ``fully_shard``, tensor parallel, both on a 2-D mesh, plain
  parameters beside them): each rank measures its shards; one all-gather over the world per
  logged step carries them, and each parameter is made whole from the ranks that hold its
  elements once (``Sharding``).
* other parameters: whether the ranks' gradients are identical is detected from a checksum of
  the per-parameter norms (``checksum``, ``replicated``), or declared with ``replicated=``.

``Topology`` owns what a monitor knows of the processes: the sharding, the replication
(declared or detected), the one-off data-parallel probe, the point where a step's gradients are
measured and the description; its all-gather is injectable (``Topology(gather=...)``, default
the module's ``_gather_into``, read when the topology is made).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed

from .._torch.torchcompat import is_dtensor
from ..errors import MonitorWarning, UnsupportedSetupError
from .stats import combine_shards, nan_first

_DIST_AVAILABLE = torch.distributed.is_available()

# all_gather_single is the name of the one-tensor all-gather from torch 2.13 on, where
# all_gather_into_tensor warns that it is deprecated. A ``Topology`` takes it when it is made
# (or the ``gather=`` it is given): that is where a caller counts or replaces the monitor's
# collectives.
_gather_into: Callable[..., Any] | None = getattr(
    torch.distributed, "all_gather_single", None
) or getattr(torch.distributed, "all_gather_into_tensor", None)


def initialised() -> bool:
    """Whether ``torch.distributed`` is initialised in this process."""
    return _DIST_AVAILABLE and torch.distributed.is_initialized()


def world_size() -> int:
    return torch.distributed.get_world_size()


def this_rank() -> int:
    return torch.distributed.get_rank()


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (plain, picklable data), in rank order: one collective over the
    world (made only on a step every rank agrees is bad)."""
    out: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def all_gather(t: torch.Tensor, group: Any, gather: Callable[..., Any]) -> torch.Tensor:
    """Every rank's ``t`` (flattened), concatenated in rank order: one collective."""
    world = torch.distributed.get_world_size(group)
    flat = t.reshape(-1).contiguous()
    out = torch.empty(world * flat.numel(), dtype=flat.dtype, device=flat.device)
    gather(out, flat, group=group)
    return out


def _shard_like(placement: Any) -> bool:
    """A placement whose ranks hold different elements (``Shard``, and the ``_StridedShard``
    FSDP2 gives a tensor-parallel weight on a 2-D mesh)."""
    return bool(placement.is_shard()) or "Shard" in type(placement).__name__


class Sharding:
    """How the watched parameters are held across the ranks: per parameter, its replicas, each
    the ranks (global ranks: indices into an all-gather over the default group) whose shards
    hold each of its elements exactly once. A DTensor's sharded mesh dimensions make a
    replica's shards, its replicated ones the replicas; a plain tensor is one replica per rank.
    Any mesh, any number of dimensions, DTensors on several meshes and plain tensors beside
    them (tensor parallel with a LayerNorm left out of the plan, FSDP2 x TP on a 2-D mesh).
    One all-gather of the step's table over the world carries every rank's rows; ``combine``
    makes each parameter whole from one replica's shards, and takes the largest figure of its
    replicas (NaN first): replicas that agree give their figure, and one that went bad is seen
    on every rank."""

    def __init__(self, names: Sequence[str], params: Sequence[torch.Tensor]) -> None:
        self.group = None  # the world
        self.world = torch.distributed.get_world_size()
        everyone = tuple((r,) for r in range(self.world))
        self.layout: list[tuple[tuple[int, ...], ...]] = []
        for name, p in zip(names, params, strict=True):
            if not is_dtensor(p):
                self.layout.append(everyone)
                continue
            grid = p.device_mesh.mesh  # type: ignore[attr-defined]
            shard, rep = [], []
            for dim, placement in enumerate(p.placements):  # type: ignore[attr-defined]
                if _shard_like(placement):
                    shard.append(dim)
                elif placement.is_replicate():
                    rep.append(dim)
                else:
                    raise UnsupportedSetupError(
                        f"parameter {name} has a {placement} placement; GradMonitor combines "
                        "sharded and replicated DTensors (make the parameter Shard or "
                        "Replicate, or leave it out with params=...)"
                    )
            n_shards = math.prod(grid.shape[d] for d in shard)
            ranks = grid.permute(*rep, *shard).reshape(-1, n_shards).tolist()
            self.layout.append(tuple(tuple(int(r) for r in row) for row in ranks))
        self.sharded = [len(replicas[0]) > 1 for replicas in self.layout]
        self.plain = [i for i, p in enumerate(params) if not is_dtensor(p)]
        self.names = list(names)
        self.warned = False

    def differing(self, norms: Sequence[Sequence[float]], cols: Sequence[int]) -> list[str]:
        """The plain parameters whose norms differ between the ranks (``norms[r][j]``: rank
        ``r``'s norm of column ``j``): not replicas (expert parallel, or a bug), so their
        figures are the largest rank's. Replicated gradients are bitwise equal (an all-reduce
        gives every rank the same bits)."""
        if not self.plain:
            return []
        plain = set(self.plain)
        out = []
        for j, c in enumerate(cols):
            if c in plain:
                values = [row[j] for row in norms]
                # a non-finite norm on some rank is an incident, not a sign of other tensors
                if all(map(math.isfinite, values)) and min(values) != max(values):
                    out.append(self.names[c])
        return out

    def warn_differing(self, names: Sequence[str]) -> None:
        """Say once that the plain parameters ``names`` differ between the ranks."""
        if names and not self.warned:
            self.warned = True
            warnings.warn(
                f"GradMonitor: the plain (non-DTensor) parameters {', '.join(names[:3])}"
                f"{' and more' if len(names) > 3 else ''} have different gradients on different "
                "ranks, so they are not replicas (expert parallel?); their figures are the "
                "largest rank's. Monitor them with their own GradMonitor (params=...) to see "
                "each rank's",
                MonitorWarning,
                stacklevel=2,
            )

    def combine(
        self,
        per_rank: Sequence[Sequence[Sequence[float]]],
        kinds: Sequence[str],
        norm_type: float,
        cols: Sequence[int],
    ) -> list[list[float]]:
        """The rows of whole tensors from every rank's rows (``per_rank[r][i][j]``: row ``i``,
        column ``j`` on rank ``r``; column ``j`` is parameter ``cols[j]``); ``kinds[i]`` says
        how row ``i`` combines over shards (``stats.combine_shards``)."""
        groups: dict[tuple[tuple[int, ...], ...], list[int]] = {}
        for j, c in enumerate(cols):
            groups.setdefault(self.layout[c], []).append(j)
        if len(groups) == 1:  # every column held alike (FSDP2 alone): no regrouping
            ((replicas, _),) = groups.items()
            if len(replicas) == 1:
                return combine_shards([per_rank[r] for r in replicas[0]], kinds, norm_type)
        out = [[0.0] * len(cols) for _ in kinds]
        rows = range(len(kinds))
        for replicas, js in groups.items():
            wholes = [
                combine_shards([[[per_rank[r][i][j] for j in js] for i in rows] for r in shards],
                               kinds, norm_type)
                for shards in replicas
            ]
            for i in rows:
                for k, j in enumerate(js):
                    out[i][j] = max((w[i][k] for w in wholes), key=nan_first)
        return out


def sharding_of(
    chosen: Sequence[tuple[str, torch.Tensor]], replicated: bool | None
) -> tuple[Sharding | None, bool | None]:
    """The sharding of the watched parameters (None unless some are sharded DTensors), and
    ``replicated`` (True when they are DTensors replicated on every rank)."""
    flags = [is_dtensor(p) for _, p in chosen]
    if not any(flags):
        return None, replicated
    if not initialised():
        raise UnsupportedSetupError(
            "the parameters are DTensors but torch.distributed is not initialised; build "
            "the GradMonitor after init_process_group and fully_shard"
        )
    sharding = Sharding([n for n, _ in chosen], [p for _, p in chosen])
    if all(flags) and not any(sharding.sharded):
        # replicated DTensors: every rank holds all of every tensor
        return None, True if replicated is None else replicated
    return sharding, replicated


_CHECK_WEIGHTS: dict[tuple[int, torch.device], torch.Tensor] = {}


def checksum(norms: torch.Tensor) -> torch.Tensor:
    """Three numbers that are equal on two ranks (bitwise) only if their per-parameter norms are:
    the count, the sum and a weighted sum of the norms."""
    n = norms.numel()
    key = (n, norms.device)
    w = _CHECK_WEIGHTS.get(key)
    if w is None:
        w = torch.arange(1, n + 1, dtype=torch.float64, device=norms.device).mul_(0.6180339887)
        w = _CHECK_WEIGHTS[key] = w.frac_().add_(0.5)
    v = norms.to(torch.float64)
    return torch.stack([torch.full_like(v[:1].sum(), n), v.sum(), (v * w).sum()])


def same_on_all_ranks(checksums: list[list[float]], at: int) -> bool:
    """Whether the checksum at offset ``at`` of each rank's row is the same on every rank (NaN
    equals NaN)."""
    first = checksums[0][at : at + 3]
    for row in checksums[1:]:
        for a, b in zip(first, row[at : at + 3], strict=True):
            if a != b and not (a != a and b != b):
                return False
    return True


def describe(same: bool, how: str) -> str:
    """What the figures mean across the ranks (``MonitorLog.distributed``)."""
    world = torch.distributed.get_world_size()
    if same:
        return f"replicated across {world} ranks ({how}): figures are global"
    return (
        f"rank {torch.distributed.get_rank()} of {world}: the ranks' gradients differ "
        f"({how}), so these figures are this rank's own"
    )


class Topology:
    """What a monitor knows of the processes: the sharding of its parameters (``sharding``),
    whether the ranks hold the same gradients (``replicated``: declared, detected once, or
    None while unknown), whether that is ``declared``, the one-off probe at
    ``optimizer.step()`` (``probe_due``: are hand-all-reduced gradients identical only
    there?), where a step's gradients are measured (``point``), and ``description`` (what the
    figures mean across ranks, for the log). ``gather``: the one-tensor all-gather."""

    def __init__(
        self,
        chosen: Sequence[tuple[str, torch.Tensor]],
        replicated: bool | None,
        with_optimizer: bool,
        measure: str,
        gather: Callable[..., Any] | None = None,
    ) -> None:
        self.sharding, self.replicated = sharding_of(chosen, replicated)
        # declared (or DTensor) rather than detected: what the log's description says
        self.declared = replicated is not None
        # the step's gradients are measured when the last backward ends, or at the step
        self.point = measure if with_optimizer else "backward"
        self.probe_due = with_optimizer and measure == "backward"
        self.description: str | None = None
        self._gather = gather or _gather_into

    def gather(self, t: torch.Tensor, group: Any) -> torch.Tensor:
        """Every rank's ``t`` over ``group`` (None: the world), flattened, in rank order."""
        if self._gather is None:
            raise UnsupportedSetupError("torch.distributed has no one-tensor all-gather")
        return all_gather(t, group, self._gather)

    def needs_check(self) -> bool:
        """Whether the ranks' holding the same gradients is still to be detected."""
        return self.sharding is None and self.replicated is None

    def probe_now(self, closure: bool) -> bool:
        """Whether this step measures the probe at ``optimizer.step()`` as well."""
        return self.probe_due and not closure and initialised() and self.needs_check()

    def probed(self) -> None:
        """A logged step ended: only the first one is probed."""
        self.probe_due = False

    def measure_at_step(self) -> None:
        """The ranks all-reduce the gradients by hand after backward: from now on the step's
        gradients are the ones ``optimizer.step()`` is given."""
        self.point = "optimizer"

    def scope(self, same: bool) -> str:
        """The step's scope when the ranks hold the same gradients (``same``) or not."""
        how = "declared" if self.replicated is not None else "detected"
        self.description = describe(same, how)
        return "global" if same else f"rank {this_rank()}"

    def sharded_scope(self, world: int) -> str:
        self.description = f"sharded (DTensor): shards combined over {world} ranks"
        return "global"
