"""Activation memory per module, checkpoint plans, and their verification.

- ``activation_report(model, *inputs, loss_fn=None)``: one recorded forward (saved-tensor
  hooks, global module hooks, ``torch.utils.flop_counter``) read into the plain
  ``ActivationReport`` of ``gradscope.memory.activations_records``. Works on the ``meta``
  device (a model built without weights), where nothing is allocated.
- ``plan_checkpoints(model, *inputs, budget=..., loss_fn=None)``: the report's plan, as a
  ``CheckpointPlan`` that ``.apply(model)`` wraps in non-reentrant checkpoints (and whose
  handle's ``.remove()`` restores the model exactly) and ``.verify(...)`` measures.
- ``measure_forward(model, *inputs, loss_fn=None)``: bytes allocated by a forward and still
  held at its end, outputs apart, seen by the profiler (CPU) or the CUDA allocator: a means
  independent of the report's own counting.

Nothing the user gave is changed: the forwards run with the RNG state and the buffers
(BatchNorm's running statistics) restored afterwards, and no gradient is computed.

The public functions and the plans are here; the recording of a forward is in
``memplan_record``, the measurement in ``memplan_measure`` (``measure_forward`` is importable
from here too).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..errors import GradscopeError
from ..graph.nest import iter_tensors
from .activations_recorder import (
    LossFn,
    _forward,
    _preserved,
    _report,
)
from .activations_records import (
    ActivationReport,
    ModuleRow,
    Plan,
    Verification,
    parse_size,
)
from .checkpoint_apply import CheckpointHandle, apply_checkpoints
from .measure_forward import _measure, measure_forward
from .untouched import isolated, restored

_AUTOCAST = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
             "fp16": torch.float16, "float16": torch.float16, "half": torch.float16}


# ====================================================================== public: report
def activation_report(
    model: torch.nn.Module,
    *inputs: Any,
    loss_fn: LossFn = None,
    autocast: str | None = None,
    batch_scale: float | None = None,
) -> ActivationReport:
    """Activation memory per module, and what checkpointing each module would free.

    Runs one forward (``loss_fn(output)`` too, when given) under saved-tensor hooks, global
    module hooks and ``torch.utils.flop_counter.FlopCounterMode``; no backward, no optimizer
    step, gradients untouched, RNG state and buffers restored. Works on a model built on the
    ``meta`` device with meta inputs (nothing is allocated).

    Args:
        model: the module to run.
        *inputs: what to call it with (positional).
        loss_fn: applied to the output; the figures are then those of a training step's forward.
        autocast: ``"bf16"`` or ``"fp16"``: also run the forward under ``torch.autocast`` and
            fill ``autocast_bytes`` (what the activations would hold in mixed precision).
        batch_scale: k: fill ``scaled_bytes`` with the figures of a batch k times larger,
            extrapolated linearly from this batch and half of it (dimension 0 of the inputs;
            ``loss_fn`` is also called on the half batch's output, so a target it closes over
            must follow the output's rows: ``ModelFile.batch_loss`` does for a model file).

    Returns:
        ``ActivationReport``: ``.total`` and ``.rows`` (``path``, ``activation_bytes``,
        ``checkpoint_saves``, ``recompute_flops``), ``.plan(budget)``, ``.predict(modules)``.

    Example:
        >>> import torch, gradscope as gs
        >>> net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
        ...                           torch.nn.Linear(32, 1))
        >>> rep = gs.activation_report(net, torch.randn(4, 8))
        >>> rep.total                   # tanh's output, saved by tanh and by the last Linear
        512
        >>> rep.row("1").checkpoint_saves   # the Linear still saves it, and the checkpoint
        -5568
        >>> # keeps tanh's input (512 B) and the RNG state (5056 B): checkpointing it costs
    """
    if not isinstance(model, torch.nn.Module):
        raise GradscopeError(
            f"activation_report needs an nn.Module, got {type(model).__name__}"
        )
    if autocast is not None and _AUTOCAST.get(str(autocast).lower()) is None:
        raise GradscopeError(f"autocast={autocast!r}: expected one of bf16, fp16")
    if batch_scale is not None and (isinstance(batch_scale, bool)
                                    or not isinstance(batch_scale, (int, float))):
        raise GradscopeError(f"batch_scale={batch_scale!r}: expected a number, such as 4 "
                             "(the figures of a batch 4 times larger)")

    def run() -> ActivationReport:
        with restored(model, None, inputs), _preserved(model):
            rep = _report(model, inputs, loss_fn)
            if autocast is not None:
                _autocast_column(rep, model, inputs, loss_fn, _AUTOCAST[str(autocast).lower()],
                                 str(autocast).lower())
            if batch_scale is not None:
                _scaled_column(rep, model, inputs, loss_fn, float(batch_scale))
        return rep

    # where it changes nothing here: buffers the forward reassigns, its own generators
    return isolated(run, "the forward")


def _autocast_column(rep: ActivationReport, model: torch.nn.Module, inputs: tuple[Any, ...],
                     loss_fn: LossFn, dtype: torch.dtype, label: str) -> None:
    if rep.device.startswith("meta"):
        rep.notes.append(
            "autocast: torch.autocast does not cast on the meta device; the column is not "
            "filled for a meta model (run a small config on the CPU)"
        )
        return
    cast = _report(model, inputs, loss_fn, autocast=dtype)
    by_path = {r.path: r.activation_bytes for r in cast.rows}
    rep.rows = [_with(r, autocast_bytes=by_path.get(r.path, 0)) for r in rep.rows]
    rep.autocast = "bf16" if dtype is torch.bfloat16 else "fp16"
    rep.autocast_total = cast.total
    del label


def _scaled_column(rep: ActivationReport, model: torch.nn.Module, inputs: tuple[Any, ...],
                   loss_fn: LossFn, k: float) -> None:
    if k <= 0:
        raise GradscopeError(f"batch_scale={k}: expected a factor above 0")
    tensors = [t for _, t in iter_tensors(inputs, "input")]
    if not tensors or tensors[0].dim() == 0:
        raise GradscopeError("batch_scale needs a tensor input with a batch dimension (dim 0)")
    batch = tensors[0].shape[0]
    if batch < 2:
        rep.notes.append(
            "batch_scale: the batch has 1 sample, so the figures are scaled in proportion "
            "(no second point to tell fixed bytes from per-sample bytes)"
        )
        rep.rows = [_with(r, scaled_bytes=int(round(r.activation_bytes * k))) for r in rep.rows]
        rep.batch_scale, rep.scaled_total = k, int(round(rep.total * k))
        return
    half = batch // 2
    sliced = tuple(_slice_batch(x, batch, half) for x in inputs)
    small = _report(model, sliced, loss_fn)
    by_path = {r.path: r.activation_bytes for r in small.rows}

    def line(y_full: int, y_half: int) -> int:
        slope = (y_full - y_half) / (batch - half)
        return int(round(y_full + slope * (k * batch - batch)))

    rep.rows = [_with(r, scaled_bytes=max(0, line(r.activation_bytes, by_path.get(r.path, 0))))
                for r in rep.rows]
    rep.batch_scale, rep.scaled_total = k, max(0, line(rep.total, small.total))


def _slice_batch(x: Any, batch: int, n: int) -> Any:
    """The first ``n`` rows of every batch-shaped tensor in ``x``, each in storage of its own:
    a view would keep the whole batch's storage alive, and a saved input would count it."""
    if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch:
        rows = x[:n].detach().clone()
        return rows.requires_grad_() if x.requires_grad else rows
    if isinstance(x, (tuple, list)):
        return type(x)(_slice_batch(v, batch, n) for v in x)
    if isinstance(x, dict):
        return {k: _slice_batch(v, batch, n) for k, v in x.items()}
    return x


