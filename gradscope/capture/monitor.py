"""``GradMonitor``: per-parameter gradient statistics while a model trains.

Cost (see ``monitor_stats`` for the detail): a logged step reads the gradients once for the
per-parameter norms (``torch._foreach_norm``) and moves one packed vector to the host; NaN and
Inf are detected from the norms and counted exactly only on a step that has them. Max/mean abs,
the zero fraction and the update-to-weight ratios (sampled) run on every ``full_every``-th
logged step; module statistics and activation checks only when asked for. A step that is not
logged runs no tensor op.

Which gradients, and when the step ends:
    * without ``optimizer=``, every backward that accumulates into a watched ``.grad`` is a
      step; the gradients are measured when it ends (post-accumulate-grad hooks queue a
      callback on the autograd engine; a second callback, queued from the first, runs after
      every callback queued during the backward, such as DDP's gradient averaging and FSDP2's
      reduce-scatter, so it sees the final ``.grad``);
    * with ``optimizer=`` the step ends at ``optimizer.step()`` (its post hook), and by default
      (``measure="backward"``) the gradients are those the last backward before it left: each
      backward of a logged step measures them on the device when it ends, the last one
      counts, so under gradient accumulation the figures are those of the accumulated
      gradient after the last micro-batch, and clipping (which runs between the backward and
      the step) is not seen: an explosion stays visible. ``measure="optimizer"`` measures at
      ``optimizer.step()`` instead: what the optimizer is given (after clipping). A step with
      no backward since the previous one (gradients set by hand) is measured at the step.
    * with ``scaler=`` (a ``torch.amp.GradScaler``) the norms are unscaled, and a step that
      the scaler skipped (non-finite gradients) is recorded with ``skipped=True`` and raises no
      alert; with ``optimizer=`` such a step ends at ``scaler.update()`` (the monitor wraps
      that method of the scaler instance, and unwraps it on ``remove()``).

Across processes (``torch.distributed`` initialised) the figures are global or labelled:
    * DTensor parameters (FSDP2 ``fully_shard``): each rank measures its shards; one
      all-gather over the sharding mesh dimension per logged step combines them (sums of
      p-th powers and of |g|, counts, maxima), so every rank reports the whole tensors;
    * other parameters: whether the ranks' gradients are identical (DDP however it was
      wrapped; hand-written all-reduce data parallelism) is detected at every logged step from
      a checksum of the per-parameter norms (one all-gather of three numbers per rank), or
      declared with ``replicated=``. Identical gradients are reported as they are (``scope``
      "global"); different ones are this rank's own (``scope`` "rank N"), never summed into a
      figure that means nothing. With ``optimizer=``, when the gradients are not identical
      when backward ends but are at ``optimizer.step()`` (all-reduced by hand in between),
      the monitor measures at the step from then on (``measured_at="optimizer"``).
"""

from __future__ import annotations

import fnmatch
import math
import statistics
import warnings
import zlib
from collections import deque
from collections.abc import Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed

from ..errors import GradscopeError, MonitorError, MonitorWarning, UnsupportedSetupError
from ..model.formats import renderer
from ..model.incident import Incident
from ..model.monitor import Alert, MonitorLog, ParamStats, StepStats
from . import compiled
from . import monitor_stats as S
from .handles import HookHandle
from .nest import iter_tensors
from .replay import IncidentWatch

#: a parameter is "vanishing" or "dead" after this many consecutive logged steps
VANISH_PATIENCE = 3
#: a norm this many times above the running median of its last logged norms is "exploding"
SPIKE_FACTOR = 10.0
#: the running median needs at least this many earlier logged norms
SPIKE_MIN_HISTORY = 5
#: full statistics (max/mean abs, zero fraction, update ratios) on one logged step in this many
FULL_EVERY = 50
_SPIKE_WINDOW = 25
_MEDIAN_EVERY = 5

MEASURE_POINTS = ("backward", "optimizer")


# ---------------------------------------------------------------- set-up checks
def _select_modules(
    model: torch.nn.Module, modules: bool | str | Iterable[str]
) -> list[tuple[str, torch.nn.Module]]:
    """The submodules ``modules=`` names: True for all, False for none, else names or globs
    (``"encoder.*"``), each of which must match at least one submodule."""
    if isinstance(modules, bool):
        return [(n, m) for n, m in model.named_modules() if n] if modules else []
    patterns = [modules] if isinstance(modules, str) else list(modules)
    if not all(isinstance(p, str) for p in patterns):
        raise MonitorError(
            f"modules={modules!r} must be True, False, or submodule names/globs such as "
            "'encoder.layers.*'"
        )
    named = [(n, m) for n, m in model.named_modules() if n]
    unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n, _ in named)]
    if unknown:
        shown = ", ".join(n for n, _ in named[:8]) + (", ..." if len(named) > 8 else "")
        raise MonitorError(
            f"modules= names no submodule of {type(model).__name__}: {', '.join(unknown)}; "
            f"give names as in named_modules() or globs (its submodules: {shown or 'none'})"
        )
    return [(n, m) for n, m in named if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def _select(
    model: torch.nn.Module, params: str | Iterable[str] | None
) -> list[tuple[str, torch.nn.Parameter]]:
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if params is None:
        chosen = named
    else:
        patterns = [params] if isinstance(params, str) else list(params)
        chosen = [(n, p) for n, p in named if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)]
        if not chosen:
            shown = ", ".join(n for n, _ in named[:6]) + (", ..." if len(named) > 6 else "")
            raise MonitorError(
                f"params={patterns!r} matches no trainable parameter of {type(model).__name__}; "
                f"give names or globs such as 'encoder.*' (its parameters: {shown or 'none'})"
            )
    if not chosen:
        raise MonitorError(
            f"{type(model).__name__} has no parameter with requires_grad=True to monitor; "
            "pass the model being trained"
        )
    devices = sorted({str(p.device) for _, p in chosen})
    if len(devices) > 1:
        # the statistics of one step are packed into one tensor on one device
        raise MonitorError(
            f"the watched parameters are on several devices ({', '.join(devices)}); "
            "use one GradMonitor per device, selecting its parameters with params=..."
        )
    for name, p in chosen:
        _check_tensor_type(name, p)
    return chosen


