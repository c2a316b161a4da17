"""``GradMonitor``: per-parameter gradient statistics while a model trains.

Each logged step, for every watched parameter with a gradient: norm, max abs, mean abs, NaN and
Inf counts, fraction of exact zeros, and (with ``optimizer=``) the update-to-weight ratio. All of
it is computed on the device by a fixed handful of batched ops over the concatenated gradients
(see ``_monitor_stats``: their number does not grow with the number of parameters) and moved to
the host as ONE ``.tolist()`` per logged step; a step that is not logged runs no tensor op.

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
from torch.utils.hooks import RemovableHandle

from . import _monitor_stats as S
from ._errors import GradscopeError
from ._nest import iter_tensors

#: a parameter is "vanishing" after this many consecutive logged steps below ``vanish``
VANISH_PATIENCE = 3
#: a norm this many times above the running median of its last logged norms is "exploding"
SPIKE_FACTOR = 10.0
#: the running median needs at least this many earlier logged norms
SPIKE_MIN_HISTORY = 5
_SPIKE_WINDOW = 25
_MEDIAN_EVERY = 5

ALERT_KINDS = ("nan", "inf", "vanishing", "exploding", "forward_nonfinite")


class MonitorError(GradscopeError):
    """GradMonitor was given arguments it cannot use."""


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


def _engine_callback(fn: Any) -> None:
    torch.autograd.Variable._execution_engine.queue_callback(fn)  # type: ignore[attr-defined]


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
        self._numel = torch.tensor(
            [float(p.numel()) for p in self._params],
            dtype=torch.float64,
            device=self._params[0].device,
        )
        self._replicated = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        self._modules = [(n, m) for n, m in model.named_modules() if n] if modules else []
        self._module_rows: list[list[torch.Tensor]] = [[] for _ in self._modules]
        self._act_names = (
            [n or type(model).__name__ for n, _ in model.named_modules()] if activations else []
        )
        self._act_flags: list[tuple[int, torch.Tensor]] = []
        self.step = 0
        self.history: list[StepStats] = []
        self.alerts: list[Alert] = []
        self._handles: list[RemovableHandle] = []
        self._queued = -1
        self._pending: torch.Tensor | None = None
        self._old_weights: list[torch.Tensor] = []
        self._alert_state = _AlertState()
        self._leak_check: Any = None
        self._leak_alerted: set[int] = set()
        if leaks:
            from ._memory import LeakCheck  # saved-tensor hooks: only when asked for

            self._leak_check = LeakCheck(grace=1, warn=False).start()
        self._attach(model, activations)

    # ------------------------------------------------------------------ hooks
    def _attach(self, model: torch.nn.Module, activations: bool) -> None:
        h = self._handles
        if self.optimizer is not None:
            h.append(self.optimizer.register_step_pre_hook(self._before_step))
            h.append(self.optimizer.register_step_post_hook(self._after_step))
        else:
            h.extend(
                p.register_post_accumulate_grad_hook(self._on_accumulate) for p in self._params
            )
        for i, (_, mod) in enumerate(self._modules):
            h.append(mod.register_forward_hook(partial(self._module_forward, i)))
        if activations:
            for i, (_, mod) in enumerate(model.named_modules()):
                h.append(mod.register_forward_hook(partial(self._activation_check, i)))

    def remove(self) -> None:
        """Remove every hook gradscope added (safe to call twice); history and alerts stay."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._leak_check is not None:
            self._leak_check.remove()
        self._pending = None
        self._old_weights = []
        self._act_flags.clear()
        for rows in self._module_rows:
            rows.clear()

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
        task = torch._C._current_graph_task_id()
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
        matrix = self._measure()
        self._finish(matrix)

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._logged():
            return
        with torch.no_grad():
            self._pending = self._measure()
            self._old_weights = list(torch._foreach_mul([p.detach() for p in self._params], 1.0))

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._pending is None:
            self._advance()
            return
        with torch.no_grad():
            matrix = S.add_update(
                self._pending, self._old_weights, [p.detach() for p in self._params]
            )
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
            self._module_rows[index].append(S.module_row(grad.detach(), self.norm_type))

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
        """The packed ``[n_params, NCOLS]`` matrix of this step (no host sync)."""
        present = [i for i, p in enumerate(self._params) if p.grad is not None and p.numel()]
        grads = [_dense(self._params[i].grad) for i in present]  # type: ignore[arg-type]
        if grads and grads[0].device != self._numel.device:  # the model moved (model.to(...))
            self._numel = self._numel.to(grads[0].device)
        device = self._numel.device
        if len(present) == len(self._params):
            return S.grad_matrix(grads, self.norm_type, self._numel)
        matrix = torch.zeros(len(self._params), S.NCOLS, dtype=torch.float64, device=device)
        if present:
            idx = torch.tensor(present, device=device)
            matrix[idx] = S.grad_matrix(grads, self.norm_type, self._numel[idx])
        return matrix

    def _module_matrix(self) -> torch.Tensor | None:
        if not self._modules:
            return None
        device = self._numel.device
        rows = []
        for calls in self._module_rows:
            if calls:
                rows.append(S.combine(torch.stack(calls)[:, None, :].to(device), self.norm_type)[0])
            else:
                rows.append(torch.zeros(S.NCOLS, dtype=torch.float64, device=device))
            calls.clear()
        return torch.stack(rows)

    def _finish(self, matrix: torch.Tensor) -> None:
        """Reduce across ranks, move everything to the host in ONE transfer, record the step."""
        step, n = self.step, len(self._params)
        self._advance()
        mods = self._module_matrix()
        full = matrix if mods is None else torch.cat([matrix, mods])
        if _distributed():
            full = S.reduce_across_ranks(full, self.norm_type, replicated=self._replicated)
        flags = self._act_flags
        self._act_flags = []
        packed = full.reshape(-1)
        if flags:
            packed = torch.cat([packed, torch.stack([f for _, f in flags]).to(packed)])
        values = packed.tolist()  # the one device-to-host transfer of this step
        rows = [values[i * S.NCOLS : (i + 1) * S.NCOLS] for i in range(len(full))]
        self._record(
            step,
            rows[:n],
            rows[n:],
            [(i, v) for (i, _), v in zip(flags, values[len(rows) * S.NCOLS :], strict=True)],
        )

    def _record(
        self,
        step: int,
        rows: list[list[float]],
        mod_rows: list[list[float]],
        flags: list[tuple[int, float]],
    ) -> None:
        with_update = self.optimizer is not None
        params = {
            name: _param_stats(row, with_update)
            for name, row in zip(self.names, rows, strict=True)
            if row[S.PRESENT] > 0
        }
        modules = {
            name: _param_stats(row, False)
            for (name, _), row in zip(self._modules, mod_rows, strict=True)
            if row[S.PRESENT] > 0
        }
        total = S.total_norm([p.norm for p in params.values()], self.norm_type)
        stats = StepStats(step=step, total_norm=total, params=params, modules=modules)
        self.history.append(stats)
        first_bad = next((self._act_names[i] for i, v in flags if v), None)
        self.alerts.extend(self._alert_state.update(stats, first_bad, self.vanish, self.explode))

    # ------------------------------------------------------------------ views
    def report(self, *, width: int = 24) -> Any:
        """A rich renderable: one row per parameter (model order) with the latest norm, a
        sparkline of its history, max abs, non-finite counts and a status; then a summary line.

        Example:
            >>> rich.console.Console().print(mon.report())   # doctest: +SKIP
        """
        from ._monitor_view import render_report

        return render_report(self, width=width)

    def to_jsonl(self, path: str | Path) -> Path:
        """Write one JSON object per logged step (non-finite floats as null; counts are exact)."""
        from ._monitor_view import write_jsonl

        return write_jsonl(self, Path(path))

    def to_csv(self, path: str | Path) -> Path:
        """Write one CSV row per (logged step, parameter)."""
        from ._monitor_view import write_csv

        return write_csv(self, Path(path))

    def to_tensorboard(self, writer: Any) -> None:
        """Log scalars (total and per-parameter norms, update ratios) and per-step histograms of
        the per-parameter norms to a ``torch.utils.tensorboard.SummaryWriter`` (or any object with
        ``add_scalar`` and ``add_histogram``)."""
        from ._monitor_view import write_tensorboard

        write_tensorboard(self, writer)

    def plot(self, path: str | Path) -> Path:
        """Save a PNG: gradient flow per layer (latest and max over steps) and the total norm
        over steps. Needs matplotlib (``pip install gradscope[plot]``)."""
        from ._monitor_view import plot_png

        return plot_png(self, Path(path))