def _with(row: ModuleRow, **changes: Any) -> ModuleRow:
    from dataclasses import replace

    return replace(row, **changes)


# ====================================================================== public: plans
@dataclass(frozen=True)
class CheckpointPlan(Plan):
    """A ``Plan`` that can be applied to the model and measured.

    Example:
        >>> import torch, gradscope as gs
        >>> net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(64, 64),
        ...                             torch.nn.Tanh(), torch.nn.Linear(64, 64))
        ...                             for _ in range(4)])
        >>> x = torch.randn(512, 64)
        >>> plan = gs.plan_checkpoints(net, x, budget="50%")
        >>> plan.predicted <= plan.budget
        True
        >>> handle = plan.apply(net)      # net now recomputes those modules in backward
        >>> handle.remove()               # and now it is exactly as before
    """

    def apply(self, model: torch.nn.Module) -> CheckpointHandle:
        """Wrap the plan's modules in non-reentrant checkpoints; returns the handle whose
        ``.remove()`` restores the model."""
        return apply_checkpoints(model, self.modules)

    def verify(self, model: torch.nn.Module, *inputs: Any, loss_fn: LossFn = None,
               optimizer: Any = None) -> Verification:
        """Measure the forward with and without the plan (``measure_forward``; for a plan of
        ``target="peak"``, the whole step's peak: ``measure_step``, with ``optimizer``),
        compare their outputs (the loss, with ``loss_fn``), and the buffers after a forward
        and backward (BatchNorm's running statistics: the recomputation must not update them
        twice), each run from the same RNG states, buffers, attributes and generators; the
        model is left as it was (the runs are in a forked child where one can be used, as
        ``step_memory``'s)."""
        plain: list[torch.Tensor] = []
        planned: list[torch.Tensor] = []

        def kept() -> Any:  # each run from the same state, put back after it
            return restored(model, None, inputs)

        def runs() -> tuple[int, str, int, list[torch.Tensor], list[torch.Tensor]]:
            with kept():
                with kept():
                    base, method = _measure(model, inputs, loss_fn, plain)
                with kept():
                    plain_buffers = _buffers_after_backward(model, inputs, loss_fn)
                with self.apply(model):
                    with kept():
                        measured, _ = _measure(model, inputs, loss_fn, planned)
                    with kept():
                        planned_buffers = _buffers_after_backward(model, inputs, loss_fn)
            return base, method, measured, plain_buffers, planned_buffers

        def answer() -> tuple[Any, ...]:
            got = runs()
            return got + (_all_equal(plain, planned),)

        base, method, measured, plain_buffers, planned_buffers, same = isolated(
            answer, "the forwards")
        if self.target == "peak":
            from .step import measure_step

            base, method = max(measure_step(model, *inputs, optimizer=optimizer,
                                            loss_fn=loss_fn)[:2]), "profiler"
            measured = max(measure_step(model, *inputs, optimizer=optimizer, loss_fn=loss_fn,
                                        plan=self.modules)[:2])
        return Verification(self.predicted, self.baseline, measured, base, method, self.budget,
                            same, _all_equal(plain_buffers, planned_buffers))


