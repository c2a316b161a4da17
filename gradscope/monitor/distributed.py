"""The monitor across processes: DTensor sharding, the all-gathers, the replication check.

* DTensor parameters (FSDP2 ``fully_shard``): each rank measures its shards; one all-gather
  over the sharding mesh dimension per logged step combines them (``Sharding``).
* other parameters: whether the ranks' gradients are identical is detected from a checksum of
  the per-parameter norms (``checksum``, ``replicated``), or declared with ``replicated=``.

``Topology`` owns what a monitor knows of the processes: the sharding, the replication
(declared or detected), the one-off data-parallel probe, the point where a step's gradients are
measured and the description; its all-gather is injectable (``Topology(gather=...)``, default
the module's ``_gather_into``, read when the topology is made).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed

from ..errors import UnsupportedSetupError
from .checks import is_dtensor

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


def all_gather(t: torch.Tensor, group: Any, gather: Callable[..., Any]) -> torch.Tensor:
    """Every rank's ``t`` (flattened), concatenated in rank order: one collective."""
    world = torch.distributed.get_world_size(group)
    flat = t.reshape(-1).contiguous()
    out = torch.empty(world * flat.numel(), dtype=flat.dtype, device=flat.device)
    gather(out, flat, group=group)
    return out


class Sharding:
    """How DTensor parameters are sharded: the process group their shards are reduced over, and
    which of them are sharded on it (the others are replicated there)."""

    def __init__(self, names: Sequence[str], params: Sequence[torch.Tensor]) -> None:
        first = params[0]
        mesh = first.device_mesh  # type: ignore[attr-defined]
        shard_dims: set[int] = set()
        for name, p in zip(names, params, strict=True):
            if p.device_mesh != mesh:  # type: ignore[attr-defined]
                raise UnsupportedSetupError(
                    f"parameter {name} lives on another device mesh than {names[0]}; use one "
                    "GradMonitor per mesh, selecting its parameters with params=..."
                )
            for dim, placement in enumerate(p.placements):  # type: ignore[attr-defined]
                if placement.is_shard():
                    shard_dims.add(dim)
                elif not placement.is_replicate():
                    raise UnsupportedSetupError(
                        f"parameter {name} has a {placement} placement; GradMonitor reduces "
                        "Shard and Replicate DTensors only"
                    )
        if len(shard_dims) > 1:
            raise UnsupportedSetupError(
                f"the parameters are sharded over {len(shard_dims)} mesh dimensions; "
                "GradMonitor reduces shards over one (FSDP2, HSDP); monitor a 1-D sub-mesh"
            )
        self.dim = next(iter(shard_dims), None)
        self.group = mesh.get_group(self.dim) if self.dim is not None else None
        self.sharded = [
            self.dim is not None and p.placements[self.dim].is_shard()  # type: ignore[attr-defined]
            for p in params
        ]
        self.world = torch.distributed.get_world_size(self.group) if self.group else 1


def sharding_of(
    chosen: Sequence[tuple[str, torch.Tensor]], replicated: bool | None
) -> tuple[Sharding | None, bool | None]:
    """The sharding of the watched parameters (None unless they are sharded DTensors), and
    ``replicated`` (True when they are DTensors replicated on every rank)."""
    flags = [is_dtensor(p) for _, p in chosen]
    if not any(flags):
        return None, replicated
    if not all(flags):
        plain = next(n for (n, _), f in zip(chosen, flags, strict=True) if not f)
        raise UnsupportedSetupError(
            f"some watched parameters are DTensors and some (such as {plain}) are not; "
            "monitor the sharded and the plain ones with two GradMonitors (params=...)"
        )
    if not initialised():
        raise UnsupportedSetupError(
            "the parameters are DTensors but torch.distributed is not initialised; build "
            "the GradMonitor after init_process_group and fully_shard"
        )
    sharding = Sharding([n for n, _ in chosen], [p for _, p in chosen])
    if sharding.dim is None:  # replicated DTensors: every rank holds all of every tensor
        return None, True if replicated is None else replicated
    return sharding, replicated


def combine_replicated(
    whole: list[list[float]],
    per_rank: list[list[list[float]]],
    sharded: Sequence[bool],
    cols: Sequence[int],
) -> list[list[float]]:
    """``whole`` (the shards' rows combined) with the columns of parameters that are
    replicated on the sharding dimension taken from one rank (every rank holds all of them)."""
    if all(sharded[c] for c in cols):
        return whole
    for i, row in enumerate(whole):
        for j, c in enumerate(cols):
            if not sharded[c]:
                row[j] = per_rank[0][i][j]
    return whole


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
