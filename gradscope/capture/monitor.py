"""``GradMonitor``: per-parameter gradient statistics while a model trains.

Each logged step, for every watched parameter with a gradient: norm, max abs, mean abs, NaN and
Inf counts, fraction of exact zeros, and (with ``optimizer=``) the update-to-weight ratio. All of
it is computed on the device, in inference mode, by nine batched ops over the gradients copied
into one reused float64 buffer (see ``_monitor_stats``: their number does not grow with the
number of parameters) and moved to the host as ONE ``.tolist()`` per logged step; a step that is
not logged runs no tensor op.

Step boundary:
    * with ``optimizer=``: the optimizer step (step pre/post hooks), so gradient accumulation is
      measured on the accumulated ``.grad`` and the update of the weights can be seen;
    * without: the end of each backward that accumulated into a watched ``.grad``
      (post-accumulate-grad hooks queue a callback on the autograd engine).

With ``torch.distributed`` initialised, each logged step combines every rank's statistics with
one collective (see ``_monitor_stats.reduce_across_ranks``), so each rank reports global figures.
"""

from __future__ import annotations

import fnmatch
import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed

from ..errors import MonitorError
from ..model.formats import renderer
from . import compiled
from . import monitor_stats as S
from .handles import HookHandle
from .nest import iter_tensors

#: a parameter is "vanishing" after this many consecutive logged steps below ``vanish``
VANISH_PATIENCE = 3
#: a norm this many times above the running median of its last logged norms is "exploding"
SPIKE_FACTOR = 10.0
#: the running median needs at least this many earlier logged norms
SPIKE_MIN_HISTORY = 5
_SPIKE_WINDOW = 25
_MEDIAN_EVERY = 5

ALERT_KINDS = ("nan", "inf", "vanishing", "exploding", "forward_nonfinite")


@dataclass(frozen=True)
class ParamStats:
    """Gradient statistics of one parameter (or one module's gradient output) at one step.

    ``norm`` uses the monitor's ``norm_type``; ``update_ratio`` is ``||w_new - w_old|| / ||w_old||``
    of the optimizer step (None without ``optimizer=``, and for module statistics).
    """

    norm: float
    max_abs: float
    mean_abs: float
    nan: int
    inf: int
    zero_frac: float
    update_ratio: float | None = None


@dataclass(frozen=True)
class StepStats:
    """One logged step: the total norm (as ``torch.nn.utils.get_total_norm``) and per-parameter
    statistics in model order; ``modules``: gradient-output statistics (with ``modules=True``)."""

    step: int
    total_norm: float
    params: dict[str, ParamStats]
    modules: dict[str, ParamStats] = field(default_factory=dict)


@dataclass(frozen=True)
class Alert:
    """Something worth a look: ``kind`` is one of nan, inf, vanishing, exploding,
    forward_nonfinite, leak; ``name`` the parameter (or module, or for a leak the step whose
    graph is still alive) and ``step`` the step it was seen at."""

    kind: str
    step: int
    name: str
    message: str


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
    return chosen


