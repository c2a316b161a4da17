"""Under ``torch.distributed``: which rank's own micro-batch made a step's first NaN/Inf.

Where each rank can replay its micro-batch by itself (data parallelism: DDP's wrapped module,
or gradients all-reduced by hand; ``Replayer.why_not_alone``), every rank replays its own at
``optimizer.step()``'s pre-hook of the bad step, and the replays' results (plain data: phase,
op, module, line, inputs) are exchanged in one collective, made only on that step and by every
rank alike (they decide it from figures they all hold: ``HostStep.agreed``). A rank whose own
data makes the NaN/Inf in its forward or its backward finds it again; a rank that only
received it through the gradients' reduction replays to finite gradients. The first rank is
the one the forward evidence names (``incident.first_rank``: the earliest non-finite module
output), else the rank whose replay found it, earliest phase first (the input, the forward,
the loss, the backward), then the lowest rank; every rank records that rank's op, module,
line and inputs, with one line per rank saying what its replay found.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from .distributed import gather_objects
from .incident import evidence_key
from .replay import ReplayResult

#: The order in which phases of a step run (an input's NaN is there before any op).
PHASE_ORDER = {"forward": 0, "outside": 1, "backward": 2}

Seen = Sequence[tuple[float | None, bool, int | None, int | None]]


def exchange(res: ReplayResult, seen: Seen
             ) -> tuple[ReplayResult, tuple[int | None, list[str]]]:
    """Every rank's replay result (one collective), the first rank's result as this rank's,
    and (the first rank, one line per rank). Every rank must call it at the same step."""
    results: list[ReplayResult] = gather_objects(res)
    # the evidence's earliest ranks (``incident.first_rank``'s order); where it cannot tell
    # them apart (both losses NaN, first non-finite outputs at the same place: tensor
    # parallel shares outputs), or shows nothing, their replays decide
    keys = {r: k for r, (loss, _, first, at) in enumerate(seen)
            if (k := evidence_key(loss, first, at)) is not None}
    best = min(keys.values(), default=None)
    tied = [r for r, k in keys.items() if k == best] if keys else list(range(len(results)))
    found = [r for r in tied if r < len(results) and results[r].phase is not None]
    rank: int | None = None
    if found:
        rank = min(found, key=lambda r: (*_order(results[r]), r))
    elif tied and keys:
        rank = min(tied)
    chosen = res
    if rank is not None and results[rank].phase is not None:
        chosen = copy.copy(results[rank])
        chosen.note = _joined(f"replayed on rank {rank}, where the step went bad first",
                              chosen.note)
    return chosen, (rank, [said(x) for x in results])


def _order(x: ReplayResult) -> tuple[int, float]:
    """When a rank's replay found it: the phase, then the position in the phase's order of
    work (every rank runs the same ops: under tensor parallel a NaN one rank made reaches the
    others at a later op, through a collective)."""
    position = float("inf") if x.position is None else x.position
    if x.phase == "forward" and x.input is not None:
        return -1, position  # the input held it
    return PHASE_ORDER.get(x.phase or "", len(PHASE_ORDER)), position


def _joined(a: str, b: str | None) -> str:
    return f"{a}; {b}" if b else a


def said(x: ReplayResult) -> str:
    """What one rank's replay of its own micro-batch found, as the tail of its line."""
    what = x.value or "NaN/Inf"
    where = f" in {x.module}" if x.module else ""
    at = f" ({x.line})" if x.line else ""
    if x.phase is None:
        if x.replayed and x.together:
            return ("its micro-batch, replayed with every rank, stayed finite on this rank: "
                    "downstream")
        if x.replayed:
            return "its micro-batch, replayed alone, gave finite gradients: downstream"
        return x.note or "not replayed"
    if x.phase == "forward" and x.input is not None:
        first = f" (first read by {x.op}{where})" if x.op else ""
        return f"its replay: {x.input} already held {what}{first}"
    if x.phase == "forward":
        return f"its replay: the forward made {what} at {x.op}{where}{at}"
    if x.phase == "outside":
        return f"its replay: the loss made {what} at {x.op}{at}" if x.op else (
            f"its replay: the loss made {what}")
    return f"its replay: the backward made {what} at {x.op}{where}{at}"
