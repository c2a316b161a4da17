"""Checkpoint plans against the peak of the whole training step
(``plan_checkpoints(..., target="peak")``).

The candidates are the activation plans of the report's budget sweep (the memory-vs-recompute
front, from no checkpoint down to the smallest reachable figure), "checkpoint every block" and
the smallest plan. Each is run through ``step_memory`` with the plan applied, cheapest recompute
first, and the first whose predicted step peak fits the budget is the plan. Choosing the least
recompute among a fixed set of candidates is monotone: a smaller budget only removes candidates,
so it never gives a plan with a higher peak.

Where the peak is set by what no checkpoint touches (parameters, gradients and the optimizer's
state, in the optimizer step), the error says so in one line.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import BudgetError
from ..graph.nodes import format_bytes, plural
from .activations_records import ActivationReport, Plan, parse_size
from .step import step_memory


def plan_for_peak(model: torch.nn.Module, inputs: tuple[Any, ...], budget: int | str,
                  loss_fn: Any, optimizer: Any, rep: ActivationReport,
                  max_recompute: int | str | None) -> Plan:
    """The plan with the least recompute whose step peak fits ``budget`` (see the module's
    docstring); ``Plan.target`` is ``"peak"``, ``predicted`` / ``baseline`` step peaks."""
    base = step_memory(model, *inputs, optimizer=optimizer, loss_fn=loss_fn)
    target = parse_size(budget, of=base.peak)
    if base.peak <= target:
        return Plan((), base.peak, base.peak, 0, target, 0, "peak")
    candidates: dict[tuple[str, ...], Plan] = {}
    for plan in _candidates(rep, max_recompute):
        if plan.modules:
            candidates.setdefault(plan.modules, plan)
    best: tuple[int, Plan, Any] | None = None
    for plan in sorted(candidates.values(), key=lambda p: (p.recompute_flops, len(p.modules))):
        mem = step_memory(model, *inputs, optimizer=optimizer, loss_fn=loss_fn,
                          plan=plan.modules)
        if mem.peak <= target:
            return Plan(plan.modules, mem.peak, base.peak, plan.recompute_flops, target,
                        plan.recompute_bytes, "peak")
        if best is None or mem.peak < best[0]:
            best = (mem.peak, plan, mem)
    if best is None or best[2].peak_phase == "optimizer" or best[0] >= base.peak:
        floor = best[0] if best is not None else base.peak
        fixed = sum(base.at_peak.get(c, 0) for c in
                    ("parameters", "gradients", "optimizer_state", "inputs"))
        raise BudgetError(
            f"the step peak cannot go below {format_bytes(floor)} with checkpoints: it is set "
            f"by what no checkpoint plan frees (parameters, gradients, optimizer state: "
            f"{format_bytes(fixed)} at the {base.peak_phase} peak, and the step's "
            f"temporaries); give a budget of at least {format_bytes(floor)}, or shard or "
            "shrink the parameters and the optimizer state"
        )
    peak, plan, mem = best
    raise BudgetError(
        f"no checkpoint plan fits the step peak in {format_bytes(target)}: the smallest "
        f"found is {format_bytes(peak)} (checkpointing "
        f"{plural(len(plan.modules), 'entry', 'entries')}; peak in "
        f"the {mem.peak_phase} at {mem.peak_at}); lower the batch size or give a budget of at "
        f"least {format_bytes(peak)}"
    )


def _candidates(rep: ActivationReport, max_recompute: int | str | None,
                points: int = 8) -> list[Plan]:
    """Activation plans from the baseline down to the smallest reachable figure, with no
    bound on what one module frees and with the largest block's figure as the bound (plans
    of many small modules: the backward brings little back at once), or with the caller's
    ``max_recompute`` only; "checkpoint every block" too."""
    blocks = rep.blocks()
    every = rep.evaluate(blocks) if blocks else None
    if max_recompute is not None:
        limits: list[int | None] = [parse_size(max_recompute, of=rep.total)]
    else:
        limits = [None] + ([every.recompute_bytes] if every is not None else [])
    out: list[Plan] = [every] if every is not None and (
        limits[0] is None or every.recompute_bytes <= (limits[0] or 0)) else []
    for limit in limits:
        low = rep.smallest(limit).predicted
        for k in range(points):
            budget = int(rep.total - (rep.total - low) * (k + 1) / points)
            try:
                out.append(rep.plan(budget, max_recompute=limit))
            except BudgetError:
                continue
    return out