def _check_tensor_type(name: str, p: torch.Tensor) -> None:
    if _is_dtensor(p):
        return
    if isinstance(p, torch.nn.parameter.UninitializedParameter):
        raise UnsupportedSetupError(
            f"parameter {name} is not initialised yet (a lazy module); run one forward "
            "before building the GradMonitor"
        )
    # a Python subclass of Parameter is a plain tensor; one with its own __torch_dispatch__
    # (quantised or packed weights) is not something the norms can be read from
    if type(p).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        raise UnsupportedSetupError(
            f"parameter {name} is a {type(p).__name__}, a tensor subclass GradMonitor cannot "
            "measure (it knows plain tensors and DTensor); leave it out with params=[...]"
        )


def _is_dtensor(t: Any) -> bool:
    return _DTensor is not None and isinstance(t, _DTensor)


def _check_args(model: Any, every: Any, norm_type: Any, full_every: Any, measure: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise MonitorError(
            f"GradMonitor needs an nn.Module, got {type(model).__name__}; "
            "pass the model being trained"
        )
    for name, value in (("every", every), ("full_every", full_every)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MonitorError(f"{name}={value!r} must be a positive integer (1: every step)")
    if not isinstance(norm_type, (int, float)) or isinstance(norm_type, bool) or not norm_type > 0:
        raise MonitorError(f"norm_type={norm_type!r} must be a positive number or math.inf")
    if measure not in MEASURE_POINTS:
        raise MonitorError(
            f"measure={measure!r} must be 'backward' (the gradients as backward left them, "
            "before clipping) or 'optimizer' (what optimizer.step() is given)"
        )


def _unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside a wrapper (accelerate's AcceleratedOptimizer, Lightning's
    LightningOptimizer): step hooks run only on the optimizer whose step() does the work."""
    inner = optimizer
    for _ in range(4):
        nested = getattr(inner, "optimizer", None) or getattr(inner, "_optimizer", None)
        if isinstance(nested, torch.optim.Optimizer) and nested is not inner:
            inner = nested
        else:
            break
    if not isinstance(inner, torch.optim.Optimizer):
        raise MonitorError(
            f"optimizer= must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    return inner


def _check_scaler(scaler: Any) -> Any:
    if scaler is None:
        return None
    if not isinstance(scaler, torch.amp.GradScaler):
        raise MonitorError(
            f"scaler= must be a torch.amp.GradScaler, got {type(scaler).__name__}"
        )
    return scaler if scaler.is_enabled() else None


try:  # DTensor: the gradients of FSDP2 and tensor parallelism
    from torch.distributed.tensor import DTensor as _DTensor
except ImportError:  # pragma: no cover - torch without distributed
    _DTensor = None  # type: ignore[assignment,misc]


class _Sharding:
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


# bound once: they run on every backward (the hooks) or every logged step
_engine_callback = torch.autograd.Variable._execution_engine.queue_callback  # type: ignore
_graph_task_id = torch._C._current_graph_task_id
# the C++ guard behind torch.inference_mode(), without its Python wrapper
_inference_mode = torch._C._InferenceMode


class _Measure:
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
    ) -> None:
        self.inv = inv  # 1 / the GradScaler's scale, when the gradients were still scaled
        self.matrix = matrix  # [rows, len(cols)]: NORM (+ MAX_ABS, SUM_ABS, NONZERO)
        self.cols = cols  # column j: parameter index cols[j]
        self.grads = grads  # the gradient tensors measured (column order)
        self.versions = [S.local(g)._version for g in grads]
        self.at = at
        self.full = full


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
        replay: with ``optimizer=``, keep what each micro-batch needs to run again (input
            references, RNG states, the gradient reaching the outputs) and, when a logged
            step's gradients turn non-finite, replay the bad micro-batch before
            ``optimizer.step()`` to name the origin (``.incidents``). See
            ``gradscope.capture.replay``.
        loss_fn: ``loss_fn(output)`` or ``loss_fn(output, *targets)`` (targets given with
            ``.target(...)``): lets a replay name the loss's own op when the gradient
            reaching the model's outputs was already non-finite.

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
        update_sample: int = S.UPDATE_SAMPLE,
        scaler: Any = None,
        replicated: bool | None = None,
        vanish: float = 1e-7,
        vanish_ratio: float = 1e-4,
        explode: float = 1e3,
        leaks: bool = False,
        replay: bool = True,
        loss_fn: Any = None,
    ) -> None:
        _check_args(model, every, norm_type, full_every, measure)
        called = model  # what the loop calls (a torch.compile wrapper stays one)
        model = compiled.unwrap(model) or model  # a torch.compile wrapper: its module's names
        if replicated not in (None, True, False):
            raise MonitorError(f"replicated={replicated!r} must be None (detect), True or False")
        if isinstance(update_sample, bool) or not isinstance(update_sample, int) or (
            update_sample < 1
        ):
            raise MonitorError(f"update_sample={update_sample!r} must be a positive integer")
        self.every = every
        self.full_every = full_every
        self.norm_type = float(norm_type)
        self.vanish = vanish
        self.vanish_ratio = vanish_ratio
        self.explode = explode
        self.optimizer = _unwrap_optimizer(optimizer) if optimizer is not None else None
        self.measure = measure
        self.update_sample = update_sample
        self._scaler = _check_scaler(scaler)
        self._model = model
        chosen = _select(model, params)
        self.names = [n for n, _ in chosen]
        self._params = [p for _, p in chosen]
        # per tensor, lowered on a large model with many tensors (the sample's memory bound)
        self._sample_k = S.sample_size([p.numel() for p in self._params], update_sample)
        self._replicated = replicated
        self._sharding = self._sharding_of(chosen)
        # the step's gradients are measured when the last backward ends, or at the step
        self._point = measure if self.optimizer is not None else "backward"
        # one-off: are hand-all-reduced gradients identical only at optimizer.step()?
        self._dp_probe = self.optimizer is not None and measure == "backward"
        # the same lattice on every run and rank (str hash() is salted per process)
        self._seeds = [zlib.crc32(n.encode()) for n in self.names]
        self._modules = _select_modules(model, modules)
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
        self._handles = HookHandle()
        self._queued = -1
        self._pending: _Measure | None = None
        self._probe: _Measure | None = None
        self._sample: S.UpdateSample | None = None
        self._stepped = False
        self._checked_params = False
        self._alert_state = _AlertState()
        self._leak_check: Any = None
        self._leak_alerted: set[int] = set()
        self.distributed: str | None = None
        if leaks:
            from .memory import LeakCheck  # saved-tensor hooks: only when asked for

            self._leak_check = LeakCheck(grace=1, warn=False).start()
        # incidents (gradscope.capture.replay): the first bad step replayed, its origin named
        if loss_fn is not None and not callable(loss_fn):
            raise MonitorError(f"loss_fn= must be callable, got {type(loss_fn).__name__}")
        self._incidents = IncidentWatch(
            model, called, self._params, self.norm_type, replay=bool(replay),
            optimizer=self.optimizer, loss_fn=loss_fn,
        )
        self._attach(model, activations)
        self._handles.add(self._incidents.install())

    def _sharding_of(self, chosen: list[tuple[str, torch.nn.Parameter]]) -> _Sharding | None:
        flags = [_is_dtensor(p) for _, p in chosen]
        if not any(flags):
            return None
        if not all(flags):
            plain = next(n for (n, _), f in zip(chosen, flags, strict=True) if not f)
            raise UnsupportedSetupError(
                f"some watched parameters are DTensors and some (such as {plain}) are not; "
                "monitor the sharded and the plain ones with two GradMonitors (params=...)"
            )
        if not _distributed():
            raise UnsupportedSetupError(
                "the parameters are DTensors but torch.distributed is not initialised; build "
                "the GradMonitor after init_process_group and fully_shard"
            )
        sharding = _Sharding([n for n, _ in chosen], [p for _, p in chosen])
        if sharding.dim is None:  # replicated DTensors: every rank holds all of every tensor
            if self._replicated is None:
                self._replicated = True
            return None
        return sharding

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
        self._global_hooks = compiled.ModuleHooks(self._forward_pre, self._forward_done)
        add(self._global_hooks.install())

    def _forward_pre(self, module: torch.nn.Module, args: Any) -> None:
        if self._incidents.replaying:
            return
        if not self._checked_params and (compiled.unwrap(module) or module) is self._model:
            self._first_forward(module, args)

    def _forward_done(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._incidents.replaying:
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
            incidents=self._incidents.incidents,
        )

    @property
    def incidents(self) -> list[Incident]:
        """One ``Incident`` per event (gradients turning non-finite, the norm exploding): the
        first bad step, replayed with ``replay=True``, and where it started."""
        return self._incidents.incidents

    def target(self, *values: Any) -> None:
        """The targets of the micro-batch just run (after the model's forward), so a replay
        can recompute ``loss_fn(output, *values)`` when the loss made the first NaN/Inf."""
        self._incidents.target(*values)

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
        self._incidents.end_step()
        if self._leak_check is None:
            return
        for leak in self._leak_check.step().leaks:
            if leak.step not in self._leak_alerted:
                self._leak_alerted.add(leak.step)
                self.alerts.append(Alert("leak", step, f"step {leak.step}", str(leak)))

    def _first_forward(self, module: torch.nn.Module, args: Any) -> None:
        if self._checked_params:
            return
        self._checked_params = True
        current = dict(self._model.named_parameters())
        for name, p in zip(self.names, self._params, strict=True):
            if current.get(name) is not p:
                raise UnsupportedSetupError(
                    f"parameter {name} of the model is no longer the tensor the GradMonitor "
                    "was built on (fully_shard, .to() or a re-assignment replaced it); build "
                    "the GradMonitor after wrapping and moving the model"
                )

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
        with _inference_mode(True):
            measured = self._measure("backward")
        if self.optimizer is not None:
            self._incidents.after_backward(measured.matrix[0])
        if self.optimizer is None:
            self._finish(measured, None)
        else:
            self._pending = measured  # the last backward before the step counts

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._logged():
            self._guard(self._measure_before_step, args, kwargs)
            pending = self._pending
            self._guard(self._incidents.before_step, None if pending is None else pending.matrix[0])

    def _measure_before_step(self, args: Any, kwargs: Any) -> None:
        # the hook's args are step()'s, self first
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        with _inference_mode(True):
            if self._point == "optimizer":
                if closure is not None:
                    raise UnsupportedSetupError(
                        "optimizer.step(closure) runs the backward inside the step, so "
                        "measure='optimizer' cannot see the gradients it is given; use "
                        "measure='backward' (the default)"
                    )
                self._pending = self._measure("optimizer")
            elif self._dp_probe and _distributed() and self._needs_check() and closure is None:
                self._probe = self._measure("optimizer")
            if self.optimizer is not None and self._full_due():
                self._sample = S.UpdateSample(self._params, self._sample_k, self._seeds)

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._stepped = True
        if not self._logged():
            self._advance()
            return
        self._guard(self._finish_step, False)

    def _finish_step(self, skipped: bool) -> None:
        with _inference_mode(True):
            measured = self._pending
            if measured is None:  # no backward since the last step: gradients set by hand
                measured = self._measure("optimizer")
            update = None
            if self._sample is not None and not skipped:
                update = self._sample.rows(measured.cols)
        self._finish(measured, update, skipped=skipped)

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
            row = S.module_row(grad, self.norm_type)
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
                if t.is_floating_point() or t.is_complex():
                    self._act_flags.append((index, ~torch.isfinite(t.detach()).all()))

    # ------------------------------------------------------------------ measuring
    def _measure(self, at: str) -> _Measure:
        """Queue this step's statistics on the device (no host sync). Call it under inference
        mode. Parameters without a gradient (or without elements) get no column."""
        full = self._full_due()
        sharded = self._sharding is not None
        cols, grads, tensors, sparse = [], [], [], []
        for i, p in enumerate(self._params):
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
            device = self._params[0].device if not sharded else S.local(self._params[0]).device
            empty = torch.zeros(S.FULL_ROWS if full else 1, 0, dtype=torch.float64, device=device)
            return _Measure(empty, [], [], at, full)
        if sparse:
            matrix = self._measure_with_sparse(tensors, sparse, full)
        else:
            norms, order = S.norms(tensors, self.norm_type)
            if order != list(range(len(order))):
                cols = [cols[o] for o in order]
                grads = [grads[o] for o in order]
            if full:
                matrix = torch.cat([norms.to(torch.float64)[None], S.full_rows(tensors, order)])
            else:
                matrix = norms[None]
        inv = self._inverse_scale()
        if inv is not None:
            matrix = _unscaled(matrix, inv)
        return _Measure(matrix, cols, grads, at, full, inv)

    def _measure_with_sparse(
        self, tensors: list[torch.Tensor], sparse: list[int], full: bool
    ) -> torch.Tensor:
        dense = [i for i in range(len(tensors)) if i not in set(sparse)]
        columns: list[torch.Tensor | None] = [None] * len(tensors)
        if dense:
            part = [tensors[i] for i in dense]
            norms, order = S.norms(part, self.norm_type)
            rows = [norms.to(torch.float64)[None]]
            if full:
                rows.append(S.full_rows(part, order))
            block = torch.cat(rows)
            for j, o in enumerate(order):
                columns[dense[o]] = block[:, j]
        for i in sparse:
            columns[i] = S.sparse_stats(tensors[i], self.norm_type)[: S.FULL_ROWS if full else 1]
        return torch.stack(columns, dim=1)  # type: ignore[arg-type]

    def _inverse_scale(self) -> torch.Tensor | None:
        """1 / the GradScaler's scale (a device tensor) while the gradients are still scaled
        (before ``scaler.unscale_`` or ``scaler.step``); None otherwise."""
        scaler = self._scaler
        if scaler is None or getattr(scaler, "_scale", None) is None:
            return None
        if self.optimizer is not None:
            from torch.amp.grad_scaler import OptState

            state = scaler._per_optimizer_states.get(id(self.optimizer))
            if state is not None and state["stage"] is not OptState.READY:
                return None  # already unscaled
        return scaler._scale.to(torch.float64).reciprocal()

    # ------------------------------------------------------------------ one transfer
    def _needs_check(self) -> bool:
        return self._sharding is None and self._replicated is None

    def _finish(self, m: _Measure, update: torch.Tensor | None, *, skipped: bool = False) -> None:
        """Reduce across ranks, move everything to the host in ONE transfer, record the step."""
        step = self.step
        dist_on = _distributed()
        # a single process: nothing to combine (one rank is its own global)
        replicas = dist_on and torch.distributed.get_world_size() > 1
        probe = self._probe if replicas else None
        self._advance()
        self._dp_probe = False  # only the first logged step is probed
        local = m.matrix.to(torch.float64)
        if update is not None:
            local = torch.cat([local, update])
        sharding = self._sharding if dist_on else None
        checking = replicas and self._needs_check()
        # what travels: this rank's matrix (or every rank's shards), the replication checksums
        # and the probe, module rows, activation flags
        parts = [_all_gather(local, sharding.group) if sharding else local.reshape(-1)]
        if checking:
            sums = [_checksum(m.matrix[0])] + ([_checksum(probe.matrix[0])] if probe else [])
            parts.append(_all_gather(torch.cat(sums), None))
            if probe is not None:
                parts.append(probe.matrix.to(torch.float64).reshape(-1))
        mod_calls = [(i, c) for i, calls in enumerate(self._module_calls) for c in calls]
        for calls in self._module_calls:
            calls.clear()
        if mod_calls:
            parts.append(torch.stack([c for _, c in mod_calls]).reshape(-1))
        flags, self._act_flags = self._act_flags, []
        if flags:
            parts.append(torch.stack([f for _, f in flags]).to(torch.float64))
        device = local.device
        packed = parts[0] if len(parts) == 1 else torch.cat([p.to(device) for p in parts])
        reader = _Reader(packed.tolist())  # the one device-to-host transfer of this step

        rows, ncol = local.shape
        kinds = ["norm"] + (["max", "sum", "sum"] if m.full else [])
        kinds += ["norm2", "norm2"] if update is not None else []
        scope: str | None = None
        if sharding is not None:
            per_rank = [reader.rows(rows, ncol) for _ in range(sharding.world)]
            table = self._combine_shards(per_rank, kinds, m.cols)
            scope = "global"
            self.distributed = f"sharded (DTensor): shards combined over {sharding.world} ranks"
        else:
            table = reader.rows(rows, ncol)
        if checking:
            world = torch.distributed.get_world_size()
            width = 3 * (2 if probe is not None else 1)
            sums = reader.take(world * width)
            same = _replicated(sums, world, width, 0)
            if probe is not None:
                probe_rows = reader.rows(probe.matrix.shape[0], len(probe.cols))
                if not same and _replicated(sums, world, width, 3):
                    # the ranks all-reduce the gradients by hand after backward: from now on
                    # the step's gradients are the ones optimizer.step() is given
                    self._point = "optimizer"
                    m, same = probe, True
                    table = probe_rows + (table[-2:] if update is not None else [])
            scope = self._scope(same)
        elif replicas and sharding is None:
            scope = self._scope(bool(self._replicated))
        mods: dict[int, list[list[float]]] = {}
        for i, _ in mod_calls:
            mods.setdefault(i, []).append(reader.take(S.MODULE_ROW))
        bad = [(i, v) for (i, _), v in zip(flags, reader.take(len(flags)), strict=True)]
        counts = self._count_nonfinite(m, table[S.NORM], sharding is not None)
        if self._scaler is not None and self.optimizer is None:
            # the scaler skips every step whose gradients are not all finite
            skipped = any(not math.isfinite(v) for v in table[S.NORM])
        self._record(step, m, table, counts, mods, bad, skipped, scope, update is not None)

    def _scope(self, same: bool) -> str:
        self._describe(same)
        return "global" if same else f"rank {torch.distributed.get_rank()}"

    def _describe(self, same: bool) -> None:
        world = torch.distributed.get_world_size()
        how = "declared" if self._replicated is not None else "detected"
        if same:
            self.distributed = f"replicated across {world} ranks ({how}): figures are global"
        else:
            self.distributed = (
                f"rank {torch.distributed.get_rank()} of {world}: the ranks' gradients differ "
                f"({how}), so these figures are this rank's own"
            )

    def _combine_shards(
        self, per_rank: list[list[list[float]]], kinds: list[str], cols: list[int]
    ) -> list[list[float]]:
        whole = S.combine_shards(per_rank, kinds, self.norm_type)
        sharded = self._sharding.sharded  # type: ignore[union-attr]
        if all(sharded[c] for c in cols):
            return whole
        # a parameter replicated on the sharding dimension: every rank holds all of it
        for i, row in enumerate(whole):
            for j, c in enumerate(cols):
                if not sharded[c]:
                    row[j] = per_rank[0][i][j]
        return whole

    def _count_nonfinite(
        self, m: _Measure, norms: list[float], sharded: bool
    ) -> dict[int, tuple[int | None, int | None, float]]:
        """Exact NaN/Inf counts of the columns whose norm is not finite (a second transfer, on
        such steps only): column -> (nan, inf, norm in float64)."""
        isfinite = math.isfinite
        bad = [j for j, v in enumerate(norms) if not isfinite(v)]
        if not bad:
            return {}
        tensors = [S.local(m.grads[j]).detach() for j in bad]
        changed = [
            self._params[m.cols[j]].grad is not m.grads[j]
            or S.local(m.grads[j])._version != m.versions[j]
            for j in bad
        ]
        with _inference_mode(True):
            counts = S.nonfinite_counts(tensors, self.norm_type)
            if m.inv is not None:  # the float64 norms of scaled gradients
                counts = torch.cat([counts[:2], counts[2:] * m.inv.to(counts)])
            if sharded:
                counts = _all_gather(counts, self._sharding.group)  # type: ignore[union-attr]
            values = counts.tolist()
        if sharded:
            reader = _Reader(values)
            world = self._sharding.world  # type: ignore[union-attr]
            per_rank = [reader.rows(3, len(bad)) for _ in range(world)]
            values = S.combine_shards(per_rank, ["sum", "sum", "norm"], self.norm_type)
        out = {}
        for k, j in enumerate(bad):
            if changed[k]:
                out[j] = (None, None, norms[j])
            else:
                out[j] = (int(values[0][k]), int(values[1][k]), values[2][k])
        return out

    def _record(
        self,
        step: int,
        m: _Measure,
        table: list[list[float]],
        counts: dict[int, tuple[int | None, int | None, float]],
        mods: dict[int, list[list[float]]] | None,
        flags: list[tuple[int, float]],
        skipped: bool,
        scope: str | None,
        with_update: bool,
    ) -> None:
        params = _param_stats(
            self.names, self._params, m.cols, table, counts, m.full, with_update
        )
        modules = _module_stats(self._module_names, mods, self.norm_type) if mods else {}
        total = S.pnorm([ps.norm for ps in params.values()], self.norm_type)
        st = StepStats(
            step=step,
            total_norm=total,
            params=params,
            modules=modules,
            full=m.full,
            skipped=skipped,
            scope=scope,
            measured_at=m.at,
        )
        self.history.append(st)
        first_bad = next((self._act_names[i] for i, v in flags if v), None) if flags else None
        alerts = self._alert_state.update(st, first_bad, self._numels(), self._thresholds())
        alerts = self._incidents.record(st, alerts)
        if alerts:
            self.alerts.extend(alerts)

    def _numels(self) -> dict[str, int]:
        found = getattr(self, "_numel_cache", None)
        if found is None:
            found = self._numel_cache = {n: p.numel() for n, p in zip(self.names, self._params)}
        return found

    def _thresholds(self) -> tuple[float, float, float, float]:
        return self.vanish, self.vanish_ratio, self.explode, self.norm_type

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


def _distributed() -> bool:
    return _DIST_AVAILABLE and torch.distributed.is_initialized()


def _unscaled(matrix: torch.Tensor, inv: torch.Tensor) -> torch.Tensor:
    """The rows of a measurement of scaled gradients, unscaled: norm, max abs and sum |g|
    scale with the gradients; the non-zero count does not."""
    out = matrix.to(torch.float64)
    inv = inv.to(out.device)
    if out.shape[0] == 1:
        return out * inv
    out = out.clone()
    out[: S.SUM_ABS + 1] *= inv
    return out


_DIST_AVAILABLE = torch.distributed.is_available()


def _all_gather(t: torch.Tensor, group: Any) -> torch.Tensor:
    """Every rank's ``t`` (flattened), concatenated in rank order: one collective."""
    world = torch.distributed.get_world_size(group)
    flat = t.reshape(-1).contiguous()
    out = torch.empty(world * flat.numel(), dtype=flat.dtype, device=flat.device)
    _gather_into(out, flat, group=group)
    return out


# all_gather_single is the name of the one-tensor all-gather from torch 2.13 on, where
# all_gather_into_tensor warns that it is deprecated
_gather_into = getattr(torch.distributed, "all_gather_single", None) or getattr(
    torch.distributed, "all_gather_into_tensor", None
)


class _Reader:
    """Reads the host list of a step's packed vector front to back."""

    def __init__(self, values: list[float]) -> None:
        self.values = values
        self.pos = 0

    def take(self, n: int) -> list[float]:
        out = self.values[self.pos : self.pos + n]
        self.pos += n
        return out

    def rows(self, rows: int, cols: int) -> list[list[float]]:
        return [self.take(cols) for _ in range(rows)]


_CHECK_WEIGHTS: dict[tuple[int, torch.device], torch.Tensor] = {}


def _checksum(norms: torch.Tensor) -> torch.Tensor:
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


def _replicated(sums: list[float], world: int, width: int, at: int) -> bool:
    """Whether the checksum at offset ``at`` is the same on every rank (NaN equals NaN)."""
    first = sums[at : at + 3]
    for r in range(1, world):
        other = sums[r * width + at : r * width + at + 3]
        for a, b in zip(first, other, strict=True):
            if a != b and not (a != a and b != b):
                return False
    return True


_new = object.__new__
_set = object.__setattr__


def _make_stats(**fields: Any) -> ParamStats:
    # once per parameter per logged step: set the frozen instance's __dict__ at once rather than
    # through the dataclass __init__ (seven object.__setattr__ calls); the instance is the same
    ps = _new(ParamStats)
    _set(ps, "__dict__", fields)
    return ps


def _param_stats(
    names: Sequence[str],
    params: Sequence[torch.Tensor],
    cols: Sequence[int],
    table: Sequence[Sequence[float]],
    counts: dict[int, tuple[int | None, int | None, float]],
    full: bool,
    with_update: bool,
) -> dict[str, ParamStats]:
    """``ParamStats`` in model order from the host rows of the step's matrix."""
    by_param: dict[int, ParamStats] = {}
    norms = table[S.NORM]
    if with_update:
        upd, wgt = table[-2], table[-1]
    for j, i in enumerate(cols):
        norm = norms[j]
        nan = inf = 0
        if j in counts:
            nan, inf, norm64 = counts[j]  # type: ignore[assignment]
            if nan == 0 and inf == 0:
                norm = norm64  # finite values whose float32 norm overflowed
        if full:
            numel = params[i].numel()
            nonzero = table[S.NONZERO][j]
            max_abs, mean_abs = table[S.MAX_ABS][j], table[S.SUM_ABS][j] / numel
            zero_frac = (numel - nonzero) / numel
        else:
            max_abs = mean_abs = zero_frac = None
        ratio = None
        if with_update:
            u, w = upd[j], wgt[j]
            ratio = u / w if w > 0 else (math.inf if u > 0 else 0.0)
        by_param[i] = _make_stats(
            norm=norm,
            max_abs=max_abs,
            mean_abs=mean_abs,
            nan=nan,
            inf=inf,
            zero_frac=zero_frac,
            update_ratio=ratio,
        )
    return {names[i]: by_param[i] for i in sorted(by_param)}


def _module_stats(
    names: Sequence[str], mods: dict[int, list[list[float]]], norm_type: float
) -> dict[str, ParamStats]:
    out = {}
    for i in sorted(mods):
        norm, max_abs, sum_abs, nonzero, nan, inf, numel = S.combine_calls(mods[i], norm_type)
        out[names[i]] = ParamStats(
            norm=norm,
            max_abs=max_abs,
            mean_abs=sum_abs / numel,
            nan=int(nan),
            inf=int(inf),
            zero_frac=(numel - nonzero) / numel,
        )
    return out


# ---------------------------------------------------------------- alerts
def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


class _Track:
    """Alert state of one parameter across logged steps."""

    __slots__ = ("low", "zero", "window", "median", "age", "exploding")

    def __init__(self) -> None:
        self.low = 0  # consecutive logged steps vanishing
        self.zero = 0  # consecutive logged steps exactly zero
        self.window: deque[float] = deque(maxlen=_SPIKE_WINDOW)
        # the median of ``window``, recomputed every ``_MEDIAN_EVERY`` steps: it moves slowly,
        # and sorting a window per parameter per step would cost more than all the rest
        self.median = 0.0
        self.age = _MEDIAN_EVERY
        self.exploding = False


class _AlertState:
    """Turns each logged step into alerts. Each condition alerts when it starts, and all the
    parameters that enter it at the same step make one alert (the first named, all counted);
    NaN and Inf are events of the whole model: one alert when the first parameter turns
    non-finite, none while some stay so (an optimizer step spreads a NaN to every weight)."""

    def __init__(self) -> None:
        self.tracks: dict[str, _Track] = {}
        self.forward_bad = False
        self.nan = self.inf = False

    def update(
        self,
        st: StepStats,
        first_bad: str | None,
        numels: dict[str, int],
        thresholds: tuple[float, float, float, float],
    ) -> list[Alert]:
        vanish, vanish_ratio, explode, norm_type = thresholds
        out: list[Alert] = []
        if first_bad is not None and not self.forward_bad:
            msg = f"step {st.step}: the output of {first_bad} is the first non-finite forward value"
            out.append(Alert("forward_nonfinite", st.step, first_bad, msg))
        self.forward_bad = first_bad is not None
        if st.skipped:  # the GradScaler skipped it: scaled overflow, not the model's gradients
            return out
        out.extend(self._nonfinite(st))
        per_elem = {
            n: _per_element(ps.norm, numels[n], norm_type)
            for n, ps in st.params.items()
            if math.isfinite(ps.norm)
        }
        positive = [v for v in per_elem.values() if v > 0]
        median = statistics.median(positive) if positive else 0.0
        dead, vanishing, exploding = [], [], []
        tracks = self.tracks
        for name, ps in st.params.items():
            track = tracks.get(name)
            if track is None:
                track = tracks[name] = _Track()
            size = per_elem.get(name)
            if size is None:
                continue
            track.zero = track.zero + 1 if size == 0 else 0
            low = size > 0 and (size < vanish or size < vanish_ratio * median)
            track.low = track.low + 1 if low else 0
            if track.zero == VANISH_PATIENCE:
                dead.append(name)
            if track.low == VANISH_PATIENCE:
                vanishing.append((name, ps.norm, size))
            spike = self._spike(track, ps.norm, explode)
            if spike is not None:
                exploding.append((name, ps.norm, spike))
        if dead:
            out.append(_dead_alert(st.step, dead))
        if vanishing:
            out.append(_vanish_alert(st.step, vanishing, vanish, vanish_ratio, median))
        if exploding:
            out.append(_explode_alert(st.step, exploding, explode))
        return out

    def _nonfinite(self, st: StepStats) -> list[Alert]:
        out = []
        for kind, word in (("nan", "NaN value"), ("inf", "infinite value")):
            hit = [(n, ps) for n, ps in st.params.items() if _has(ps, kind)]
            if hit and not getattr(self, kind):
                out.append(_nonfinite_alert(st.step, kind, word, hit))
            setattr(self, kind, bool(hit))
        return out

    @staticmethod
    def _spike(track: _Track, norm: float, explode: float) -> float | None:
        """Exploding: above ``explode``, or SPIKE_FACTOR x the running median of the window.
        Returns the median (or math.nan when only the absolute level was crossed) when the
        condition starts at this step."""
        window = track.window
        median: float | None = None
        if len(window) >= SPIKE_MIN_HISTORY:
            if track.age >= _MEDIAN_EVERY:
                track.age, track.median = 0, statistics.median(window)
            track.age += 1
            median = track.median
        now = norm > explode or (median is not None and median > 0 and norm > SPIKE_FACTOR * median)
        window.append(norm)
        started = now and not track.exploding
        track.exploding = now
        if not started:
            return None
        return median if median is not None and norm <= explode else math.nan


def _per_element(norm: float, numel: int, norm_type: float) -> float:
    """A norm as a per-element size (the RMS for p = 2), so tensors of any size compare."""
    if math.isinf(norm_type) or numel <= 1:
        return norm
    return norm / numel ** (1.0 / norm_type)


def _has(ps: ParamStats, kind: str) -> bool:
    count = ps.nan if kind == "nan" else ps.inf
    if count is not None:
        return count > 0
    # not countable (changed before counting): a NaN norm means a NaN, an infinite one an Inf
    return math.isnan(ps.norm) if kind == "nan" else math.isinf(ps.norm)


def _nonfinite_alert(
    step: int, kind: str, word: str, hit: list[tuple[str, ParamStats]]
) -> Alert:
    first, ps = hit[0]
    count = ps.nan if kind == "nan" else ps.inf
    if count is not None:
        what = _count(count, word)
    else:
        what = f"{word}s (not counted: the gradient changed after backward, e.g. clipped)"
    names = tuple(n for n, _ in hit)
    if len(hit) == 1:
        msg = f"step {step}: {what} in the gradient of {first}"
    else:
        label = "NaN" if kind == "nan" else "Inf"
        msg = (
            f"step {step}: {label} in the gradients of {len(hit)} parameters, "
            f"first {first} ({what})"
        )
    return Alert(kind, step, first, msg, len(hit), names)


def _dead_alert(step: int, dead: list[str]) -> Alert:
    if len(dead) == 1:
        msg = (
            f"step {step}: the gradient of {dead[0]} is exactly zero for {VANISH_PATIENCE} "
            "logged steps in a row (dead unit or a parameter cut off from the loss)"
        )
    else:
        msg = (
            f"step {step}: the gradients of {len(dead)} parameters are exactly zero for "
            f"{VANISH_PATIENCE} logged steps in a row (dead units or parameters cut off from "
            f"the loss), first {dead[0]}"
        )
    return Alert("dead", step, dead[0], msg, len(dead), tuple(dead))


def _vanish_alert(
    step: int,
    hit: list[tuple[str, float, float]],
    vanish: float,
    ratio: float,
    median: float,
) -> Alert:
    name, norm, size = hit[0]
    why = (
        f"below {vanish:g} per element"
        if size < vanish
        else f"below {ratio:g} x the model's median {median:.3g} per element"
    )
    if len(hit) == 1:
        msg = (
            f"step {step}: gradient norm of {name} is {norm:.3g} ({size:.3g} per element), "
            f"{why} for {VANISH_PATIENCE} logged steps in a row"
        )
    else:
        msg = (
            f"step {step}: vanishing gradients in {len(hit)} parameters for "
            f"{VANISH_PATIENCE} logged steps in a row, first {name}: norm {norm:.3g} "
            f"({size:.3g} per element), {why}"
        )
    return Alert("vanishing", step, name, msg, len(hit), tuple(n for n, _, _ in hit))


def _explode_alert(step: int, hit: list[tuple[str, float, float]], explode: float) -> Alert:
    name, norm, median = hit[0]
    why = f"above {explode:g}" if math.isnan(median) else (
        f"{norm / median:.0f}x its running median {median:.3g}"
    )
    if len(hit) == 1:
        msg = f"step {step}: gradient norm of {name} is {norm:.3g}, {why}"
    else:
        msg = (
            f"step {step}: exploding gradients in {len(hit)} parameters, first {name}: "
            f"norm {norm:.3g}, {why}"
        )
    return Alert("exploding", step, name, msg, len(hit), tuple(n for n, _, _ in hit))
