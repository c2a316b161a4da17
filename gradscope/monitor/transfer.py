"""The end of a logged step: reduce across ranks, ONE transfer to the host, one ``StepStats``.

``transfer`` packs into one ``Packet`` what a logged step moves to the host: the statistics
table (all-gathered over the world for DTensor parameters, made whole per parameter), the ranks'
replication checksums and the probe measured at ``optimizer.step()`` (while whether the ranks
hold the same gradients is still being detected), the module rows, the activation flags, and
the update rows an earlier step left on the device (``Deferred``). After the one ``.tolist()``
it combines the shards and decides the scope ("global" or "rank N"): a ``HostStep``, whose
``finite()`` is what the incident watch decides a replay by (no second read).

``finish`` turns a ``HostStep`` into the ``StepStats``: it rechecks the rare non-finite
columns exactly (``measure.recheck``) and names the columns from the ``WatchedParams``
snapshot the step was measured with. Neither sees the monitor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from .distributed import (
    Topology,
    checksum,
    initialised,
    same_on_all_ranks,
)
from .distributed import world_size as _world_size
from .log import StepStats
from .measure import (
    Measure,
    Packet,
    nest,
    recheck,
)
from .records import module_stats, param_stats, update_ratios
from .stats import (
    MODULE_ROW,
    NORM,
    local,
    pnorm,
    row_kinds,
    underflow_bound,
)
from .watched import WatchedParams


class Deferred:
    """The update rows of a full-statistics step whose transfer came before its
    ``optimizer.step()`` (the incident watch needed the norms then): left on the device and
    moved with the next transfer. ``rows``: ``[2, n]`` (or all ranks' rows, flattened)."""

    __slots__ = ("step", "rows", "cols", "names", "world", "sharding")

    def __init__(
        self, step: int, rows: torch.Tensor, m: Measure, watched: WatchedParams,
        topology: Topology,
    ) -> None:
        sharding = topology.sharding if initialised() else None
        self.step = step
        self.cols = list(m.cols)
        self.names = watched.names
        self.world = sharding.world if sharding is not None else None
        self.sharding = sharding
        self.rows = topology.gather(rows, sharding.group) if sharding is not None else rows

    def shape(self) -> tuple[int, ...]:
        n = len(self.cols)
        return (self.world, 2, n) if self.world is not None else (2, n)

    def ratios(self, host: list[Any]) -> dict[str, float]:
        """The update ratios by parameter name, from this step's rows on the host."""
        rows = host
        if self.sharding is not None:
            rows = self.sharding.combine(host, ["norm2", "norm2"], 2.0, self.cols)
        return update_ratios(self.names, self.cols, rows)

    def to_host(self) -> dict[str, float]:
        """Its own transfer (at ``remove()`` or when the log is read before the next step)."""
        flat = self.rows.to(torch.float64).reshape(-1).tolist()
        return self.ratios(nest(flat, self.shape()))


class HostStep:
    """One logged step on the host: the measurement it counts, its table (rows x columns, the
    shards combined), the scope, the module rows by module, the first non-finite activation's
    index, and the update ratios of a deferred earlier step."""

    __slots__ = ("m", "table", "with_update", "scope", "mods", "first_bad", "previous", "loss",
                 "suspect", "ranks", "agreed")

    def __init__(self, m: Measure, table: list[list[float]], with_update: bool) -> None:
        self.m = m
        self.table = table
        self.with_update = with_update
        self.scope: str | None = None
        self.mods: dict[int, list[list[float]]] = {}
        self.first_bad: int | None = None
        self.previous: tuple[int, dict[str, float]] | None = None
        self.loss: float | None = None
        #: sharded: the columns to recheck, from every rank's own norms (the same on all)
        self.suspect: list[int] | None = None
        #: under torch.distributed: every rank's evidence of where the step went bad
        self.ranks: list[RankEvidence] | None = None
        #: every rank holds these same figures (the shards combined, or the replicas'
        #: checksums equal): what each rank decides from them, every rank decides alike
        self.agreed = False

    def finite(self) -> bool:
        """Whether every measured gradient's norm is finite."""
        return all(map(math.isfinite, self.table[NORM]))


def transfer(
    m: Measure,
    *,
    topology: Topology,
    norm_type: float,
    update: torch.Tensor | None = None,
    probe: Measure | None = None,
    module_calls: Sequence[tuple[int, torch.Tensor]] = (),
    flags: Sequence[tuple[int, torch.Tensor]] = (),
    previous: Deferred | None = None,
    loss: torch.Tensor | None = None,
) -> HostStep:
    """Move one logged step to the host in ONE transfer (and at most two collectives: the
    shards' table, the replication checksums)."""
    dist_on = initialised()
    # a single process: nothing to combine (one rank is its own global)
    replicas = dist_on and _world_size() > 1
    probe = probe if replicas else None
    mine = m.matrix.to(torch.float64)
    if update is not None:
        mine = torch.cat([mine, update])
    sharding = topology.sharding if dist_on else None
    checking = replicas and topology.needs_check()
    rows, ncol = mine.shape
    packet = Packet()
    # every rank's own evidence of where the step went bad (its loss, its forward's first
    # non-finite module), carried by a collective the step makes anyway
    ev = evidence(loss, flags, mine.device) if sharding is not None or checking else None
    if sharding is not None:
        assert ev is not None
        cols = torch.zeros(rows, EVIDENCE, dtype=torch.float64, device=mine.device)
        cols[0] = ev
        gathered = topology.gather(torch.cat([mine, cols], dim=1), sharding.group)
        packet.put("table", gathered, (sharding.world, rows, ncol + EVIDENCE))
    else:
        packet.put("table", mine, (rows, ncol))
    if checking:
        assert ev is not None
        sums = [checksum(m.matrix[0])] + ([checksum(probe.matrix[0])] if probe else [])
        packet.put("checksums", topology.gather(torch.cat([*sums, ev]), None),
                   (_world_size(), 3 * len(sums) + EVIDENCE))
        if probe is not None:
            packet.put("probe", probe.matrix, (probe.matrix.shape[0], len(probe.cols)))
    if module_calls:
        stacked = torch.stack([c for _, c in module_calls])
        packet.put("modules", stacked, (len(module_calls), MODULE_ROW))
    if flags:
        packet.put("flags", torch.stack([local(f) for _, f in flags]), (len(flags),))
    if previous is not None:
        packet.put("previous", previous.rows, previous.shape())
    if loss is not None:  # the step's loss (observe_loss), in the same transfer
        packet.put("loss", loss, (1,))
    host = packet.to_host()

    kinds = row_kinds(m.full)
    kinds += ["norm2", "norm2"] if update is not None else []
    scope: str | None = None
    suspect: list[int] | None = None
    ranks: list[RankEvidence] | None = None
    same = False
    if sharding is not None:
        ranks = [RankEvidence.of(rank[0][ncol:]) for rank in host["table"]]
        host["table"] = [[row[:ncol] for row in rank] for rank in host["table"]]
        table = sharding.combine(host["table"], kinds, norm_type, m.cols)
        scope = topology.sharded_scope(sharding.world)
        own = [rank[NORM] for rank in host["table"]]
        suspect = suspects(own, norm_type)
        sharding.warn_differing(sharding.differing(own, m.cols))
    else:
        table = host["table"]
    if checking:
        ranks = [RankEvidence.of(row[-EVIDENCE:]) for row in host["checksums"]]
        same = same_on_all_ranks(host["checksums"], 0)
        if probe is not None and not same and same_on_all_ranks(host["checksums"], 3):
            # the ranks all-reduce the gradients by hand after backward: from now on the
            # step's gradients are the ones optimizer.step() is given
            topology.measure_at_step()
            m, same = probe, True
            table = host["probe"] + (table[-2:] if update is not None else [])
        scope = topology.scope(same)
    elif replicas and sharding is None:
        scope = topology.scope(bool(topology.replicated))
    out = HostStep(m, table, update is not None)
    out.scope = scope
    out.suspect = suspect
    # declared replicated (``replicated=True``): no collective per step, and none is added
    # for the evidence (a monitor built on one rank only, as loggers often are, would wait on
    # the others for ever): no rank is named
    out.ranks = ranks
    out.agreed = sharding is not None or (checking and same)
    for (i, _), row in zip(module_calls, host.get("modules", ()), strict=True):
        out.mods.setdefault(i, []).append(row)
    if flags:
        out.first_bad = next(
            (i for (i, _), v in zip(flags, host["flags"], strict=True) if v), None
        )
    if previous is not None:
        out.previous = (previous.step, previous.ratios(host["previous"]))
    if loss is not None:
        out.loss = float(host["loss"][0])
    return out


#: the numbers of a rank's evidence: loss observed, its value, forward flags kept, the index
#: of the first module whose output was not finite (-1: none) and when it finished (its
#: place among the step's module outputs, the same on every rank that runs the same forward)
EVIDENCE = 5


def evidence(
    loss: torch.Tensor | None, flags: Sequence[tuple[int, torch.Tensor]], device: torch.device
) -> torch.Tensor:
    """This rank's evidence, on the device (no host sync): ``[loss observed, loss, forward
    flags kept, index of the first module whose output was not finite (-1: none), its place
    in the order the outputs were made (-1: none)]``."""
    f64 = torch.float64
    if loss is None:
        seen = torch.zeros(2, dtype=f64, device=device)
    else:
        seen = torch.stack([torch.ones((), dtype=f64, device=device),
                            loss.reshape(()).to(device=device, dtype=f64)])
    if not flags:
        return torch.cat([seen, torch.tensor([0.0, -1.0, -1.0], dtype=f64).to(device)])
    bad = torch.stack([local(f).reshape(()).to(device=device, dtype=f64) for _, f in flags])
    index = torch.tensor([i for i, _ in flags], dtype=f64).to(device)
    at = torch.argmax(bad)  # the first one set
    none = torch.full((), -1.0, dtype=f64, device=device)
    any_bad = bad.any()
    return torch.cat([seen, torch.ones(1, dtype=f64, device=device),
                      torch.where(any_bad, index[at], none)[None],
                      torch.where(any_bad, at.to(f64), none)[None]])


class RankEvidence(NamedTuple):
    """One rank's evidence of where a step went bad: its loss (None: not observed), whether
    its forward outputs were watched (``activations=True``), the index of the first module
    whose output was not finite and that output's place in the step's order of outputs (None:
    all were finite, or not watched)."""

    loss: float | None
    flagged: bool
    first_bad: int | None
    first_at: int | None

    @classmethod
    def of(cls, row: Sequence[float]) -> RankEvidence:
        has_loss, loss, flagged, first, at = row
        return cls(loss if has_loss else None, bool(flagged),
                   int(first) if first >= 0 else None, int(at) if at >= 0 else None)


def suspects(norms: Sequence[Sequence[float]], norm_type: float) -> list[int]:
    """The columns whose norm on some rank is not finite or may have underflowed, from every
    rank's own norms (``norms[r][j]``): what all the ranks see alike, so that they all take
    part in the recheck's collective or none does."""
    tiny = underflow_bound(norm_type)
    bad: set[int] = set()
    for row in norms:
        if row and not (math.isfinite(math.fsum(row)) and min(row) >= tiny):
            bad.update(j for j, v in enumerate(row) if not math.isfinite(v) or v < tiny)
    return sorted(bad)


def finish(
    h: HostStep,
    *,
    step: int,
    watched: WatchedParams,
    topology: Topology,
    norm_type: float,
    module_names: Sequence[str],
    act_names: Sequence[str],
    skipped: bool = False,
    scaler_skips: bool = False,
) -> StepStats:
    """The ``StepStats`` of a step moved to the host, its columns named from ``watched`` (the
    snapshot it was measured with). ``scaler_skips``: a GradScaler without ``optimizer=``
    skips every step whose gradients are not all finite."""
    m, table = h.m, h.table
    sharding = topology.sharding if initialised() else None
    counts = recheck(m, watched.params, table[NORM], norm_type, sharding, topology.gather,
                     h.suspect)
    if scaler_skips:
        skipped = not h.finite()
    params = param_stats(
        watched.names, watched.numels, m.cols, table, counts, m.full, h.with_update
    )
    modules = module_stats(module_names, h.mods, norm_type) if h.mods else {}
    return StepStats(
        step=step,
        total_norm=pnorm([ps.norm for ps in params.values()], norm_type),
        params=params,
        modules=modules,
        full=m.full,
        skipped=skipped,
        scope=h.scope,
        measured_at=m.at,
        forward_nonfinite=act_names[h.first_bad] if h.first_bad is not None else None,
        loss=h.loss,
    )
