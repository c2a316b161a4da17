"""``gs.step_memory``: the peak memory of a whole training step, recorded storage by storage;
``gs.max_batch``: the largest batch whose step fits; ``measure_step``: the same peak measured
by independent means (the profiler's allocation events on the CPU, the CUDA allocator's peak).

A step runs the forward (and ``loss_fn``), the backward and, with ``optimizer=``,
``optimizer.step()`` and ``optimizer.zero_grad(set_to_none=True)``; with an optimizer two steps
run, the first making the optimizer's state, the second the steady state. Everything is put
back afterwards (``_restored``): parameter values, the ``.grad`` tensors (the step starts
from none, as after ``zero_grad``), the optimizer's state and hyper-parameters, buffers, and the
torch, Python and NumPy random states. The recorder is in ``step_memory_record``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import itertools
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar, cast

import torch

from .._torch import dynamo
from .._torch.isolated import fork_refused, in_child
from ..errors import GradscopeError
from ..graph.nest import device_of, iter_tensors
from .activations_recorder import new_objects_collected
from .measure_forward import _quiet_stderr, cpu_allocations
from .step_recorder import (
    GRADS,
    INPUTS,
    PARAMS,
    STATE,
    Lifetimes,
)
from .step_records import MaxBatch, StepMemory

LossFn = Callable[[Any], Any] | None
_AUTOCAST = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
             "fp16": torch.float16, "float16": torch.float16, "half": torch.float16}


# ====================================================================== isolating
#: seconds one isolated step may take before its child is ended (a day: a step is never slow
#: on purpose; the bound only keeps a hung child from hanging the caller for ever)
ISOLATED_TIMEOUT = 86_400.0


def isolated(fn: Callable[[], Any]) -> Any:
    """``fn()`` where it cannot change this process: in a forked child when that is safe
    (``gradscope._torch.isolated``: parameters and their version counters, buffers reassigned
    or not, gradients, inputs' ``.grad``, optimizer state and hooks, every RNG and generator
    stay exactly as they were), else here, where ``_restored`` puts back what it can reach.

    Raises:
        whatever ``fn`` raised; ``GradscopeError`` when the child gave no answer.
    """
    if fork_refused() is not None:
        return fn()
    answer = in_child(fn, ISOLATED_TIMEOUT)
    if answer.failure is not None:
        raise GradscopeError(f"the step could not be recorded: {answer.failure}")
    return answer.value


P = ParamSpec("P")
R = TypeVar("R")


def isolating(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` whose every call runs in ``isolated``; ``fn`` itself stays reachable as
    ``.__wrapped__`` (to run several steps in one isolated call)."""

    @functools.wraps(fn)
    def call(*args: P.args, **kwargs: P.kwargs) -> R:
        return cast(R, isolated(lambda: fn(*args, **kwargs)))

    return call


# ====================================================================== restoring
@contextlib.contextmanager
def _restored(model: torch.nn.Module, optimizer: Any, inputs: Any = ()) -> Iterator[None]:
    """The block leaves what it can reach as before (the in-process fallback of ``isolated``):
    parameters (copied back only where a value changed), grads, buffers (a buffer the forward
    reassigned is put back as the same object), the modules' own ``torch.Generator``s,
    optimizer state and hyper-parameters, the RNG states, and the inputs' ``.grad``. What it
    cannot undo: the optimizer's hooks ran, and version counters moved where values did."""
    params = list(model.parameters())
    if optimizer is not None:
        known = {id(p) for p in params}
        for group in optimizer.param_groups:
            params.extend(p for p in group["params"] if id(p) not in known)
    values = [(p, p.detach().clone() if p.device.type != "meta" else None) for p in params]
    grads = [(p, p.grad) for p in params]
    buffers = [(b, b.detach().clone()) for b in model.buffers() if b.device.type != "meta"]
    owners = [(m, name, b) for m in model.modules() for name, b in m.named_buffers(recurse=False)]
    generators = [(g, g.get_state()) for m in model.modules() for g in vars(m).values()
                  if isinstance(g, torch.Generator)]
    input_grads = [(t, t.grad) for _, t in iter_tensors(inputs) if t.is_leaf]
    state = groups = None
    if optimizer is not None:
        state = optimizer.state
        groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
                  for g in optimizer.param_groups]
    py_state = random.getstate()
    np_random = sys.modules.get("numpy.random")
    np_state = np_random.get_state() if np_random is not None else None
    devices = [d.index for d in {p.device for p in params} if d.type == "cuda"]
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        try:
            for p in params:
                p.grad = None
            for t, _ in input_grads:  # the step's backward must not add into the user's
                t.grad = None
            if optimizer is not None:
                optimizer.state = _copied_state(state)
            yield
        finally:
            with torch.no_grad():  # copied back only where changed: no version bump else
                for p, v in values:
                    if v is not None and _changed(p, v):
                        p.copy_(v)
                for b, v in buffers:
                    if _changed(b, v):
                        b.copy_(v)
            for m, name, b in owners:
                if getattr(m, name, None) is not b:
                    setattr(m, name, b)
            for gen, gen_state in generators:
                gen.set_state(gen_state)
            for t, g in input_grads:
                t.grad = g
            for p, g in grads:
                p.grad = g
            if optimizer is not None:
                optimizer.state = state
                for g, saved in zip(optimizer.param_groups, groups or [], strict=True):
                    g.update(saved)
            random.setstate(py_state)
            if np_random is not None and np_state is not None:
                np_random.set_state(np_state)