def _dense(grad: torch.Tensor) -> torch.Tensor:
    # a sparse gradient (nn.Embedding(sparse=True)) is densified on logged steps only, so its
    # implicit zeros count as zeros
    return grad.detach().to_dense() if grad.is_sparse else grad.detach()


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _param_stats(row: Sequence[float], with_update: bool) -> ParamStats:
    numel = row[S.NUMEL]
    ratio = None
    if with_update:
        upd, wgt = row[S.UPDATE_SQ], row[S.WEIGHT_SQ]
        ratio = math.sqrt(upd / wgt) if wgt > 0 else (math.inf if upd > 0 else 0.0)
    return ParamStats(
        norm=row[S.NORM],
        max_abs=row[S.MAX_ABS],
        mean_abs=row[S.SUM_ABS] / numel if numel else 0.0,
        nan=int(row[S.NAN]),
        inf=int(row[S.NONFINITE] - row[S.NAN]),
        zero_frac=(numel - row[S.NONZERO] - row[S.NAN]) / numel if numel else 0.0,
        update_ratio=ratio,
    )


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


class _Track:
    """Alert state of one parameter across logged steps."""

    __slots__ = ("low", "window", "median", "age", "exploding", "nan", "inf")

    def __init__(self) -> None:
        self.low = 0  # consecutive logged steps below ``vanish``
        self.window: deque[float] = deque(maxlen=_SPIKE_WINDOW)
        self.median: float | None = None
        self.age = _MEDIAN_EVERY
        self.exploding = self.nan = self.inf = False

    def running_median(self) -> float | None:
        """Recomputed every few steps: it moves slowly, and sorting a window per parameter per
        step would cost more than all the rest of the bookkeeping."""
        if len(self.window) < SPIKE_MIN_HISTORY:
            return None
        if self.age >= _MEDIAN_EVERY:
            self.age, self.median = 0, statistics.median(self.window)
        self.age += 1
        return self.median


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
        for name, ps in st.params.items():
            track = tracks.get(name)
            if track is None:
                track = tracks[name] = _Track()
            if ps.nan or ps.inf or track.nan or track.inf:
                out.extend(_nonfinite(track, st.step, name, ps))
            if math.isfinite(ps.norm):
                if ps.norm < vanish or track.low:
                    out.extend(_vanish(track, st.step, name, ps.norm, vanish))
                out.extend(_explode(track, st.step, name, ps.norm, explode))
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


def _explode(track: _Track, step: int, name: str, norm: float, explode: float) -> list[Alert]:
    median = track.running_median()
    track.window.append(norm)
    spike = median is not None and median > 0 and norm > SPIKE_FACTOR * median
    now = norm > explode or spike
    started = now and not track.exploding
    track.exploding = now
    if not started:
        return []
    if norm > explode or median is None:
        why = f"above {explode:g}"
    else:
        why = f"{norm / median:.0f}x its running median {median:.3g}"
    return [
        Alert("exploding", step, name, f"step {step}: gradient norm of {name} is {norm:.3g}, {why}")
    ]
