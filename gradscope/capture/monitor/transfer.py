"""The end of a logged step: reduce across ranks, ONE transfer to the host, one record.

``finish`` takes the step's ``Measure`` (and the sampled update rows, on a full-statistics
step with ``optimizer=``), ends the step (``GradMonitor._advance``), and packs into one
``Packet`` what the step moves to the host: the statistics table (all-gathered over the
sharding mesh dimension for DTensor parameters), the ranks' replication checksums and the
probe measured at ``optimizer.step()`` (when whether the ranks hold the same gradients is
still being detected), the module rows and the activation flags. After the one
``.tolist()`` it combines the shards, decides the scope ("global" or "rank N":
``rank_scope``), rechecks the rare non-finite columns exactly (``measure.recheck``) and
builds the ``StepStats``.

``record`` appends it to the history (older steps beyond ``history=`` summed up in the
dropped summary), runs the alert rules and the incident watch over it, and writes its line to
the JSON Lines stream.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

import torch

from ...model.monitor import StepStats, log_header, step_record
from .distributed import (
    all_gather,
    checksum,
    combine_replicated,
    describe,
    initialised,
    same_on_all_ranks,
    this_rank,
    world_size,
)
from .measure import Measure, Packet, recheck
from .records import module_stats, param_stats
from .stats import MODULE_ROW, NORM, combine_shards, pnorm

if TYPE_CHECKING:
    from .core import GradMonitor


def finish(
    mon: GradMonitor, m: Measure, update: torch.Tensor | None, *, skipped: bool = False
) -> None:
    """End the step: reduce across ranks, move everything to the host in ONE transfer,
    record the step."""
    step = mon.step
    dist_on = initialised()
    # a single process: nothing to combine (one rank is its own global)
    replicas = dist_on and world_size() > 1
    probe = mon._probe if replicas else None
    mon._advance()
    mon._dp_probe = False  # only the first logged step is probed
    mine = m.matrix.to(torch.float64)
    if update is not None:
        mine = torch.cat([mine, update])
    sharding = mon._sharding if dist_on else None
    checking = replicas and mon._needs_check()
    rows, ncol = mine.shape
    packet = Packet()
    if sharding is not None:
        packet.put("table", all_gather(mine, sharding.group), (sharding.world, rows, ncol))
    else:
        packet.put("table", mine, (rows, ncol))
    if checking:
        checks_ = [checksum(m.matrix[0])] + ([checksum(probe.matrix[0])] if probe else [])
        width = 3 * len(checks_)
        packet.put("checksums", all_gather(torch.cat(checks_), None), (world_size(), width))
        if probe is not None:
            packet.put("probe", probe.matrix, (probe.matrix.shape[0], len(probe.cols)))
    mod_calls = [(i, c) for i, calls in enumerate(mon._module_calls) for c in calls]
    for calls in mon._module_calls:
        calls.clear()
    if mod_calls:
        packet.put(
            "modules", torch.stack([c for _, c in mod_calls]), (len(mod_calls), MODULE_ROW)
        )
    flags, mon._act_flags = mon._act_flags, []
    if flags:
        packet.put("flags", torch.stack([f for _, f in flags]), (len(flags),))
    host = packet.to_host()

    kinds = ["norm"] + (["max", "sum", "sum"] if m.full else [])
    kinds += ["norm2", "norm2"] if update is not None else []
    scope: str | None = None
    if sharding is not None:
        per_rank = host["table"]
        whole = combine_shards(per_rank, kinds, mon.norm_type)
        table = combine_replicated(whole, per_rank, sharding.sharded, m.cols)
        scope = "global"
        mon.distributed = f"sharded (DTensor): shards combined over {sharding.world} ranks"
    else:
        table = host["table"]
    if checking:
        same = same_on_all_ranks(host["checksums"], 0)
        if probe is not None and not same and same_on_all_ranks(host["checksums"], 3):
            # the ranks all-reduce the gradients by hand after backward: from now on
            # the step's gradients are the ones optimizer.step() is given
            mon._point = "optimizer"
            m, same = probe, True
            table = host["probe"] + (table[-2:] if update is not None else [])
        scope = rank_scope(mon, same)
    elif replicas and sharding is None:
        scope = rank_scope(mon, bool(mon._replicated))
    mods: dict[int, list[list[float]]] = {}
    for (i, _), row in zip(mod_calls, host.get("modules", ()), strict=True):
        mods.setdefault(i, []).append(row)
    first_bad = None
    if flags:
        first_bad = next(
            (mon._act_names[i] for (i, _), v in zip(flags, host["flags"], strict=True) if v),
            None,
        )
    counts = recheck(m, mon._params, table[NORM], mon.norm_type, sharding)
    if mon._scaler is not None and mon.optimizer is None:
        # the scaler skips every step whose gradients are not all finite
        skipped = any(not math.isfinite(v) for v in table[NORM])
    params = param_stats(
        mon.names, mon._numels, m.cols, table, counts, m.full, update is not None
    )
    modules = module_stats(mon._module_names, mods, mon.norm_type) if mods else {}
    record(
        mon,
        StepStats(
            step=step,
            total_norm=pnorm([ps.norm for ps in params.values()], mon.norm_type),
            params=params,
            modules=modules,
            full=m.full,
            skipped=skipped,
            scope=scope,
            measured_at=m.at,
            forward_nonfinite=first_bad,
        ),
    )


def rank_scope(mon: GradMonitor, same: bool) -> str:
    """The step's scope when the ranks hold the same gradients (``same``) or not; says so in
    ``mon.distributed``."""
    how = "declared" if mon._replicated is not None else "detected"
    mon.distributed = describe(same, how)
    return "global" if same else f"rank {this_rank()}"


def record(mon: GradMonitor, st: StepStats) -> None:
    """Keep the step (the history, its alerts and incident) and write its line to the stream."""
    history = mon.history
    history.append(st)
    alerts = mon._incidents.record(st, mon._rules.update(st))
    if alerts:
        mon.alerts.extend(alerts)
    if mon._cap is not None and len(history) > mon._cap:
        for old in history[: len(history) - mon._cap]:
            mon._dropped.add(old)
        del history[: len(history) - mon._cap]
    if mon._stream is not None and not mon._stream.closed:
        incs = mon.incidents
        incident = incs[-1] if incs and incs[-1].step == st.step else None
        obj = step_record(st, mon.alerts[mon._streamed :], incident)
        mon._streamed = len(mon.alerts)
        if mon._logged_steps == 1:
            obj["log"] = log_header(mon.log)
        mon._stream.write(json.dumps(obj, allow_nan=False) + "\n")
        mon._stream.flush()