def _changed(now: torch.Tensor, before: torch.Tensor) -> bool:
    """Whether ``now`` differs from ``before``; True where that cannot be told (fake tensors
    under ``FakeTensorMode`` have no values to compare): then it is copied back anyway."""
    try:
        return not torch.equal(now, before)
    except Exception:  # noqa: BLE001 - a tensor subclass that cannot compare values
        return True


def _copied_state(state: Any) -> Any:
    """A copy of an optimizer's ``state`` (the same keys, tensors cloned) that the run may
    change in place."""
    from collections import defaultdict

    out: dict[Any, Any] = defaultdict(dict)
    for p, entry in state.items():
        out[p] = {k: (v.clone() if isinstance(v, torch.Tensor) else copy.deepcopy(v))
                  for k, v in entry.items()}
    return out


# ====================================================================== the step
def _loss_of(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out if out.dim() == 0 else out.float().sum()
    loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.dim() == 0:
        return loss
    parts = [t.float().sum() for _, t in iter_tensors(out) if t.requires_grad]
    if not parts:
        raise GradscopeError(
            "the forward's output does not require grad: there is no backward to measure "
            "(no parameter requires grad, or give loss_fn=)"
        )
    return torch.stack(parts).sum()


def _fake_cpu(fake: Any, t: torch.Tensor) -> torch.Tensor:
    """A fake tensor like ``t`` (shape, strides, dtype, requires_grad); a meta tensor's twin is
    a fake *CPU* tensor, so that operations pick the CPU's kernels (the CPU's fused attention,
    not the math fallback that meta tensors get)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if isinstance(t, FakeTensor):
        return t
    if t.device.type != "meta":
        return fake.from_tensor(t)
    with fake:
        out = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype,
                                  device="cpu")
    return out.requires_grad_(t.requires_grad)


def _call(model: torch.nn.Module, inputs: tuple[Any, ...]) -> Any:
    if len(inputs) == 1 and isinstance(inputs[0], dict):
        return model(**inputs[0])  # a dict of inputs is spread as keywords, as render does
    return model(*inputs)


class _Step:
    """One training step, told to a recorder phase by phase (``rec`` may be None)."""

    def __init__(self, model: torch.nn.Module, inputs: tuple[Any, ...], loss_fn: LossFn,
                 optimizer: Any, autocast: torch.dtype | None) -> None:
        self.model, self.inputs, self.loss_fn = model, inputs, loss_fn
        self.optimizer, self.autocast = optimizer, autocast
        self.params: list[torch.Tensor] = list(model.parameters())
        self.state: dict[str, torch.Tensor] | None = None  # fake twins (``fake_twin``)

    def fake_twin(self, fake: Any) -> None:
        """Run the step on fake copies of the parameters, buffers, inputs and optimizer
        (a ``FakeTensorMode`` for a meta model: code that reads values, such as Hugging
        Face's mask checks, sees fake tensors and skips what it cannot know)."""
        from .activations_recorder import _map_tensors

        twins: dict[int, torch.Tensor] = {}

        def twin(t: torch.Tensor) -> torch.Tensor:
            if id(t) not in twins:
                twins[id(t)] = _fake_cpu(fake, t)
            return twins[id(t)]

        state: dict[str, torch.Tensor] = {}
        for name, t in itertools.chain(self.model.named_parameters(remove_duplicate=False),
                                       self.model.named_buffers(remove_duplicate=False)):
            state[name] = twin(t)
        self.state = state
        self.params = [twins[id(p)] for p in self.model.parameters()]
        self.inputs = _map_tensors(self.inputs, twin)
        if self.optimizer is not None:
            old = self.optimizer
            groups = [{**{k: v for k, v in g.items() if k != "params"},
                       "params": [twin(p)
                                  for p in g["params"]]} for g in old.param_groups]
            new = type(old)(groups)
            for p, entry in old.state.items():
                if id(p) in twins:
                    new.state[twins[id(p)]] = {
                        k: _fake_cpu(fake, v) if isinstance(v, torch.Tensor) else v
                        for k, v in entry.items()}
            self.optimizer = new

    def call(self) -> Any:
        if self.state is None:
            return _call(self.model, self.inputs)
        kwargs = self.inputs[0] if len(self.inputs) == 1 and isinstance(
            self.inputs[0], dict) else {}
        args = () if kwargs else self.inputs
        return torch.func.functional_call(self.model, self.state, args, kwargs,
                                          tie_weights=True)

    def run(self, rec: Lifetimes | None, hook: Callable[[str], None] | None = None) -> None:
        if rec is not None:
            rec.begin_forward()
        device = device_of(self.model, self.inputs)
        cast = (torch.autocast(device.type, dtype=self.autocast) if self.autocast is not None
                else contextlib.nullcontext())
        with cast:
            out = self.call()
            loss = _loss_of(out if self.loss_fn is None else self.loss_fn(out))
        del out
        if rec is not None:
            rec.end_forward()
            rec.phase = "backward"
        if hook:
            hook("backward")
        loss.backward()
        del loss
        if rec is not None:
            rec.end_backward()
        if rec is not None:
            rec.mark((p.grad for p in self.params if p.grad is not None), GRADS)
        if self.optimizer is None:
            return
        if rec is not None:
            rec.phase = "optimizer"
        if hook:
            hook("optimizer")
        self.optimizer.step()
        if rec is not None:
            rec.mark(_state_tensors(self.optimizer), STATE)
        self.optimizer.zero_grad(set_to_none=True)


def _state_tensors(optimizer: Any) -> Iterator[torch.Tensor]:
    for entry in optimizer.state.values():
        for v in entry.values():
            if isinstance(v, torch.Tensor):
                yield v


def _cast(autocast: str | None) -> torch.dtype | None:
    if autocast is None:
        return None
    dtype = _AUTOCAST.get(str(autocast).lower())
    if dtype is None:
        raise GradscopeError(f"autocast={autocast!r}: expected one of bf16, fp16")
    return dtype


def _plan_modules(plan: Any) -> tuple[str, ...]:
    if plan is None:
        return ()
    modules = getattr(plan, "modules", plan)
    if isinstance(modules, str) or not all(isinstance(m, str) for m in modules):
        raise GradscopeError("plan= takes a CheckpointPlan (or a list of module names)")
    return tuple(modules)


@contextlib.contextmanager
def _applied(model: torch.nn.Module, modules: tuple[str, ...]) -> Iterator[None]:
    if not modules:
        yield
        return
    from .checkpoint_apply import apply_checkpoints

    with apply_checkpoints(model, modules):
        yield


def _check(model: Any, optimizer: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise GradscopeError(f"step_memory needs an nn.Module, got {type(model).__name__}")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise GradscopeError(
            f"optimizer= takes a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )


# ====================================================================== public
@isolating
def step_memory(
    model: torch.nn.Module,
    *inputs: Any,
    optimizer: Any = None,
    loss_fn: LossFn = None,
    autocast: str | None = None,
    plan: Any = None,
) -> StepMemory:
    """The peak memory of a training step, and what is live at that moment.

    Runs the forward (``loss_fn(output)``; without it, the output's ``loss`` or the sum of its
    tensors), the backward and, with ``optimizer``, ``optimizer.step()`` and ``zero_grad``
    twice (the first step makes the optimizer's state; the second is the steady state),
    under a recorder that follows every tensor storage's life. Everything is restored
    afterwards: parameters, gradients, optimizer state, buffers, RNG states. Works on a model
    built on the ``meta`` device, or under ``FakeTensorMode`` (nothing is allocated).

    Args:
        model: the module.
        *inputs: what to call it with (one dict: spread as keywords).
        optimizer: a ``torch.optim.Optimizer`` over the model's parameters.
        loss_fn: applied to the output, giving the loss to differentiate.
        autocast: ``"bf16"`` or ``"fp16"``: the forward under ``torch.autocast``.
        plan: a ``CheckpointPlan`` (or module names) applied for the step, removed after.

    Returns:
        ``StepMemory``: ``.peak``, ``.peak_phase``, ``.peak_at``, ``.at_peak``,
        ``.first_step``, ``.steady_state``, ``.timeline``, ``.fits(capacity)``.

    Example:
        >>> import torch, gradscope as gs
        >>> net = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Tanh(),
        ...                           torch.nn.Linear(256, 1))
        >>> opt = torch.optim.AdamW(net.parameters())
        >>> mem = gs.step_memory(net, torch.randn(64, 256), optimizer=opt)
        >>> mem.steady_state > mem.at_peak["parameters"]
        True
        >>> mem.fits("1GiB")
        True
    """
    _check(model, optimizer)
    dtype = _cast(autocast)
    modules = _plan_modules(plan)
    device = device_of(model, inputs)
    step = _Step(model, inputs, loss_fn, optimizer, dtype)
    rec = Lifetimes()
    rec.names = dynamo.module_names(model)  # no compile wrapper level
    if modules:
        from .activations_recorder import _rng_bytes
        from .activations_records import segment_paths

        rec.checkpoint_starts = {segment_paths(m)[0] for m in modules}
        rec.rng_bytes = _rng_bytes()
    notes: list[str] = []
    if device.type == "meta" and dtype is not None:
        notes.append("autocast: torch.autocast does not cast on the meta device; the figures "
                     "are those without autocast")
    from ..graph.scopes import scopes
    from .activations_recorder import _fake_mode

    fake = _fake_mode(model, inputs)
    pre = torch.nn.modules.module.register_module_forward_pre_hook(rec.pre)
    post = torch.nn.modules.module.register_module_forward_hook(rec.post)
    try:
        with _restored(model, optimizer, inputs), _applied(model, modules), (
                fake if fake is not None else contextlib.nullcontext()):
            if fake is not None:
                step.fake_twin(fake)
            rec.register_tensors(step.params + list((step.state or {}).values())
                                 if step.state is not None else
                                 step.params + list(model.buffers()), PARAMS)
            rec.register_tensors([t for _, t in iter_tensors(step.inputs)], INPUTS)
            if step.optimizer is not None:
                rec.register_tensors(list(_state_tensors(step.optimizer)), STATE)
            for k in (1, 2) if optimizer is not None else (1,):
                rec.step = k
                with scopes(model), rec:
                    step.run(rec)
            rec.close()
    finally:
        rec.open = False
        post.remove()
        pre.remove()
    return rec.result(device=str(device), optimizer=type(optimizer).__name__
                      if optimizer is not None else None, autocast=autocast and
                      str(autocast).lower(), plan=modules, notes=notes)


@isolating
def measure_step(
    model: torch.nn.Module,
    *inputs: Any,
    optimizer: Any = None,
    loss_fn: LossFn = None,
    autocast: str | None = None,
    plan: Any = None,
) -> tuple[int, int, str]:
    """``(first_step, steady_state, method)``: the step's peak bytes measured without the
    recorder: on the CPU the profiler's allocation and free events over each step (the
    running sum's maximum, plus what was live before), on CUDA ``max_memory_allocated`` after
    ``reset_peak_memory_stats``. Restores everything afterwards, like ``step_memory``."""
    _check(model, optimizer)
    dtype = _cast(autocast)
    modules = _plan_modules(plan)
    device = device_of(model, inputs)
    if device.type == "meta":
        raise GradscopeError("a model on the meta device allocates nothing: build it on a "
                             "real device to measure (step_memory works on meta)")
    step = _Step(model, inputs, loss_fn, optimizer, dtype)
    peaks: list[int] = []
    with _restored(model, optimizer, inputs), _applied(model, modules), new_objects_collected():
        before = _live_bytes(model, inputs, optimizer)
        carried = 0
        for _ in (1, 2) if optimizer is not None else (1,):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                start = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
                step.run(None)
                torch.cuda.synchronize(device)
                peaks.append(torch.cuda.max_memory_allocated(device) - start + before + carried)
                carried += torch.cuda.memory_allocated(device) - start
            else:
                high, left = _profiled(lambda: step.run(None))
                peaks.append(before + carried + high)
                carried += left
    first = peaks[0]
    return first, peaks[-1], "cuda" if device.type == "cuda" else "profiler"


def _live_bytes(model: torch.nn.Module, inputs: tuple[Any, ...], optimizer: Any) -> int:
    seen: dict[Any, int] = {}
    tensors = list(model.parameters()) + list(model.buffers())
    tensors += [t for _, t in iter_tensors(inputs)]
    if optimizer is not None:
        tensors += list(_state_tensors(optimizer))
    for t in tensors:
        st = t.untyped_storage()
        seen[(st.device.type, st.data_ptr())] = st.nbytes()
    return sum(seen.values())


def _profiled(fn: Callable[[], None]) -> tuple[int, int]:
    """(the running sum's maximum, bytes still allocated at the end) of the CPU allocations
    ``fn`` makes, from the profiler's allocation events."""
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():
        prof.start()
    try:
        fn()
    finally:
        with _quiet_stderr():
            prof.stop()
    events = cpu_allocations(prof, "the step")
    live: dict[int, int] = {}
    total = high = 0
    for _, ptr, size in events:
        if size > 0:
            live[ptr] = live.get(ptr, 0) + size
            total += size
        elif ptr in live:  # a free of something allocated during the run
            total -= live.pop(ptr)
        high = max(high, total)
    return high, total


def max_batch(
    build_inputs: Callable[[int], Any],
    model: torch.nn.Module,
    capacity: int | str,
    *,
    optimizer: Any = None,
    loss_fn: LossFn = None,
    autocast: str | None = None,
    plan: Any = None,
    limit: int = 1 << 16,
    build_target: Callable[[int], Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> MaxBatch:
    """The largest batch whose step peak (``step_memory``, steady state included) fits
    ``capacity``: doubling from 1 until a batch does not fit, then, in that bracket, aiming
    where the peak (close to affine in the batch) crosses the capacity, bisecting where that
    does not narrow it down.
    ``build_inputs(batch)`` returns the inputs (a tensor or a tuple); ``build_target(batch)``,
    when the loss takes a target, that batch's target (``loss_fn(output, target)`` is then
    called with it: the whole batch, inputs and target, is built for each candidate).
    ``progress(batch, peak)`` is called after each candidate. Build the model on the
    ``meta`` device to search without allocating.

    Returns:
        ``MaxBatch``: ``.batch``, ``.peak``, ``.at`` (its ``StepMemory``), ``.next_peak``,
        ``.summary()``: "batch 48 fits in 24 GiB (peak 23.1 GiB in the backward at ...);
        49 needs 24.3 GiB".
    """
    from .step_records import _capacity

    cap = _capacity(capacity)
    runs: dict[int, StepMemory] = {}

    def candidate(batch: int) -> StepMemory:
        inputs = build_inputs(batch)
        args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        loss = loss_fn
        if build_target is not None and loss_fn is not None:
            target, two = build_target(batch), cast(Callable[[Any, Any], Any], loss_fn)
            loss = lambda output: two(output, target)  # noqa: E731
        here = inspect.unwrap(step_memory)  # already inside the isolated call
        return here(model, *args, optimizer=optimizer, loss_fn=loss, autocast=autocast,
                    plan=plan)

    def peak(batch: int) -> int:
        if batch not in runs:  # the batch built and stepped where it changes nothing here
            runs[batch] = isolated(lambda: candidate(batch))
            if progress is not None:
                progress(batch, runs[batch].peak)
        return runs[batch].peak

    if limit < 1 or peak(1) > cap:
        return MaxBatch(0, cap, None, None, None, tuple((b, m.peak) for b, m in runs.items()))
    lo, hi = 1, limit + 1  # lo fits; hi does not (limit + 1: not known yet)
    bounded = False  # whether a batch that does not fit was found
    halve = False
    while hi - lo > 1:
        if not bounded:
            guess = lo * 2  # doubling until a batch does not fit (small batches are cheap)
        elif halve:
            guess = (lo + hi) // 2
        else:  # within the bracket the peak is close to affine: aim where it crosses
            slope = (peak(hi) - peak(lo)) / (hi - lo)
            guess = lo + int((cap - peak(lo)) / slope) if slope > 0 else (lo + hi) // 2
        guess = min(max(guess, lo + 1), hi - 1)
        width = hi - lo
        if peak(guess) <= cap:
            lo = guess
        else:
            hi, bounded = guess, True
        # an aim that does not halve the bracket gives way to a bisection next
        halve = bounded and not halve and (hi - lo) * 2 > width
    tried = tuple(sorted((b, m.peak) for b, m in runs.items()))
    if lo == 0:
        return MaxBatch(0, cap, None, None, None, tried)
    nxt = peak(lo + 1) if lo + 1 <= limit else None
    tried = tuple(sorted((b, m.peak) for b, m in runs.items()))
    return MaxBatch(lo, cap, runs[lo].peak, runs[lo], nxt, tried)


__all__ = ["max_batch", "measure_step", "step_memory"]