def _buffers_after_backward(model: torch.nn.Module, inputs: tuple[Any, ...], loss_fn: LossFn
                            ) -> list[torch.Tensor]:
    """Copies of the model's buffers after a forward and a backward (``torch.autograd.grad``
    of the outputs' sum: no ``.grad`` is touched)."""
    root = _forward(model, inputs, loss_fn)
    outs = [t for _, t in iter_tensors(root) if t.requires_grad]
    params = [p for p in model.parameters() if p.requires_grad]
    if outs and params:
        total = sum((o.float().sum() for o in outs), torch.zeros((), device=outs[0].device))
        torch.autograd.grad(total, params, allow_unused=True)
    del root, outs
    return [b.detach().clone() for b in model.buffers()]


def _all_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(_bitwise_equal(x, y) for x, y in zip(a, b, strict=True))


def _bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(torch.allclose(a, b, rtol=0, atol=0, equal_nan=True))
    return torch.equal(a, b)


def plan_checkpoints(
    model: torch.nn.Module,
    *inputs: Any,
    budget: int | str,
    loss_fn: LossFn = None,
    report: ActivationReport | None = None,
    max_recompute: int | str | None = None,
    target: str = "activations",
    optimizer: Any = None,
) -> CheckpointPlan:
    """The modules to checkpoint so the activations held at the end of the forward fit
    ``budget`` (with ``target="peak"``: so the peak of the whole training step does), with the
    least recompute.

    Args:
        model, inputs, loss_fn: as for ``activation_report`` (a meta model plans too).
        budget: bytes, or a string: ``"2GiB"``, ``"300MB"``, ``"50%"`` (of the baseline).
        report: a report of the same model and inputs, to plan without another forward.
        max_recompute: leave out modules that free more than this (bytes, ``"64MiB"``,
            ``"10%"``): the backward brings about that much back at once when it recomputes
            one (see ``ActivationReport.plan``).
        target: ``"activations"`` (the default) or ``"peak"``: the budget is for the step's
            peak (``gs.step_memory``: forward, backward and, with ``optimizer``, the optimizer
            step; ``"40%"`` is of the step peak without a plan). The candidates (the report's
            budget sweep, every block, the smallest plan) are run with the plan applied,
            cheapest recompute first; the first that fits is the plan, so a smaller budget
            never gives a higher peak. Where parameters, gradients and optimizer state set the
            peak, the error says no plan can help.
        optimizer: with ``target="peak"``, the optimizer whose step is part of the step.

    Returns:
        ``CheckpointPlan``: ``.modules`` (none nested in another), ``.predicted``,
        ``.baseline``, ``.recompute_flops``, ``.apply(model)``, ``.verify(model, *inputs)``.

    Raises:
        BudgetError (a ``GradscopeError``): the budget cannot be read, or no plan reaches
            it; the message says the smallest reachable figure.
    """
    if target not in ("activations", "peak"):
        raise GradscopeError(f"target={target!r}: expected 'activations' or 'peak'")
    if report is not None and not isinstance(report, ActivationReport):
        raise GradscopeError(f"report= takes the ActivationReport of gs.activation_report(model, "
                             f"*inputs), got {type(report).__name__}")
    rep = report if report is not None else activation_report(model, *inputs, loss_fn=loss_fn)
    if target == "peak":
        from .checkpoint_peak import plan_for_peak

        plan = plan_for_peak(model, inputs, budget, loss_fn, optimizer, rep, max_recompute)
    else:
        plan = rep.plan(budget, max_recompute=max_recompute)
    return as_checkpoint_plan(plan)


def as_checkpoint_plan(plan: Plan) -> CheckpointPlan:
    """A plain ``Plan`` (from ``ActivationReport.evaluate`` or ``.sweep``) made appliable."""
    return CheckpointPlan(plan.modules, plan.predicted, plan.baseline, plan.recompute_flops,
                          plan.budget, plan.recompute_bytes, plan.target)


__all__ = [
    "CheckpointHandle",
    "CheckpointPlan",
    "activation_report",
    "apply_checkpoints",
    "as_checkpoint_plan",
    "measure_forward",
    "parse_size",
    "plan_checkpoints",
]
