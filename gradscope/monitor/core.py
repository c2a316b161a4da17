"""``GradMonitor``: the public class, its hooks and the step boundary (see the package's
docstring for which gradients a step measures and when it ends).

What is here: the arguments kept, the hooks installed (post-accumulate-grad hooks, the
optimizer's step pre/post hooks, one global forward hook pair), the step boundary (which hook
ends a step, which measures it) and the views (``report``, ``to_jsonl``...). What the forward
hook does for ``modules=`` and ``activations=`` is ``forward_watch.ForwardWatch``'s, the
scaler's ``update`` as a step boundary ``scaler.ScalerHook``'s, ``leaks=`` ``leaks.LeakWatch``'s.

The order of a logged step: measure (``measure``) -> transfer (``transfer.transfer``: ONE
move to the host, at ``optimizer.step()``'s pre-hook when the incident watch needs the norms
there, else at the step's end) -> ``transfer.finish`` (the ``StepStats``) -> the log
(``MonitorLog.append``: history, cap, alert rules, JSON Lines) -> the incident -> the clock
(``step.StepClock``) -> the parameters re-read (``watched.WatchedParams.refreshed``), after the
record, so every step is named from the snapshot it was measured with. Each piece of state has
one owner: ``WatchedParams`` (which tensors), ``StepClock`` (which step), ``StepBuffers`` (what
a step accumulates), ``Topology`` (across processes), ``MonitorLog`` (what was recorded),
``IncidentWatch`` (the events), ``ForwardWatch`` (the module rows and activation flags); the
monitor holds them and the hooks.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from .._torch import dynamo, torchcompat
from .._torch.handles import HookHandle
from ..errors import (
    GradscopeError,
    MonitorError,
    MonitorWarning,
    UnsupportedSetupError,
)
from ..output.formats import renderer
from .alerts import AlertRules
from .checks import (
    adaptive,
    check_args,
    check_options,
    check_scaler,
    check_stream_path,
    grouped_thresholds,
    select_modules,
    select_params,
    unwrap_optimizer,
    vanish_level,
)
from .distributed import Topology
from .forward_watch import ForwardWatch
from .incident import Incident
from .incidents import IncidentWatch
from .leaks import LeakWatch
from .log import (
    VANISH_RATIO,
    Alert,
    MonitorLog,
    StepStats,
    Thresholds,
)
from .measure import Measure, inverse_scale, measure
from .scaler import ScalerHook
from .stats import (
    NORM,
    UPDATE_SAMPLE,
    UpdateSample,
    local,
    pnorm,
)
from .step import Drained, StepBuffers, StepClock
from .transfer import (
    Deferred,
    HostStep,
    finish,
    transfer,
)
from .watched import WatchedParams, on_registration

#: logged steps kept in ``GradMonitor.history`` by default (older ones are summed up)
HISTORY = 1000
#: full statistics (max/mean abs, zero fraction, update ratios) on one logged step in this many
FULL_EVERY = 50

# bound once (through torchcompat, which probes them): they run on every backward (the hooks)
# or every logged step
_graph_task_id = torchcompat.current_graph_task_id
_inference_mode = torchcompat.inference_mode


def _queue_callback(fn: Any) -> None:
    queue = torchcompat.queue_engine_callback
    if queue is None:
        raise UnsupportedSetupError(
            "this torch's autograd engine takes no final callback, so GradMonitor cannot see "
            "when a backward ends; pass optimizer= (the step then ends at optimizer.step())"
        )
    queue(fn)

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
            ``VANISH_PATIENCE`` logged steps is "vanishing" (exactly zero: "dead"); with the
            loss observed (``observe_loss``) and below 1, the level is ``vanish`` x the loss
            (gradients scale with it: a fitted batch is not vanishing). None: 1e-7, or the
            optimizer's ``eps`` when it has a smaller one (Adam and its kin move a weight
            whose gradient is above ``eps`` at half the learning rate or more:
            ``checks.vanish_level``).
        vanish_ratio: ... or whose per-element size stays below this fraction of the median
            per-element size of the model's parameters at the same step. None: 1e-4, or off
            (0) under an optimizer that divides each gradient by its running size (an
            ``eps`` in its groups: Adam and its kin move such a weight at about the
            learning rate however small it is next to the others: ``checks.adaptive``).
        explode: a norm above this (or ``SPIKE_FACTOR`` x its running median, twice what
            it reached lately: ``gradscope.monitor.spikes.jumps``, and ``SPIKE_GROWTH`` x the
            largest of its window: a jump, not a climb) alerts.
        spike, spike_window, spike_warmup: a total gradient norm, loss (``observe_loss``)
            or update ratio above ``spike`` x the median of its last ``spike_window`` logged
            values (the first ``spike_warmup`` logged ones ignored), and above twice the 99th
            percentile of its last 200, is a spike: one alert and one
            ``Incident(kind="spike")`` per event (``gradscope.monitor.spikes``).
            ``spike=None`` turns detection off (no spike alerts, incidents or replays).
        leaks: also watch for autograd graphs of earlier steps still alive at the next step
            (a loss kept without ``.detach()``), with ``gs.leak_check``; each leak is an
            ``Alert`` of kind ``leak``.
        history: keep the last ``history`` logged steps in ``.history`` (default 1000; None:
            all of them); what the older ones held is summed up in ``.log.dropped``.
        jsonl: also write every logged step to this JSON Lines file as it is recorded (one
            line per step, flushed; ``gs.read_jsonl`` reads it back), whatever ``history``.
        replay, loss_fn: replay the first bad step before ``optimizer.step()`` and name its
            origin in ``.incidents``; ``loss_fn(output, *targets)`` (``.target(...)``) lets it
            name the loss's op (see ``gradscope.monitor.replay``).
        thresholds: the six alert thresholds above as one ``Thresholds``
            (``thresholds=gs.Thresholds(explode=100.0)``), instead of the keywords; giving
            both is refused.

    Raises:
        MonitorError: arguments it cannot use; ``UnsupportedSetupError`` for a set-up it cannot
            measure (a tensor subclass, a DTensor with a Partial placement, ...).

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
        vanish: float | None = None,
        vanish_ratio: float | None = None,
        explode: float = 1e3,
        spike: float | None = 10.0,
        spike_window: int = 50,
        spike_warmup: int = 10,
        leaks: bool = False,
        history: int | None = HISTORY,
        jsonl: str | Path | None = None,
        replay: bool = True,
        loss_fn: Any = None,
        thresholds: Thresholds | None = None,
    ) -> None:
        # every argument is checked before anything is installed or opened
        check_args(model, every, norm_type, full_every, measure)
        if thresholds is not None:
            vanish, vanish_ratio, explode, spike, spike_window, spike_warmup = grouped_thresholds(
                thresholds, vanish=vanish, vanish_ratio=vanish_ratio, explode=explode,
                spike=spike, spike_window=spike_window, spike_warmup=spike_warmup,
            )
        # a torch.compile wrapper: its module's names (the wrapper is what the loop calls)
        called, model = model, dynamo.unwrap(model) or model
        check_options(replicated, update_sample, history)
        stream = check_stream_path(jsonl) if jsonl is not None else None
        self.norm_type = float(norm_type)
        self.optimizer = unwrap_optimizer(optimizer) if optimizer is not None else None
        self.vanish = vanish = vanish_level(self.optimizer) if vanish is None else vanish
        if vanish_ratio is None:  # the default: relative smallness matters to SGD, not Adam
            vanish_ratio = 0.0 if adaptive(self.optimizer) else VANISH_RATIO
        self.vanish_ratio = vanish_ratio
        self.explode = explode
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool)
                      for v in (spike_window, spike_warmup, *(() if spike is None else (spike,))))
        if not (numbers and (spike is None or spike > 1) and spike_window >= 1
                and spike_warmup >= 0):
            raise MonitorError(
                f"spike={spike!r}, spike_window={spike_window!r}, spike_warmup="
                f"{spike_warmup!r}: give a factor above 1 (or None: no spike detection), a "
                "window of at least one logged step and a warm-up of zero or more"
            )
        self.thresholds = Thresholds(
            vanish, vanish_ratio, explode, None if spike is None else float(spike),
            int(spike_window), int(spike_warmup),
        )
        self.measure = measure
        self.update_sample = update_sample
        self._scaler = check_scaler(scaler)
        self._model = model
        chosen = select_params(model, params)
        patterns = None if params is None else (
            [params] if isinstance(params, str) else list(params)
        )
        self._watched = WatchedParams(model, chosen, patterns, update_sample)
        self._topology = Topology(chosen, replicated, self.optimizer is not None, measure)
        chosen_modules = select_modules(model, modules)
        self._incidents = IncidentWatch(
            model, called, self._watched.params, self.norm_type, replay, self.optimizer, loss_fn
        )
        self._clock = StepClock(every, full_every)
        self._buffers = StepBuffers(len(chosen_modules))
        self._forward = ForwardWatch(
            model, chosen_modules, activations, clock=self._clock, buffers=self._buffers,
            norm_type=self.norm_type, guard=self._guard,
            unscale=lambda: inverse_scale(self._scaler, self.optimizer),
        )
        numels = dict(self._watched.numel_of)
        self._log = MonitorLog(
            names=list(self._watched.names), every=every, full_every=full_every,
            norm_type=self.norm_type, steps=[], alerts=[], numels=numels,
            thresholds=self.thresholds, cap=history,
            rules=AlertRules(self.thresholds, self.norm_type, numels),
        )
        # the step's transfer when the incident watch needed it before optimizer.step()
        self._host: HostStep | None = None
        # the update rows of such a step, moved with the next transfer
        self._deferred: Deferred | None = None
        self._checked_params = False
        self._entered = 0
        self._handles = HookHandle()
        self._leaks = LeakWatch() if leaks else None
        self._scaler_hook = (None if self._scaler is None or self.optimizer is None
                             else ScalerHook(self._scaler, self._scaler_skipped, self._guard))
        self._attach()
        self._handles.add(self._incidents.install())
        self._incidents.read_spikes(self._log.rules, self._spike_preview)
        if stream is not None:  # last: a refused monitor leaves an existing file as it was
            try:
                self._log.stream_to(stream)
            except BaseException:
                self.remove()
                raise

    # ------------------------------------------------------------------ state, read-only
    @property
    def every(self) -> int:
        return self._clock.every

    @property
    def full_every(self) -> int:
        return self._clock.full_every

    @property
    def step(self) -> int:
        """The steps seen so far (logged or not)."""
        return self._clock.step

    @property
    def names(self) -> list[str]:
        """The watched parameters' names, in model order."""
        return list(self._watched.names)

    @property
    def history(self) -> list[StepStats]:
        """The last ``history=`` logged steps (the log's list)."""
        return self._log.steps

    @property
    def alerts(self) -> list[Alert]:
        return self._log.alerts

    @property
    def distributed(self) -> str | None:
        """What the figures mean across processes (None without torch.distributed)."""
        return self._topology.description

    @property
    def log(self) -> MonitorLog:
        """The recorded history as plain data (the monitor's own log, the same lists)."""
        self._settle_deferred()
        return self._log

    @property
    def incidents(self) -> list[Incident]:
        """One ``Incident`` per event (non-finite gradients, an explosion): its first step."""
        return self._log.incidents

    # ------------------------------------------------------------------ hooks
    def _attach(self) -> None:
        add = self._handles.add
        self._accumulate_hook = self._clock.accumulate_hook(_graph_task_id,
                                                            self._backward_started)
        if self._topology.point == "backward":
            for p in self._watched.params:
                add(p.register_post_accumulate_grad_hook(self._accumulate_hook))
        if self.optimizer is not None:
            add(self.optimizer.register_step_pre_hook(self._before_step))
            add(self.optimizer.register_step_post_hook(self._after_step))
            if self._scaler_hook is not None:
                add(self._scaler_hook.install())
        # the first-forward check, modules= and activations=: one global forward pre/post hook
        # pair that Dynamo never sees (hooks on the modules would be traced into a compiled
        # graph and guarded on: a recompile when they go); modules that run inside a compiled
        # region have no forward call to hook. Needed only for the check, it goes after the
        # first step.
        self._global_hooks = dynamo.ModuleHooks(self._forward_pre, self._forward_done)
        add(self._global_hooks.install())
        # a parameter or submodule registered anywhere (a re-assigned weight, an added layer)
        # marks the model as possibly changed: it is re-read after the next logged step
        self._changed = False
        for handle in on_registration(self._mark_changed):
            add(handle)

    def _mark_changed(self, *args: Any) -> None:
        self._changed = True

    def _forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        if not self._checked_params and (dynamo.unwrap(module) or module) is self._model:
            self._checked_params = self._watched.first_forward()

    def _forward_done(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self._incidents.replaying:  # the replay's forward is not a step's
            self._forward.output(module, args, output)

    def remove(self) -> None:
        """Remove every hook gradscope added (safe to call twice); history and alerts stay."""
        self._handles.remove()
        if self._leaks is not None:
            self._leaks.remove()
        self._buffers.clear()
        self._host = None
        try:
            self._settle_deferred()
        except Exception:  # noqa: BLE001 - removing never fails (the ratios stay None)
            self._deferred = None
        self._log.close()

    def __enter__(self) -> GradMonitor:
        self._entered += 1
        return self

    def __exit__(self, *exc: object) -> None:
        # entered twice (a helper that enters the monitor it is given): the outer exit ends it
        self._entered -= 1
        if self._entered <= 0:
            self.remove()

    def target(self, *values: Any) -> None:
        """The targets of the micro-batch just run, for ``loss_fn(output, *values)``."""
        self._incidents.target(*values)

    def observe_loss(self, loss: Any) -> None:
        """The loss of the micro-batch just run (a one-element tensor; call it before
        ``backward()``, or before ``optimizer.step()`` with ``optimizer=``): the step's mean
        loss is read in the step's one transfer (``StepStats.loss``) and watched for spikes.
        Costs nothing on steps that are not logged."""
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            what = (f"a tensor of shape {list(loss.shape)}" if isinstance(loss, torch.Tensor)
                    else type(loss).__name__)
            raise MonitorError(
                f"observe_loss() takes the loss as a one-element tensor, got {what}; pass "
                "the reduced loss (loss.mean())"
            )
        if self._clock.logged():
            self._buffers.add_loss(loss.detach())

    def observe_batch_ids(self, ids: Any) -> None:
        """The data's own ids of the micro-batch about to run (one per example, in batch
        order): a spike's ``Incident.samples`` name examples by them."""
        self._incidents.batch_ids(ids)

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

    # ------------------------------------------------------------------ the step boundary
    def _backward_started(self) -> None:
        """The first watched gradient of a new backward was accumulated (the clock's hook)."""
        _queue_callback(self._backward_done)

    def _backward_done(self) -> None:
        self._clock.backward_ended()
        if not self._clock.logged():
            if self.optimizer is None:
                self._end_step()
            return
        # measure in a second callback, queued now: it runs after every callback queued during
        # the backward (DDP's gradient averaging is one), so it sees the final .grad
        _queue_callback(self._after_backward)

    def _after_backward(self) -> None:
        self._guard(self._measure_after_backward)

    def _measure_after_backward(self) -> None:
        with _inference_mode(True):
            measured = self._measure("backward")
            self._incidents.after_backward(measured.matrix[0])
        if self.optimizer is None:
            self._buffers.pending = measured
            self._finish_step(False)
        else:
            self._buffers.pending = measured  # the last backward before the step counts

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> Any:
        self._incidents.note_rate(optimizer)  # every step: a spike's likelier cause
        if not self._clock.logged():
            return None
        self._guard(self._measure_before_step, args, kwargs)
        if not self._incidents.wants_check():
            return None  # the step's transfer waits for its end
        return self._guard(self._incidents.before_step, self._transfer_now, args, kwargs)

    def _measure_before_step(self, args: Any, kwargs: Any) -> None:
        # the hook's args are step()'s, self first
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        topology = self._topology
        with _inference_mode(True):
            if topology.point == "optimizer":
                if closure is not None:
                    raise UnsupportedSetupError(
                        "optimizer.step(closure) runs the backward inside the step, so "
                        "measure='optimizer' cannot see the gradients it is given; use "
                        "measure='backward' (the default)"
                    )
                self._buffers.pending = self._measure("optimizer")
            elif topology.probe_now(closure is not None):
                self._buffers.probe = self._measure("optimizer")
            if self._clock.full_due():
                w = self._watched
                self._buffers.sample = UpdateSample(w.params, w.sample_k, w.seeds)

    def _transfer_now(self) -> bool | None:
        """At ``optimizer.step()``'s pre-hook, for the incident watch: the step's one
        transfer, now; whether its norms are finite (None: nothing measured yet)."""
        pending = self._buffers.pending
        if pending is None:
            return None
        if self._host is None or self._host.m is not pending:  # (a closure's later backward)
            with _inference_mode(True):
                d = self._buffers.drain()
                self._buffers.sample = d.sample  # taken after the step
                self._host = self._transfer(pending, None, d)
        host = self._host
        if host.agreed and host.ranks is not None:  # every rank is here, deciding alike
            self._incidents.ranks_agreed(host.ranks, self._forward.act_names)
        return host.finite()

    def _spike_preview(self) -> bool:
        """Whether the step just moved to the host (at ``optimizer.step()``'s pre-hook)
        starts a spike event: its micro-batch is then replayed for per-sample norms."""
        host, rule = self._host, self._log.rules.spikes
        if host is None or rule is None:
            return False
        total = pnorm(host.table[NORM], self.norm_type)
        return bool(rule.would_start({"grad_norm": total, "loss": host.loss}))

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._scaler_hook is not None:
            self._scaler_hook.stepped()
        if not self._clock.logged():
            self._end_step()
            return
        self._guard(self._finish_step, False)

    def _scaler_skipped(self) -> None:
        """``scaler.update()`` ended a step whose ``optimizer.step()`` the scaler skipped."""
        if self._clock.logged():
            self._finish_step(True)
        else:
            self._end_step()

    def _finish_step(self, skipped: bool) -> None:
        """A logged step ends: measure -> transfer -> stats -> log -> incident -> clock, and
        the parameters re-read after the record."""
        deferred = None
        with _inference_mode(True):
            d = self._buffers.drain()
            host, self._host = self._host, None
            if host is not None:  # moved at the step's pre-hook: its update rows wait
                if d.sample is not None and not skipped:
                    deferred = Deferred(self.step, d.sample.rows(host.m.cols), host.m,
                                        self._watched, self._topology)
            else:
                measured = d.measure
                if measured is None:  # no backward since the last step: gradients set by hand
                    measured = self._measure("optimizer")
                update = None
                if d.sample is not None and not skipped:
                    update = d.sample.rows(measured.cols)
                host = self._transfer(measured, update, d)
        self._record(host, skipped, deferred)

    def _transfer(self, m: Measure, update: torch.Tensor | None, d: Drained) -> HostStep:
        previous, self._deferred = self._deferred, None
        loss = None
        if d.losses:  # the micro-batches' mean loss, moved with the rest
            # float64 (a float64 loss of 1e39 is not inf), where the device has it (not MPS)
            wide = torch.float32 if d.losses[0].device.type == "mps" else torch.float64
            loss = torch.stack([x.reshape(()).to(wide) for x in d.losses]).mean()
        return transfer(
            m, topology=self._topology, norm_type=self.norm_type, update=update,
            probe=d.probe, module_calls=d.module_calls, flags=d.flags, previous=previous,
            loss=loss,
        )

    def _record(self, host: HostStep, skipped: bool, deferred: Deferred | None) -> None:
        log = self._log
        if host.previous is not None:
            log.complete(*host.previous, explain=self._incidents.update_cause)
        st = finish(
            host, step=self.step, watched=self._watched, topology=self._topology,
            norm_type=self.norm_type, module_names=self._forward.module_names,
            act_names=self._forward.act_names, skipped=skipped,
            scaler_skips=self._scaler is not None and self.optimizer is None,
        )
        log.distributed = self._topology.description
        if host.ranks is not None:
            self._incidents.ranks_seen(host.ranks, self._forward.act_names, host.agreed)
        log.append(st, self._incidents.record, hold=deferred is not None,
                   explain=self._incidents.update_cause)
        self._deferred = deferred
        self._topology.probed()  # only the first logged step is probed
        self._end_step()

    def _settle_deferred(self) -> None:
        """The update ratios still on the device (the last full step's), moved now."""
        deferred, self._deferred = self._deferred, None
        if deferred is not None:
            with _inference_mode(True):
                self._log.complete(deferred.step, deferred.to_host(),
                                   explain=self._incidents.update_cause)

    def _end_step(self) -> None:
        """The current step is over: count it, re-read the parameters when the model changed
        (before a logged step), and look for graphs of earlier steps still alive."""
        if not self._forward.needs_hooks:
            # only the first-forward check needed them, and its forward is over (idempotent)
            self._global_hooks.remove()
        step = self.step
        self._clock.advance()
        self._buffers.clear()
        if self._changed and self._checked_params and self._clock.logged():
            self._changed = False
            self._rewatch()
        self._incidents.end_step()
        if self._leaks is not None:
            for alert in self._leaks.step(step):
                self._log.add_alert(alert)

    def _rewatch(self) -> None:
        """Watch the parameters the model has now, if they changed (after a record: every
        step is named from the snapshot it was measured with)."""
        refreshed = self._watched.refreshed(self.step, self._topology.sharding is not None)
        if refreshed is None:
            return
        self._watched, new = refreshed
        if not new and self._watched.frozen is not None:
            return
        self._log.rewatch(list(self._watched.names), dict(self._watched.numel_of))
        self._incidents.watch(self._watched.params)  # the replay differentiates these
        if self._topology.point == "backward":
            for p in new:
                self._handles.add(p.register_post_accumulate_grad_hook(self._accumulate_hook))

    # ------------------------------------------------------------------ measuring
    def _measure(self, at: str) -> Measure:
        """Queue this step's statistics on the device (no host sync); under inference mode."""
        params = self._watched.params
        first = params[0]
        device = local(first).device if self._topology.sharding is not None else first.device
        inv = inverse_scale(self._scaler, self.optimizer)
        return measure(params, self.norm_type, at, self._clock.full_due(), inv, device,
                       self._watched.layout)

    # ------------------------------------------------------------------ views
    def report(self, *, width: int = 24) -> Any:
        """A rich renderable: one row per parameter (model order) with the latest norm, a
        sparkline of its history, max abs, non-finite counts and a status; then a summary line.

        Example:
            >>> rich.console.Console().print(mon.report())   # doctest: +SKIP
        """
        return self.log.report(width=width)

    def to_jsonl(self, path: str | Path) -> Path:
        """Write JSON Lines, one object per logged step (non-finite floats as ``"nan"``,
        ``"inf"``, ``"-inf"``; counts are exact); ``gs.read_jsonl`` reads it back."""
        return self.log.to_jsonl(path)

    def to_json(self, path: str | Path) -> Path:
        """Write the same records as one JSON document (``"steps"``: one per logged step);
        ``gs.read_jsonl`` reads it back."""
        return self.log.to_json(path)

    def to_csv(self, path: str | Path) -> Path:
        """Write one CSV row per (logged step, parameter)."""
        return self.log.to_csv(path)

    def to_tensorboard(self, writer: Any) -> None:
        """Log scalars (total and per-parameter norms, update ratios) and per-step histograms of
        the per-parameter norms to a ``torch.utils.tensorboard.SummaryWriter`` (or any object with
        ``add_scalar`` and ``add_histogram``)."""
        renderer("monitor_tensorboard")(self.log, writer)

    def plot(self, path: str | Path) -> Path:
        """Save a PNG: each parameter's gradient norm over the logged steps and the total norm
        over steps, non-finite and skipped steps marked. Needs matplotlib
        (``pip install "torch-gradscope[plot]"``)."""
        return renderer("monitor_plot")(self.log, Path(path))


