"""``GradMonitor``: the public class, its hooks and the step boundary (see the package's
docstring for which gradients a step measures and when it ends).

What is here: the arguments kept, the hooks installed (post-accumulate-grad hooks, the
optimizer's step pre/post hooks, the scaler's ``update``, one global forward hook pair), the
step boundary (which hook ends a step, which measures it), the module and activation hooks of
``modules=`` and ``activations=``, and the views (``report``, ``to_jsonl``...).

The parts: ``checks`` (arguments, which parameters, unwrapping), ``rewatch`` (the parameters
read again when the model changes), ``measure`` (the device figures and the packet of the
step's one transfer), ``transfer`` (the end of a logged step: the transfer and the record),
``stats`` (the kernels), ``distributed`` (across processes), ``records`` (host rows to
``ParamStats``); the alert rules are plain data in ``gradscope.model.alerts``, the incidents
in ``gradscope.capture.incidents``.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ...errors import GradscopeError, MonitorWarning, UnsupportedSetupError
from ...model.alerts import AlertRules
from ...model.formats import renderer
from ...model.incident import Incident
from ...model.monitor import Alert, DroppedSummary, MonitorLog, StepStats, Thresholds
from .. import dynamo
from ..handles import HookHandle
from ..incidents import IncidentWatch
from ..nest import iter_tensors
from .checks import (
    check_args,
    check_options,
    check_scaler,
    open_stream,
    select_modules,
    select_params,
    unwrap_optimizer,
)
from .distributed import initialised, sharding_of
from .measure import Measure, inverse_scale, measure
from .rewatch import first_forward, on_registration, refresh
from .stats import UPDATE_SAMPLE, UpdateSample, local, module_row, sample_size
from .transfer import finish

#: logged steps kept in ``GradMonitor.history`` by default (older ones are summed up)
HISTORY = 1000
#: full statistics (max/mean abs, zero fraction, update ratios) on one logged step in this many
FULL_EVERY = 50

# bound once: they run on every backward (the hooks) or every logged step
_engine_callback = torch.autograd.Variable._execution_engine.queue_callback
_graph_task_id = torch._C._current_graph_task_id
# the C++ guard behind torch.inference_mode(), without its Python wrapper
_InferenceMode = torch._C._InferenceMode
_wrapped = torch._C._functorch.is_functorch_wrapped_tensor


class GradMonitor:
    """Watch gradients while training; read ``.history``, ``.alerts`` and ``.report()`` after.

    Args:
        model: the ``nn.Module`` being trained (a DDP wrapper, its inner module, a model
            sharded with ``fully_shard``, or any other).
        every: log one step in ``every``; the others cost nothing measurable.
        norm_type: the p of the norms (``math.inf`` for the max norm), as in ``clip_grad_norm_``.
        params: parameter names or globs (``"encoder.*"``) to watch; default all trainable ones.
        modules: also record submodules' gradient-output statistics (``StepStats.modules``):
            True for every submodule, or names/globs (``"encoder.*"``); a name that matches no
            submodule raises ``MonitorError`` listing the known ones.
        activations: check module outputs in the forward and name the first non-finite one.
        optimizer: make its ``step()`` the step boundary (gradient accumulation is then one
            step) and measure update-to-weight ratios on full-statistics steps.
        measure: ``"backward"`` (default): the gradients as the last backward left them,
            before any clipping; ``"optimizer"``: at ``optimizer.step()``, what it is given.
        full_every: full statistics (max/mean abs, zero fraction, update ratios) on one logged
            step in ``full_every`` (the first included); 1 for every logged step.
        update_sample: weights sampled per tensor for the update ratios (tensors up to this
            size exactly); lowered when the sample would exceed 0.4% of the parameters.
        scaler: the ``torch.amp.GradScaler`` of a mixed-precision loop: norms are unscaled and
            steps it skips are recorded as skipped.
        replicated: declare whether every rank holds the same gradients (None: detect).
        vanish: a gradient whose per-element size (norm / numel^(1/p)) stays below this for
            ``VANISH_PATIENCE`` logged steps is "vanishing" (exactly zero: "dead").
        vanish_ratio: ... or whose per-element size stays below this fraction of the median
            per-element size of the model's parameters at the same step.
        explode: a norm above this (or ``SPIKE_FACTOR`` x its running median) alerts.
        leaks: also watch for autograd graphs of earlier steps still alive at the next step
            (a loss kept without ``.detach()``), with ``gs.leak_check``; each leak is an
            ``Alert`` of kind ``leak``.
        history: keep the last ``history`` logged steps in ``.history`` (default 1000; None:
            all of them); what the older ones held is summed up in ``.log.dropped``.
        jsonl: also write every logged step to this JSON Lines file as it is recorded (one
            line per step, flushed; ``gs.read_jsonl`` reads it back), whatever ``history``.
        replay, loss_fn: replay the first bad step before ``optimizer.step()`` and name its
            origin in ``.incidents``; ``loss_fn(output, *targets)`` (``.target(...)``) lets it
            name the loss's op (see ``gradscope.capture.replay``).

    Raises:
        MonitorError: arguments it cannot use; ``UnsupportedSetupError`` for a set-up it cannot
            measure (a tensor subclass, DTensors sharded over several mesh dimensions, ...).

    Example:
        >>> model = torch.nn.Linear(4, 2)
        >>> with GradMonitor(model) as mon:
        ...     model(torch.randn(8, 4)).square().mean().backward()
        >>> len(mon.history), sorted(mon.history[0].params)
        (1, ['bias', 'weight'])
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        every: int = 1,
        norm_type: float = 2.0,
        params: str | Iterable[str] | None = None,
        modules: bool | str | Iterable[str] = False,
        activations: bool = False,
        optimizer: torch.optim.Optimizer | None = None,
        measure: str = "backward",
        full_every: int = FULL_EVERY,
        update_sample: int = UPDATE_SAMPLE,
        scaler: Any = None,
        replicated: bool | None = None,
        vanish: float = 1e-7,
        vanish_ratio: float = 1e-4,
        explode: float = 1e3,
        leaks: bool = False,
        history: int | None = HISTORY,
        jsonl: str | Path | None = None,
        replay: bool = True,
        loss_fn: Any = None,
    ) -> None:
        check_args(model, every, norm_type, full_every, measure)
        # a torch.compile wrapper: its module's names (the wrapper is what the loop calls)
        called, model = model, dynamo.unwrap(model) or model
        check_options(replicated, update_sample, history)
        self.every = every
        self.full_every = full_every
        self.norm_type = float(norm_type)
        self.vanish = vanish
        self.vanish_ratio = vanish_ratio
        self.explode = explode
        self.thresholds = Thresholds(vanish, vanish_ratio, explode)
        self.optimizer = unwrap_optimizer(optimizer) if optimizer is not None else None
        self.measure = measure
        self.update_sample = update_sample
        self._scaler = check_scaler(scaler)
        self._model = model
        chosen = select_params(model, params)
        self._patterns = None if params is None else (
            [params] if isinstance(params, str) else list(params)
        )
        # the names still watched when the model changed in a way the monitor cannot follow
        self._frozen: set[str] | None = None
        self.names = [n for n, _ in chosen]
        self._params = [p for _, p in chosen]
        self._numels = [p.numel() for p in self._params]
        # per tensor, lowered on a large model with many tensors (the sample's memory bound)
        self._sample_k = sample_size(self._numels, update_sample)
        self._sharding, self._replicated = sharding_of(chosen, replicated)
        # declared (or DTensor) rather than detected: what the log's description says
        self._declared = replicated is not None
        # the step's gradients are measured when the last backward ends, or at the step
        self._point = measure if self.optimizer is not None else "backward"
        # one-off: are hand-all-reduced gradients identical only at optimizer.step()?
        self._dp_probe = self.optimizer is not None and measure == "backward"
        # the same lattice on every run and rank (str hash() is salted per process)
        self._seeds = [zlib.crc32(n.encode("utf-8", "surrogatepass")) for n in self.names]
        self._modules = select_modules(model, modules)
        self._module_names = [n for n, _ in self._modules]
        self._module_calls: list[list[torch.Tensor]] = [[] for _ in self._modules]
        self._act_names = (
            [n or type(model).__name__ for n, _ in model.named_modules()] if activations else []
        )
        self._act_flags: list[tuple[int, torch.Tensor]] = []
        self.step = 0
        self._logged_steps = 0
        self.history: list[StepStats] = []
        self.alerts: list[Alert] = []
        self._cap = history
        self._dropped = DroppedSummary()
        self._stream = open_stream(jsonl) if jsonl is not None else None
        self._streamed = 0  # alerts already written to the stream
        self._handles = HookHandle()
        self._queued = -1
        self._pending: Measure | None = None
        self._probe: Measure | None = None
        self._sample: UpdateSample | None = None
        self._stepped = False
        self._checked_params = False
        self._numel_of = dict(zip(self.names, self._numels, strict=True))
        self._rules = AlertRules(self.thresholds, self.norm_type, self._numel_of)
        self._leak_check: Any = None
        self._leak_alerted: set[int] = set()
        self.distributed: str | None = None
        if leaks:
            from ..memory import LeakCheck  # saved-tensor hooks: only when asked for

            self._leak_check = LeakCheck(grace=1, warn=False).start()
        self._incidents = IncidentWatch(
            model, called, self._params, self.norm_type, replay, self.optimizer, loss_fn
        )
        self._attach(model, activations)
        self._handles.add(self._incidents.install())

    # ------------------------------------------------------------------ hooks
    def _attach(self, model: torch.nn.Module, activations: bool) -> None:
        add = self._handles.add
        if self._point == "backward":
            for p in self._params:
                add(p.register_post_accumulate_grad_hook(self._on_accumulate))
        if self.optimizer is not None:
            add(self.optimizer.register_step_pre_hook(self._before_step))
            add(self.optimizer.register_step_post_hook(self._after_step))
            if self._scaler is not None:
                add(self._wrap_scaler_update())
        # the first-forward check, modules= and activations=: one global forward pre/post hook
        # pair that Dynamo never sees (hooks on the modules would be traced into a compiled
        # graph and guarded on: a recompile when they go); modules that run inside a compiled
        # region have no forward call to hook. Needed only for the check, it goes after the
        # first step.
        self._module_index = {id(mod): i for i, (_, mod) in enumerate(self._modules)}
        self._act_index = (
            {id(mod): i for i, (_, mod) in enumerate(model.named_modules())} if activations else {}
        )
        self._global_hooks = dynamo.ModuleHooks(self._forward_pre, self._forward_done)
        add(self._global_hooks.install())
        # a parameter or submodule registered anywhere (a re-assigned weight, an added layer)
        # marks the model as possibly changed: it is re-read before the next logged step
        self._changed = False
        for handle in on_registration(self._mark_changed):
            add(handle)

    def _mark_changed(self, *args: Any) -> None:
        self._changed = True

    def _forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        if not self._checked_params and (dynamo.unwrap(module) or module) is self._model:
            first_forward(self)

    def _forward_done(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._incidents.replaying:  # the replay's forward is not a step's
            return
        key = id(module)
        i = self._module_index.get(key)
        if i is not None:
            self._module_forward(i, module, args, output)
        i = self._act_index.get(key)
        if i is not None:
            self._activation_check(i, module, args, output)

    def _wrap_scaler_update(self) -> Any:
        """Shadow the scaler instance's ``update`` (the end of a step it may have skipped);
        returns what undoes it."""
        scaler, original = self._scaler, self._scaler.update

        def update(new_scale: Any = None) -> None:
            self._guard(self._on_scaler_update)
            original(new_scale)

        scaler.update = update

        def unwrap() -> None:
            if scaler.__dict__.get("update") is update:
                del scaler.__dict__["update"]

        return unwrap

    def remove(self) -> None:
        """Remove every hook gradscope added (safe to call twice); history and alerts stay."""
        self._handles.remove()
        if self._leak_check is not None:
            self._leak_check.remove()
        self._pending = self._probe = self._sample = None
        self._act_flags.clear()
        for calls in self._module_calls:
            calls.clear()
        if self._stream is not None:
            self._stream.close()

    def __enter__(self) -> GradMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    @property
    def log(self) -> MonitorLog:
        """The recorded history as plain data (shares the lists with the monitor)."""
        return MonitorLog(
            names=self.names,
            every=self.every,
            full_every=self.full_every,
            norm_type=self.norm_type,
            steps=self.history,
            alerts=self.alerts,
            distributed=self.distributed,
            numels=self._numel_of,
            thresholds=self.thresholds,
            dropped=self._dropped,
            incidents=self.incidents,
        )

    @property
    def incidents(self) -> list[Incident]:
        """One ``Incident`` per event (non-finite gradients, an explosion): its first step."""
        return self._incidents.incidents

    def target(self, *values: Any) -> None:
        """The targets of the micro-batch just run, for ``loss_fn(output, *values)``."""
        self._incidents.target(*values)

    def replay_run(self, run: Any) -> None:
        """A framework's own step for the next micro-batch (returns its loss; Lightning)."""
        self._incidents.add_run(run)

    def _guard(self, fn: Any, *args: Any) -> Any:
        """Run a hook body; an unexpected failure stops the monitor with a warning instead of
        breaking the training step (a GradscopeError, said on purpose, goes through)."""
        try:
            return fn(*args)
        except GradscopeError:
            raise
        except Exception as exc:  # noqa: BLE001 - the user's step must go on
            self.remove()
            warnings.warn(
                f"GradMonitor stopped and removed its hooks: {type(exc).__name__}: {exc} "
                "(training goes on unmonitored; please report this to gradscope)",
                MonitorWarning,
                stacklevel=2,
            )
            return None

    def _logged(self) -> bool:
        return self.step % self.every == 0

    def _full_due(self) -> bool:
        return self._logged_steps % self.full_every == 0

    def _advance(self) -> None:
        """End the current step: count it, and look for graphs of earlier steps still alive."""
        if not (self._module_index or self._act_index):
            # only the first-forward check needed them, and its forward is over (idempotent)
            self._global_hooks.remove()
        step = self.step
        if self._logged():
            self._logged_steps += 1
        self.step += 1
        self._pending = self._probe = self._sample = None
        if self._changed and self._checked_params and self._logged():
            self._changed = False
            refresh(self)
        self._incidents.end_step()
        if self._leak_check is None:
            return
        for leak in self._leak_check.step().leaks:
            if leak.step not in self._leak_alerted:
                self._leak_alerted.add(leak.step)
                self.alerts.append(Alert("leak", step, f"step {leak.step}", str(leak)))

    def _on_accumulate(self, param: torch.Tensor) -> None:
        # one callback per backward: compare graph-task ids rather than keep a flag, so a
        # backward that raised (and never ran its callbacks) cannot block later steps
        task = _graph_task_id()
        if task != self._queued:
            self._queued = task
            _engine_callback(self._backward_done)

    def _backward_done(self) -> None:
        if not self._logged():
            if self.optimizer is None:
                self._advance()
            return
        # measure in a second callback, queued now: it runs after every callback queued during
        # the backward (DDP's gradient averaging is one), so it sees the final .grad
        _engine_callback(self._after_backward)

    def _after_backward(self) -> None:
        self._guard(self._measure_after_backward)

    def _measure_after_backward(self) -> None:
        with _InferenceMode(True):
            measured = self._measure("backward")
            self._incidents.after_backward(measured.matrix[0])
        if self.optimizer is None:
            finish(self, measured, None)
        else:
            self._pending = measured  # the last backward before the step counts

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        if self._logged():
            self._guard(self._measure_before_step, args, kwargs)
            return self._guard(self._incidents.before_step, lambda: self._pending, args, kwargs)
        return None

    def _measure_before_step(self, args: Any, kwargs: Any) -> None:
        # the hook's args are step()'s, self first
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        with _InferenceMode(True):
            if self._point == "optimizer":
                if closure is not None:
                    raise UnsupportedSetupError(
                        "optimizer.step(closure) runs the backward inside the step, so "
                        "measure='optimizer' cannot see the gradients it is given; use "
                        "measure='backward' (the default)"
                    )
                self._pending = self._measure("optimizer")
            elif self._dp_probe and initialised() and self._needs_check() and closure is None:
                self._probe = self._measure("optimizer")
            if self.optimizer is not None and self._full_due():
                self._sample = UpdateSample(self._params, self._sample_k, self._seeds)

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._stepped = True
        if not self._logged():
            self._advance()
            return
        self._guard(self._finish_step, False)

    def _finish_step(self, skipped: bool) -> None:
        with _InferenceMode(True):
            measured = self._pending
            if measured is None:  # no backward since the last step: gradients set by hand
                measured = self._measure("optimizer")
            update = None
            if self._sample is not None and not skipped:
                update = self._sample.rows(measured.cols)
        finish(self, measured, update, skipped=skipped)

    def _on_scaler_update(self) -> None:
        stepped, self._stepped = self._stepped, False
        if stepped:
            return
        # the scaler found non-finite gradients and did not call optimizer.step()
        if self._logged():
            self._finish_step(True)
        else:
            self._advance()

    def _module_forward(self, index: int, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self._logged() or not torch.is_grad_enabled():
            return
        for _, t in iter_tensors(output):
            if t.requires_grad:
                t.register_hook(partial(self._module_grad, index))

    def _module_grad(self, index: int, grad: torch.Tensor) -> None:
        self._guard(self._module_row, index, grad)

    def _module_row(self, index: int, grad: torch.Tensor) -> None:
        if grad.numel() == 0:
            return
        with torch.no_grad():
            row = module_row(grad, self.norm_type)
            inv = self._inverse_scale()
            if inv is not None:  # norm, max abs, sum |g| of a scaled gradient
                row = torch.cat([row[:3] * inv.to(row), row[3:]])
            self._module_calls[index].append(row)

    def _activation_check(
        self, index: int, module: torch.nn.Module, args: Any, output: Any
    ) -> None:
        if self._logged() and torch.is_grad_enabled():
            self._guard(self._check_outputs, index, output)

    def _check_outputs(self, index: int, output: Any) -> None:
        with torch.no_grad():
            for _, t in iter_tensors(output):
                if _wrapped(t):  # inside torch.func.vmap / grad: a batched view, not checkable
                    continue
                if t.is_floating_point() or t.is_complex():
                    self._act_flags.append((index, ~torch.isfinite(t.detach()).all()))

    # ------------------------------------------------------------------ measuring
    def _measure(self, at: str) -> Measure:
        """Queue this step's statistics on the device (no host sync); under inference mode."""
        first = self._params[0]
        device = local(first).device if self._sharding is not None else first.device
        inv = inverse_scale(self._scaler, self.optimizer)
        return measure(self._params, self.norm_type, at, self._full_due(), inv, device)

    def _inverse_scale(self) -> torch.Tensor | None:
        return inverse_scale(self._scaler, self.optimizer)

    def _needs_check(self) -> bool:
        """Whether the ranks' holding the same gradients is still to be detected."""
        return self._sharding is None and self._replicated is None

    # ------------------------------------------------------------------ views
    def report(self, *, width: int = 24) -> Any:
        """A rich renderable: one row per parameter (model order) with the latest norm, a
        sparkline of its history, max abs, non-finite counts and a status; then a summary line.

        Example:
            >>> rich.console.Console().print(mon.report())   # doctest: +SKIP
        """
        return renderer("monitor_report")(self.log, width=width)

    def to_jsonl(self, path: str | Path) -> Path:
        """Write one JSON object per logged step (non-finite floats as null; counts are exact)."""
        return renderer("monitor_jsonl")(self.log, Path(path))

    def to_csv(self, path: str | Path) -> Path:
        """Write one CSV row per (logged step, parameter)."""
        return renderer("monitor_csv")(self.log, Path(path))

    def to_tensorboard(self, writer: Any) -> None:
        """Log scalars (total and per-parameter norms, update ratios) and per-step histograms of
        the per-parameter norms to a ``torch.utils.tensorboard.SummaryWriter`` (or any object with
        ``add_scalar`` and ``add_histogram``)."""
        renderer("monitor_tensorboard")(self.log, writer)

    def plot(self, path: str | Path) -> Path:
        """Save a PNG: gradient flow per layer (latest and max over steps) and the total norm
        over steps, non-finite and skipped steps marked. Needs matplotlib
        (``pip install gradscope[plot]``)."""
        return renderer("monitor_plot")(self.log, Path(path))