def _check_args(model: Any, every: Any, norm_type: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise MonitorError(
            f"GradMonitor needs an nn.Module, got {type(model).__name__}; "
            "pass the model being trained"
        )
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise MonitorError(f"every={every!r} must be a positive integer (1 logs every step)")
    if not isinstance(norm_type, (int, float)) or isinstance(norm_type, bool) or not norm_type > 0:
        raise MonitorError(f"norm_type={norm_type!r} must be a positive number or math.inf")


# bound once: they run on every backward (the hooks) or every logged step
_engine_callback = torch.autograd.Variable._execution_engine.queue_callback  # type: ignore
_graph_task_id = torch._C._current_graph_task_id
# the C++ guard behind torch.inference_mode(), without its Python wrapper: the statistics'
# ops dispatch straight to their kernels, and entering costs a fraction of a microsecond
_inference_mode = torch._C._InferenceMode


class GradMonitor:
    """Watch gradients while training; read ``.history``, ``.alerts`` and ``.report()`` after.

    Args:
        model: the ``nn.Module`` being trained (the DDP wrapper itself under DDP).
        every: log one step in ``every``; the others cost nothing measurable.
        norm_type: the p of the norms (``math.inf`` for the max norm), as in ``clip_grad_norm_``.
        params: parameter names or globs (``"encoder.*"``) to watch; default all trainable ones.
        modules: also record each submodule's gradient-output statistics (``StepStats.modules``).
        activations: check module outputs in the forward and name the first non-finite one.
        optimizer: make its ``step()`` the step boundary and measure update-to-weight ratios.
        vanish: a norm below this for ``VANISH_PATIENCE`` consecutive logged steps alerts.
        explode: a norm above this (or ``SPIKE_FACTOR`` x its running median) alerts.
        leaks: also watch for autograd graphs of earlier steps still alive at the next step
            (a loss kept without ``.detach()``), with ``gs.leak_check``; each leak is an
            ``Alert`` of kind ``leak``.

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
        modules: bool = False,
        activations: bool = False,
        optimizer: torch.optim.Optimizer | None = None,
        vanish: float = 1e-7,
        explode: float = 1e3,
        leaks: bool = False,
    ) -> None:
        _check_args(model, every, norm_type)
        model = compiled.unwrap(model) or model  # a torch.compile wrapper: its module's names
        if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
            raise MonitorError(
                f"optimizer= must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
            )
        self.every = every
        self.norm_type = float(norm_type)
        self.vanish = vanish
        self.explode = explode
        self.optimizer = optimizer
        chosen = _select(model, params)
        self.names = [n for n, _ in chosen]
        self._params = [p for _, p in chosen]
        # the work buffers of _monitor_stats, reused from step to step (freed by remove())
        self._cache: dict = {}
        self._replicated = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        self._modules = [(n, m) for n, m in model.named_modules() if n] if modules else []
        self._module_names = [n for n, _ in self._modules]
        self._module_stats: list[list[torch.Tensor]] = [[] for _ in self._modules]
        self._act_names = (
            [n or type(model).__name__ for n, _ in model.named_modules()] if activations else []
        )
        self._act_flags: list[tuple[int, torch.Tensor]] = []
        self.step = 0
        self.history: list[StepStats] = []
        self.alerts: list[Alert] = []
        self._handles = HookHandle()
        self._queued = -1
        self._pending: torch.Tensor | None = None
        self._old_weights: S.Snapshot = []
        self._alert_state = _AlertState()
        self._leak_check: Any = None
        self._leak_alerted: set[int] = set()
        if leaks:
            from .memory import LeakCheck  # saved-tensor hooks: only when asked for

            self._leak_check = LeakCheck(grace=1, warn=False).start()
        self._attach(model, activations)

    # ------------------------------------------------------------------ hooks
    def _attach(self, model: torch.nn.Module, activations: bool) -> None:
        add = self._handles.add
        if self.optimizer is not None:
            add(self.optimizer.register_step_pre_hook(self._before_step))
            add(self.optimizer.register_step_post_hook(self._after_step))
        else:
            for p in self._params:
                add(p.register_post_accumulate_grad_hook(self._on_accumulate))
        # modules= / activations=: one global forward hook that Dynamo never sees (hooks on the
        # modules would be traced into a compiled graph and guarded on: a recompile when they
        # go); modules that run inside a compiled region have no forward call to hook
        self._module_index = {id(mod): i for i, (_, mod) in enumerate(self._modules)}
        self._act_index = (
            {id(mod): i for i, (_, mod) in enumerate(model.named_modules())} if activations else {}
        )
        if self._module_index or self._act_index:
            add(compiled.ModuleHooks(_no_pre_hook, self._forward_done).install())

    def _forward_done(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        key = id(module)
        i = self._module_index.get(key)
        if i is not None:
            self._module_forward(i, module, args, output)
        i = self._act_index.get(key)
        if i is not None:
            self._activation_check(i, module, args, output)

    def remove(self) -> None:
        """Remove every hook gradscope added (safe to call twice); history and alerts stay."""
        self._handles.remove()
        if self._leak_check is not None:
            self._leak_check.remove()
        self._pending = None
        self._old_weights = []
        self._cache.clear()
        self._act_flags.clear()
        for calls in self._module_stats:
            calls.clear()

    def __enter__(self) -> GradMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def _logged(self) -> bool:
        return self.step % self.every == 0

    def _advance(self) -> None:
        """End the current step: count it, and look for graphs of earlier steps still alive."""
        step = self.step
        self.step += 1
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
            self._advance()
            return
        # measure in a second callback, queued now: it runs after every callback queued during
        # the backward (DDP's gradient averaging is one), so it sees the final .grad
        _engine_callback(self._measure_after_backward)

    def _measure_after_backward(self) -> None:
        with _inference_mode(True):
            matrix = self._measure()
        self._finish(matrix)

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._logged():
            return
        with _inference_mode(True):
            self._pending = self._measure()
            self._old_weights = S.snapshot(self._params, self._cache)

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._pending is None:
            self._advance()
            return
        with _inference_mode(True):
            matrix = S.add_update(self._pending, self._old_weights, self._params, self._cache)
        self._pending, self._old_weights = None, []
        self._finish(matrix)

    def _module_forward(self, index: int, module: torch.nn.Module, args: Any, output: Any) -> None:
        if not self._logged() or not torch.is_grad_enabled():
            return
        for _, t in iter_tensors(output):
            if t.requires_grad:
                t.register_hook(partial(self._module_grad, index))

    def _module_grad(self, index: int, grad: torch.Tensor) -> None:
        if grad.numel() == 0:
            return
        with torch.no_grad():
            self._module_stats[index].append(S.module_row(grad.detach(), self.norm_type))

    def _activation_check(
        self, index: int, module: torch.nn.Module, args: Any, output: Any
    ) -> None:
        if not self._logged() or not torch.is_grad_enabled():
            return
        with torch.no_grad():
            for _, t in iter_tensors(output):
                if t.is_floating_point() or t.is_complex():
                    self._act_flags.append((index, ~torch.isfinite(t.detach()).all()))

    # ------------------------------------------------------------------ measuring
    def _measure(self) -> torch.Tensor:
        """The packed ``[NCOLS, n_params]`` matrix of this step (no host sync; call it under
        inference mode: its buffers and the matrix are inference tensors).
        A parameter without elements gets NUMEL 0, so it reads as absent."""
        grads = [p.grad for p in self._params]
        for g in grads:
            if g is None or g.is_sparse:
                return self._measure_some(grads)
        return S.grad_matrix(grads, self.norm_type, self._cache)  # type: ignore[arg-type]

    def _measure_some(self, grads: list[torch.Tensor | None]) -> torch.Tensor:
        """The same, when some parameters have no gradient or a sparse one."""
        present = [i for i, g in enumerate(grads) if g is not None and g.numel()]
        dense = [_dense(grads[i]) for i in present]  # type: ignore[arg-type]
        device = dense[0].device if dense else self._params[0].device
        matrix = torch.zeros(S.NCOLS, len(grads), dtype=torch.float64, device=device)
        if present:
            idx = S.to_device(present, torch.int64, device)
            matrix[:, idx] = S.grad_matrix(dense, self.norm_type, self._cache)
        return matrix

    def _module_matrix(self, device: torch.device) -> torch.Tensor | None:
        if not self._modules:
            return None
        columns = []
        for calls in self._module_stats:
            if calls:
                columns.append(S.combine(torch.stack(calls)[:, :, None].to(device))[:, 0])
            else:
                columns.append(torch.zeros(S.NCOLS, dtype=torch.float64, device=device))
            calls.clear()
        return torch.stack(columns, dim=1)

    def _finish(self, matrix: torch.Tensor) -> None:
        """Reduce across ranks, move everything to the host in ONE transfer, record the step."""
        step = self.step
        self._advance()
        mods = self._module_matrix(matrix.device) if self._modules else None
        full = matrix if mods is None else torch.cat([matrix, mods], dim=1)
        if _distributed():
            full = S.reduce_across_ranks(full, replicated=self._replicated)
        flags = self._act_flags
        if flags:
            self._act_flags = []
            packed = torch.cat([full.reshape(-1), torch.stack([f for _, f in flags]).to(full)])
            values = packed.tolist()  # the one device-to-host transfer of this step
            width = full.shape[1]
            stats = [values[i : i + width] for i in range(0, S.NCOLS * width, width)]
            bad = [(i, v) for (i, _), v in zip(flags, values[S.NCOLS * width :], strict=True)]
        else:
            stats = full.tolist()  # the one device-to-host transfer of this step
            bad = []
        if mods is None:
            self._record(step, stats, None, bad)
        else:
            n = len(self._params)
            self._record(step, [row[:n] for row in stats], [row[n:] for row in stats], bad)

    def _record(
        self,
        step: int,
        stats: list[list[float]],
        mod_stats: list[list[float]] | None,
        flags: list[tuple[int, float]],
    ) -> None:
        """``stats``: the ``NCOLS`` rows of the packed matrix, one value per parameter;
        ``mod_stats`` the same per module; ``flags``: (module index, non-finite flag)."""
        norm_type = self.norm_type
        params = _stats_by_name(self.names, stats, norm_type, self.optimizer is not None)
        modules = (
            _stats_by_name(self._module_names, mod_stats, norm_type, False) if mod_stats else {}
        )
        total = S.total_norm(stats, norm_type)
        st = StepStats(step=step, total_norm=total, params=params, modules=modules)
        self.history.append(st)
        first_bad = next((self._act_names[i] for i, v in flags if v), None) if flags else None
        alerts = self._alert_state.update(st, first_bad, self.vanish, self.explode)
        if alerts:
            self.alerts.extend(alerts)

    # ------------------------------------------------------------------ views
    def report(self, *, width: int = 24) -> Any:
        """A rich renderable: one row per parameter (model order) with the latest norm, a
        sparkline of its history, max abs, non-finite counts and a status; then a summary line.

        Example:
            >>> rich.console.Console().print(mon.report())   # doctest: +SKIP
        """
        return renderer("monitor_report")(self, width=width)

    def to_jsonl(self, path: str | Path) -> Path:
        """Write one JSON object per logged step (non-finite floats as null; counts are exact)."""
        return renderer("monitor_jsonl")(self, Path(path))

    def to_csv(self, path: str | Path) -> Path:
        """Write one CSV row per (logged step, parameter)."""
        return renderer("monitor_csv")(self, Path(path))

    def to_tensorboard(self, writer: Any) -> None:
        """Log scalars (total and per-parameter norms, update ratios) and per-step histograms of
        the per-parameter norms to a ``torch.utils.tensorboard.SummaryWriter`` (or any object with
        ``add_scalar`` and ``add_histogram``)."""
        renderer("monitor_tensorboard")(self, writer)

    def plot(self, path: str | Path) -> Path:
        """Save a PNG: gradient flow per layer (latest and max over steps) and the total norm
        over steps. Needs matplotlib (``pip install gradscope[plot]``)."""
        return renderer("monitor_plot")(self, Path(path))


def _no_pre_hook(module: torch.nn.Module, args: Any) -> None:
    return None


def _dense(grad: torch.Tensor) -> torch.Tensor:
    # a sparse gradient (nn.Embedding(sparse=True)) is densified on logged steps only, so its
    # implicit zeros count as zeros
    return grad.detach().to_dense() if grad.is_sparse else grad.detach()


def _distributed() -> bool:
    return _DIST_AVAILABLE and torch.distributed.is_initialized()


_DIST_AVAILABLE = torch.distributed.is_available()


_new = object.__new__
_set = object.__setattr__


def _stats_by_name(
    names: Sequence[str], stats: Sequence[Sequence[float]], norm_type: float, with_update: bool
) -> dict[str, ParamStats]:
    """``ParamStats`` of every tensor with elements (NUMEL > 0: it had a gradient), from the
    rows of the packed matrix.

    Runs once per parameter per logged step, so it builds each frozen ``ParamStats`` by setting
    its ``__dict__`` at once rather than through the dataclass ``__init__`` (seven
    ``object.__setattr__`` calls): the instance is the same, field for field."""
    out = {}
    sqrt = math.sqrt
    columns = zip(names, *stats[: S.UPDATE_SQ], strict=True)
    updates = zip(stats[S.UPDATE_SQ], stats[S.WEIGHT_SQ], strict=True) if with_update else None
    for name, pow_sum, sum_abs, nonzero, inf, not_nan, max_abs, numel, slots in columns:
        ratio = None
        if updates is not None:
            upd, wgt = next(updates)
            ratio = sqrt(upd / wgt) if wgt > 0 else (math.inf if upd > 0 else 0.0)
        if not numel > 0:
            continue
        nan = slots - not_nan
        ps = _new(ParamStats)
        _set(
            ps,
            "__dict__",
            {
                "norm": (
                    sqrt(pow_sum)
                    if norm_type == 2
                    else S.norm_of(pow_sum, sum_abs, max_abs, norm_type)
                ),
                "max_abs": max_abs,
                "mean_abs": sum_abs / numel,
                "nan": int(nan),
                "inf": int(inf),
                "zero_frac": (numel - nan - nonzero) / numel,
                "update_ratio": ratio,
            },
        )
        out[name] = ps
    return out


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


class _Track:
    """Alert state of one parameter across logged steps."""

    __slots__ = ("low", "window", "median", "age", "exploding", "nan", "inf")

    def __init__(self) -> None:
        self.low = 0  # consecutive logged steps below ``vanish``
        self.window: deque[float] = deque(maxlen=_SPIKE_WINDOW)
        # the median of ``window``, recomputed every ``_MEDIAN_EVERY`` steps: it moves slowly,
        # and sorting a window per parameter per step would cost more than all the rest
        self.median = 0.0
        self.age = _MEDIAN_EVERY
        self.exploding = self.nan = self.inf = False


class _AlertState:
    """Turns each logged step into alerts; each condition alerts when it starts, not every step."""

    def __init__(self) -> None:
        self.tracks: dict[str, _Track] = {}
        self.forward_bad = False

    def update(
        self, st: StepStats, first_bad: str | None, vanish: float, explode: float
    ) -> list[Alert]:
        out: list[Alert] = []
        if first_bad is not None and not self.forward_bad:
            msg = f"step {st.step}: the output of {first_bad} is the first non-finite forward value"
            out.append(Alert("forward_nonfinite", st.step, first_bad, msg))
        self.forward_bad = first_bad is not None
        tracks = self.tracks
        isfinite = math.isfinite
        for name, ps in st.params.items():
            track = tracks.get(name)
            if track is None:
                track = tracks[name] = _Track()
            if ps.nan or ps.inf or track.nan or track.inf:
                out.extend(_nonfinite(track, st.step, name, ps))
            norm = ps.norm
            if not isfinite(norm):
                continue
            if norm < vanish or track.low:
                out.extend(_vanish(track, st.step, name, norm, vanish))
            # exploding: above ``explode``, or SPIKE_FACTOR x the running median of the window
            window = track.window
            median: float | None = None
            if len(window) >= SPIKE_MIN_HISTORY:
                if track.age >= _MEDIAN_EVERY:
                    track.age, track.median = 0, statistics.median(window)
                track.age += 1
                median = track.median
            now = norm > explode or (
                median is not None and median > 0 and norm > SPIKE_FACTOR * median
            )
            window.append(norm)
            if now and not track.exploding:
                out.append(_exploding(st.step, name, norm, explode, median))
            track.exploding = now
        return out


def _nonfinite(track: _Track, step: int, name: str, ps: ParamStats) -> list[Alert]:
    out = []
    if ps.nan and not track.nan:
        msg = f"step {step}: {_count(ps.nan, 'NaN value')} in the gradient of {name}"
        out.append(Alert("nan", step, name, msg))
    if ps.inf and not track.inf:
        msg = f"step {step}: {_count(ps.inf, 'infinite value')} in the gradient of {name}"
        out.append(Alert("inf", step, name, msg))
    track.nan, track.inf = ps.nan > 0, ps.inf > 0
    return out


def _vanish(track: _Track, step: int, name: str, norm: float, vanish: float) -> list[Alert]:
    track.low = track.low + 1 if norm < vanish else 0
    if track.low != VANISH_PATIENCE:
        return []
    msg = (
        f"step {step}: gradient norm of {name} is {norm:.3g}, below {vanish:g} for "
        f"{VANISH_PATIENCE} logged steps in a row"
    )
    return [Alert("vanishing", step, name, msg)]


def _exploding(step: int, name: str, norm: float, explode: float, median: float | None) -> Alert:
    if norm > explode or median is None:
        why = f"above {explode:g}"
    else:
        why = f"{norm / median:.0f}x its running median {median:.3g}"
    return Alert(
        "exploding", step, name, f"step {step}: gradient norm of {name} is {norm:.3g}, {why}"
    )
