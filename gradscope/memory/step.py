"""``gs.step_memory``: the peak memory of a whole training step, recorded storage by storage;
``gs.max_batch``: the largest batch whose step fits; ``measure_step``: the same peak measured
by independent means (the profiler's allocation events on the CPU, the CUDA allocator's peak).

A step runs the forward (and ``loss_fn``), the backward and, with ``optimizer=``,
``optimizer.step()`` and ``optimizer.zero_grad(set_to_none=True)``; with an optimizer two steps
run, the first making the optimizer's state, the second the steady state. Each public call runs
where it changes nothing (``untouched``): in a forked child, else here under ``restored``,
which puts back what the step can reach (all but the version counters of the parameters the
optimizer stepped, and changes deep inside objects the modules hold); the step hooks do not
fire either way. The recorder is in ``step_recorder``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .._torch import dynamo, torchcompat
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
from .untouched import (
    _random_kept,
    captured_error,
    isolated,
    isolating,
    restored,
)

LossFn = Callable[[Any], Any] | None
_AUTOCAST = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
             "fp16": torch.float16, "float16": torch.float16, "half": torch.float16}


# ====================================================================== the step
_NO_BACKWARD = ("there is no backward to measure: {what} does not require grad (no parameter "
                "of the model requires grad, or the forward ran under torch.no_grad); unfreeze "
                "the parameters to train (requires_grad_(True)){hint}")


def _loss_of(out: Any, model: torch.nn.Module | None = None) -> torch.Tensor:
    loss: Any
    if isinstance(out, torch.Tensor):
        loss = out if out.dim() == 0 or not out.requires_grad else out.float().sum()
    else:
        loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
        if not (isinstance(loss, torch.Tensor) and loss.dim() == 0 and loss.requires_grad):
            parts = [t.float().sum() for _, t in iter_tensors(out) if t.requires_grad]
            loss = torch.stack(parts).sum() if parts else None
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        frozen = model is not None and not any(p.requires_grad for p in model.parameters())
        raise GradscopeError(_NO_BACKWARD.format(
            what="the loss" if isinstance(loss, torch.Tensor) else "the forward's output",
            hint="" if frozen else ", or give loss_fn= returning the loss"))
    return loss


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
                 optimizer: Any, autocast: torch.dtype | None, target: Any = None) -> None:
        self.model, self.inputs, self.loss_fn = model, inputs, loss_fn
        self.optimizer, self.autocast, self.target = optimizer, autocast, target
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
        if self.target is not None:
            self.target = _map_tensors(self.target, twin)
        if self.optimizer is not None:
            self.optimizer = _twin_optimizer(self.optimizer, twin, twins,
                                             functools.partial(_fake_cpu, fake))

    def call(self) -> Any:
        if self.state is None:
            return _call(self.model, self.inputs)
        kwargs = self.inputs[0] if len(self.inputs) == 1 and isinstance(
            self.inputs[0], dict) else {}
        args = () if kwargs else self.inputs
        return torch.func.functional_call(self.model, self.state, args, kwargs,
                                          tie_weights=True)

    @contextlib.contextmanager
    def _mismatch_said(self, where: str, device: torch.device) -> Iterator[None]:
        """A device mismatch raised in the block becomes the one line of ``captured_error``."""
        try:
            yield
        except Exception as exc:
            said = captured_error(exc, where, device, self.state is not None)
            if said is None:
                raise
            raise said from None

    def run(self, rec: Lifetimes | None, hook: Callable[[str], None] | None = None) -> None:
        if rec is not None:
            rec.begin_forward()
        device = device_of(self.model, self.inputs)
        cast = (torch.autocast(device.type, dtype=self.autocast) if self.autocast is not None
                else contextlib.nullcontext())
        with cast:
            with self._mismatch_said("the forward", device):
                out = self.call()
            with self._mismatch_said("the loss function", device):
                fn: Any = self.loss_fn
                res = (out if fn is None else fn(out) if self.target is None
                       else fn(out, self.target))
            loss = _loss_of(res, self.model)
        del out, res
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


def _settled(scope: Any) -> Callable[[str], None]:
    """The hook that takes the scope recorder's hook modes off once the forward and the loss
    are over (``ScopeRecorder.settle``), before the backward. One is left on for a module
    with forward hooks of its own (FSDP2's root, a ``fully_shard``-ed module) until the next
    module call or the block's end, and it holds that module's ``Module._call_impl`` frame,
    whose ``result`` is the module's output: the model's output (the logits) would stay alive
    through the backward, which a step without the recorder frees in it (when its backward
    node, ``PowBackward0`` or ``LogSoftmaxBackward0``, has run)."""

    def hook(phase: str) -> None:
        if phase == "backward":
            scope.settle()

    return hook


def _twin_optimizer(old: Any, twin: Callable[[torch.Tensor], torch.Tensor],
                    twins: dict[int, torch.Tensor],
                    fake: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """The optimizer ``old`` over the twins of its parameters, its state twinned too: a copy
    of the object (its class, its own attributes, so a subclass whose constructor takes
    arguments of its own is rebuilt as it is) with param groups and state of its own."""
    from collections import defaultdict

    new = object.__new__(type(old))
    new.__dict__.update(vars(old))
    new.param_groups = [{**{k: v for k, v in g.items() if k != "params"},
                         "params": [twin(p) for p in g["params"]]} for g in old.param_groups]
    state: dict[Any, Any] = defaultdict(dict)
    for p, entry in old.state.items():
        if id(p) in twins:
            state[twins[id(p)]] = {k: fake(v) if isinstance(v, torch.Tensor) else v
                                   for k, v in entry.items()}
    new.state = state
    return new


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
    if isinstance(modules, (list, tuple)) and all(isinstance(m, str) for m in modules):
        return tuple(modules)
    raise GradscopeError(
        f"plan={_short(plan)}: plan= takes a CheckpointPlan (gs.plan_checkpoints) or a list "
        "of module names, such as plan=['blocks.0', 'blocks.1']"
    )


def _short(value: Any, width: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


@contextlib.contextmanager
def _applied(model: torch.nn.Module, modules: tuple[str, ...]) -> Iterator[None]:
    if not modules:
        yield
        return
    from .checkpoint_apply import apply_checkpoints

    with apply_checkpoints(model, modules):
        yield


def _process_group() -> tuple[int | None, int | None]:
    """(rank, world size) of the default process group; (None, None) without one."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None, None
    return dist.get_rank(), dist.get_world_size()


def _backend() -> str | None:
    """The default process group's backend (``gloo``, ``nccl``, ``fake``...), or None."""
    if _process_group()[0] is None:
        return None
    return str(torch.distributed.get_backend())


def _sharded(model: torch.nn.Module) -> bool:
    """Whether some parameter of ``model`` is a DTensor (FSDP2, tensor parallel)."""
    return any(map(torchcompat.is_dtensor, model.parameters()))


def _check(model: Any, optimizer: Any, loss_fn: LossFn = None, target: Any = None) -> None:
    if not isinstance(model, torch.nn.Module):
        raise GradscopeError(f"step_memory needs an nn.Module, got {type(model).__name__}")
    if _sharded(model) and _process_group()[0] is None:
        raise GradscopeError(
            "the model's parameters are DTensors (fully_shard, parallelize_module) but no "
            "process group is initialised: call it on every rank after "
            "torch.distributed.init_process_group, as training runs")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise GradscopeError(
            f"optimizer= takes a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    if optimizer is not None and _needs_closure(optimizer):
        raise GradscopeError(
            f"optimizer={type(optimizer).__name__}: its step() needs a closure that reruns the "
            "forward and backward (several times a step), which the step memory does not "
            "record; measure with an optimizer whose step() takes no closure (SGD or AdamW "
            "over the same parameters: the same forward and backward), or without optimizer="
        )
    if target is not None and loss_fn is None:
        raise GradscopeError("target= is passed to loss_fn(output, target): give loss_fn= too")


def _needs_closure(optimizer: Any) -> bool:
    """Whether ``optimizer.step()`` cannot be called without a closure (``LBFGS``)."""
    try:
        params = inspect.signature(optimizer.step).parameters
    except (TypeError, ValueError):
        return False
    closure = params.get("closure")
    return closure is not None and closure.default is inspect.Parameter.empty


# ====================================================================== public
@isolating
def step_memory(
    model: torch.nn.Module,
    *inputs: Any,
    optimizer: Any = None,
    loss_fn: LossFn = None,
    autocast: str | None = None,
    plan: Any = None,
    target: Any = None,
) -> StepMemory:
    """The peak memory of a training step, and what is live at that moment.

    Runs the forward (``loss_fn(output)``; without it, the output's ``loss`` or the sum of its
    tensors), the backward and, with ``optimizer``, ``optimizer.step()`` and ``zero_grad``
    twice (the first step makes the optimizer's state; the second is the steady state),
    under a recorder that follows every tensor storage's life. Nothing the caller has is
    changed: the step runs in a forked child, or where it cannot (CUDA initialised,
    ``GRADSCOPE_FORK=0``...) here, with parameters, gradients, optimizer state, buffers,
    attributes, generators and RNG states put back (see the module's docstring); the
    optimizer's step hooks do not fire. Works on a model built on the ``meta`` device, or
    under ``FakeTensorMode`` (nothing is allocated).

    Under an initialised process group (FSDP2, tensor parallel, FSDP2 x TP) the figures are
    this rank's (``.rank``, ``.world_size``): DTensors count their local shards, FSDP2's
    all-gathered parameters and collective buffers have categories of their own. The steps
    make the training step's collectives, so **every rank must call it together**, as it
    calls the training step; it then runs in this process (``restored``). An FSDP2 model
    too large to allocate: build and shard it on ``meta`` under a fake process group, then
    ``to_empty(device="cpu")`` and call this inside one ``FakeTensorMode``.

    Args:
        model: the module.
        *inputs: what to call it with (one dict: spread as keywords).
        optimizer: a ``torch.optim.Optimizer`` over the model's parameters.
        loss_fn: applied to the output, giving the loss to differentiate.
        autocast: ``"bf16"`` or ``"fp16"``: the forward under ``torch.autocast``.
        plan: a ``CheckpointPlan`` (or module names) applied for the step, removed after.
        target: the batch's target: ``loss_fn(output, target)`` is then called. Pass it here
            rather than closing over it in ``loss_fn``: it is part of the batch (counted with
            the inputs), and on a meta model it follows the model onto the stand-in tensors
            the step is measured on (a captured tensor cannot: that is a one-line error).

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
    _check(model, optimizer, loss_fn, target)
    dtype = _cast(autocast)
    modules = _plan_modules(plan)
    device = device_of(model, inputs)
    step = _Step(model, inputs, loss_fn, optimizer, dtype, target)
    rec = Lifetimes()
    rec.names = dynamo.module_names(model)  # no compile wrapper level
    rec.gloo = _backend() == "gloo"
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
    if fake is not None and _sharded(model):
        fake = None  # FSDP2/DTensor on meta: run as it is (twins would lose the sharding)
    pre = torch.nn.modules.module.register_module_forward_pre_hook(rec.pre)
    post = torch.nn.modules.module.register_module_forward_hook(rec.post)
    try:
        with restored(model, optimizer, inputs), _applied(model, modules), (
                fake if fake is not None else contextlib.nullcontext()):
            if fake is not None:
                step.fake_twin(fake)
            rec.register_tensors(step.params + list((step.state or {}).values())
                                 if step.state is not None else
                                 step.params + list(model.buffers()), PARAMS)
            rec.register_tensors([t for _, t in iter_tensors((step.inputs, step.target))],
                                 INPUTS)
            if step.optimizer is not None:
                rec.register_tensors(list(_state_tensors(step.optimizer)), STATE)
            with rec.fsdp_watched(model):
                for k in (1, 2) if optimizer is not None else (1,):
                    rec.step = k
                    with scopes(model) as scope, rec:
                        step.run(rec, _settled(scope))
            rec.close()
    finally:
        rec.open = False
        post.remove()
        pre.remove()
    rank, world = _process_group()
    return rec.result(device=str(device), optimizer=type(optimizer).__name__
                      if optimizer is not None else None, autocast=autocast and
                      str(autocast).lower(), plan=modules, notes=notes, rank=rank,
                      world_size=world)


@isolating
def measure_step(
    model: torch.nn.Module,
    *inputs: Any,
    optimizer: Any = None,
    loss_fn: LossFn = None,
    autocast: str | None = None,
    plan: Any = None,
    target: Any = None,
) -> tuple[int, int, str]:
    """``(first_step, steady_state, method)``: the step's peak bytes measured without the
    recorder: on the CPU the profiler's allocation and free events over each step (the
    running sum's maximum, plus what was live before), on CUDA ``max_memory_allocated`` after
    ``reset_peak_memory_stats``. Changes nothing, like ``step_memory`` (``target=`` too)."""
    _check(model, optimizer, loss_fn, target)
    dtype = _cast(autocast)
    modules = _plan_modules(plan)
    device = device_of(model, inputs)
    if device.type == "meta":
        raise GradscopeError("a model on the meta device allocates nothing: build it on a "
                             "real device to measure (step_memory works on meta)")
    step = _Step(model, inputs, loss_fn, optimizer, dtype, target)
    peaks: list[int] = []
    with restored(model, optimizer, inputs), _applied(model, modules), new_objects_collected():
        before = _live_bytes(model, (inputs, target), optimizer)
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


def _live_bytes(model: torch.nn.Module, inputs: Any, optimizer: Any) -> int:
    seen: dict[Any, int] = {}
    tensors = list(model.parameters()) + list(model.buffers())
    tensors += [t for _, t in iter_tensors(inputs)]
    if optimizer is not None:
        tensors += list(_state_tensors(optimizer))
    for t in tensors:
        st = torchcompat.local_tensor(t).untyped_storage()
        if st.nbytes():  # (FSDP2's freed unsharded parameters: resized to nothing)
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


def _highest_over_ranks(peak: int) -> int:
    """The largest of every rank's ``peak`` under a process group (so that each rank's
    search takes the same steps, each with its collectives); ``peak`` without one, or on the
    ``fake`` backend (one process standing for a rank: there is no other to ask)."""
    dist = torch.distributed
    if _process_group()[0] is None or dist.get_backend() == "fake":
        return peak
    peaks: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(peaks, peak)
    return max(int(p) for p in peaks)


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
    for name, fn in (("build_inputs", build_inputs), ("build_target", build_target),
                     ("progress", progress)):
        if fn is not None and not callable(fn):
            raise GradscopeError(f"{name}= takes a function of the batch size, got "
                                 f"{type(fn).__name__}")
    if build_inputs is None:
        raise GradscopeError("max_batch needs build_inputs(batch), the inputs of a batch of "
                             "that size")
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise GradscopeError(f"limit={limit!r}: expected a whole number of samples")
    _check(model, optimizer)
    runs: dict[int, StepMemory] = {}
    agreed: dict[int, int] = {}

    devices = [d.index for d in {p.device for p in model.parameters()} if d.type == "cuda"]

    def candidate(batch: int) -> StepMemory:
        with _random_kept(devices):  # building the batch draws from no RNG of the caller's
            inputs = build_inputs(batch)
            target = build_target(batch) if build_target is not None else None
        args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
        here = inspect.unwrap(step_memory)  # already inside the isolated call
        return here(model, *args, optimizer=optimizer, loss_fn=loss_fn, autocast=autocast,
                    plan=plan, target=target if loss_fn is not None else None)

    def peak(batch: int) -> int:
        if batch not in runs:  # the batch built and stepped where it changes nothing here
            runs[batch] = isolated(lambda: candidate(batch))
            # under a process group every rank decides alike, on the largest rank's peak
            agreed[batch] = _highest_over_ranks(runs[batch].peak)
            if progress is not None:
                progress(batch, agreed[batch])
        return agreed[batch]

    if limit < 1 or peak(1) > cap:
        return MaxBatch(0, cap, None, None, None, tuple(agreed.items()))
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
    tried = tuple(sorted(agreed.items()))
    if lo == 0:
        return MaxBatch(0, cap, None, None, None, tried)
    nxt = peak(lo + 1) if lo + 1 <= limit else None
    tried = tuple(sorted(agreed.items()))
    return MaxBatch(lo, cap, agreed[lo], runs[lo], nxt, tried)


__all__ = ["max_batch", "measure_step", "step_memory"]
