"""Activation memory per module, checkpoint plans, and their verification.

- ``activation_report(model, *inputs, loss_fn=None)``: one recorded forward (saved-tensor
  hooks, global module hooks, ``torch.utils.flop_counter``) read into the plain
  ``ActivationReport`` of ``gradscope.model.memplan``. Works on the ``meta`` device (a model
  built without weights), where nothing is allocated.
- ``plan_checkpoints(model, *inputs, budget=..., loss_fn=None)``: the report's plan, as a
  ``CheckpointPlan`` that ``.apply(model)`` wraps in non-reentrant checkpoints (and whose
  handle's ``.remove()`` restores the model exactly) and ``.verify(...)`` measures.
- ``measure_forward(model, *inputs, loss_fn=None)``: bytes allocated by a forward and still
  held at its end, outputs apart, seen by the profiler (CPU) or the CUDA allocator: a means
  independent of the report's own counting.

Nothing the user gave is changed: the forwards run with the RNG state and the buffers
(BatchNorm's running statistics) restored afterwards, and no gradient is computed.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from ..errors import GradscopeError
from ..model.memplan import (
    ACTIVATION,
    INPUT,
    OUTPUT,
    PARAM,
    ActivationReport,
    BudgetError,
    ModuleInfo,
    ModuleRow,
    Plan,
    Storage,
    Verification,
    parse_size,
)
from .memory import _HooksGuard, _leaf_base, _Listener
from .nest import iter_tensors

LossFn = Callable[[Any], Any] | None

_AUTOCAST = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
             "fp16": torch.float16, "float16": torch.float16, "half": torch.float16}


# ====================================================================== recording
def _key(t: torch.Tensor) -> tuple[Any, int]:
    """(identity, bytes) of ``t``'s storage."""
    try:
        st = t.untyped_storage()
        return (t.device.type, st._cdata), st.nbytes()
    except (RuntimeError, NotImplementedError, AttributeError):
        return ("tensor", id(t)), t.numel() * t.element_size()


class _Recorder(_Listener):
    """One forward: every save (storage, module stack, alive?) and every module call."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.names: dict[int, str] = {}
        self.cls: dict[str, str] = {}
        self.parent: dict[str, str | None] = {}
        self.in_container: set[str] = set()
        self.builtin: set[str] = set()
        for name, mod in model.named_modules():
            self.names[id(mod)] = name
            if type(mod).__module__.startswith("torch.nn."):
                self.builtin.add(name)
            self.cls[name] = type(mod).__name__
            self.parent[name] = None if name == "" else name.rpartition(".")[0]
            if isinstance(mod, (torch.nn.ModuleList, torch.nn.Sequential)):
                for child, _ in mod.named_children():
                    self.in_container.add(f"{name}.{child}" if name else child)
        self.stack: list[tuple[int, str | None]] = []
        self.saves: list[tuple[Any, int, tuple[str, ...], weakref.ref[torch.Tensor], str]] = []
        self.calls: dict[str, int] = {}
        self.order: list[str] = []
        self.inputs: dict[str, dict[Any, tuple[int, str]]] = {}
        self.held: list[torch.Tensor] = []  # detached aliases: input storages stay identifiable
        self.leaf_keys: set[Any] = set()

    def path_stack(self) -> tuple[str, ...]:
        return tuple(p for _, p in self.stack if p is not None)

    def on_pack(self, tensor: torch.Tensor, payload: torch.Tensor) -> None:
        key, nbytes = _key(tensor)
        if _leaf_base(tensor):
            self.leaf_keys.add(key)
        self.saves.append((key, nbytes, self.path_stack(), weakref.ref(payload),
                           str(tensor.dtype).replace("torch.", "")))

    def pre(self, module: torch.nn.Module, args: Any) -> None:
        path = self.names.get(id(module))
        self.stack.append((id(module), path))
        if path is not None:
            if path not in self.calls:
                self.order.append(path)
            self.calls[path] = self.calls.get(path, 0) + 1

    def post(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if not self.stack or self.stack[-1][0] != id(module):
            return
        _, path = self.stack.pop()
        if path is None:
            return
        kept = self.inputs.setdefault(path, {})
        for _, t in iter_tensors((args, kwargs), "input"):
            key, nbytes = _key(t)
            if key not in kept:
                kept[key] = (nbytes, str(t.dtype).replace("torch.", ""))
                self.held.append(t.detach())

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        pre = torch.nn.modules.module.register_module_forward_pre_hook(self.pre)
        post = torch.nn.modules.module.register_module_forward_hook(self.post, with_kwargs=True)
        guard = _HooksGuard(self)
        try:
            guard.push()
            yield
        finally:
            guard.pop()
            post.remove()
            pre.remove()
            # torch's handle forgets the with_kwargs flag of a global hook (2.13, 2.14): left
            # there it makes every later torch.compile(module) warn about global hooks
            flags = getattr(torch.nn.modules.module, "_global_forward_hooks_with_kwargs", None)
            if isinstance(flags, dict):
                flags.pop(post.id, None)


def _flops_by_module(counts: dict[str, dict[Any, int]], model: torch.nn.Module) -> dict[str, int]:
    """``FlopCounterMode.get_flop_counts()`` keyed by ``named_modules()`` names."""
    root = type(model).__name__
    out: dict[str, int] = {}
    for name, per_op in counts.items():
        if name == root:
            path = ""
        elif name.startswith(root + "."):
            path = name[len(root) + 1:]
        else:
            continue
        out[path] = sum(per_op.values())
    return out


def _forward(model: torch.nn.Module, inputs: tuple[Any, ...], loss_fn: LossFn) -> Any:
    out = model(*inputs)
    return out if loss_fn is None else loss_fn(out)


@contextlib.contextmanager
def _preserved(model: torch.nn.Module) -> Iterator[None]:
    """Run forwards without leaving a trace: RNG states and buffers restored afterwards."""
    buffers = [(b, b.detach().clone()) for b in model.buffers() if b.device.type != "meta"]
    devices = [d for d in {b.device for b in model.parameters()} if d.type == "cuda"]
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        try:
            yield
        finally:
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)


def _record(model: torch.nn.Module, inputs: tuple[Any, ...], loss_fn: LossFn,
            autocast: torch.dtype | None = None, fake: Any = None,
            state: dict[str, torch.Tensor] | None = None,
            ) -> tuple[_Recorder, dict[str, int], set[Any]]:
    from torch.utils.flop_counter import FlopCounterMode

    rec = _Recorder(model)
    device = _device_of(model, inputs)
    cast = (torch.autocast(device.type, dtype=autocast) if autocast is not None
            else contextlib.nullcontext())
    counter = FlopCounterMode(display=False)
    run: Callable[..., Any] = model
    if fake is not None and state is not None:
        # the forward sees the very fake tensors whose storages _report classified
        run = functools.partial(torch.func.functional_call, model, state, tie_weights=True)
    with fake if fake is not None else contextlib.nullcontext(), rec.installed(), counter, cast:
        out = run(*inputs) if fake is None else run(inputs)
        root = out if loss_fn is None else loss_fn(out)
        del out
    gc.collect()
    out_keys = {_key(t)[0] for _, t in iter_tensors(root)}
    if not any(t.requires_grad for _, t in iter_tensors(root)):
        raise GradscopeError(
            "the forward's output does not require grad (no parameter requires grad, or the "
            "forward ran under torch.no_grad): there are no activations to plan for"
        )
    flops = _flops_by_module(counter.get_flop_counts(), model)
    # the liveness of each save is read while the outputs (and their graph) are held
    alive = [s for s in rec.saves if s[3]() is not None]
    rec.saves = alive
    del root
    return rec, flops, out_keys


def _device_of(model: torch.nn.Module, inputs: tuple[Any, ...]) -> torch.device:
    for p in model.parameters():
        return p.device
    for _, t in iter_tensors(inputs):
        return t.device
    return torch.device("cpu")


def _report(model: torch.nn.Module, inputs: tuple[Any, ...], loss_fn: LossFn,
            autocast: torch.dtype | None = None) -> ActivationReport:
    fake = _fake_mode(model, inputs)
    state: dict[str, torch.Tensor] | None = None
    pre: dict[Any, str] = {}
    if fake is None:
        for t in list(model.parameters()) + list(model.buffers()):
            pre[_key(t)[0]] = PARAM
    else:  # fake copies, kept alive here (the converter's memo is weak), run by functional_call
        state = {n: fake.from_tensor(t) for n, t in itertools.chain(
            model.named_parameters(remove_duplicate=False),
            model.named_buffers(remove_duplicate=False))}
        for t in state.values():
            pre[_key(t)[0]] = PARAM
        inputs = _map_tensors(inputs, fake.from_tensor)
    for _, t in iter_tensors(inputs, "input"):
        pre.setdefault(_key(t)[0], INPUT)
    rec, flops, out_keys = _record(model, inputs, loss_fn, autocast, fake, state)
    for k in rec.leaf_keys:
        pre.setdefault(k, PARAM)

    ids: dict[Any, str] = {}
    sizes: dict[Any, int] = {}
    dtypes: dict[Any, str] = {}
    saves: dict[Any, list[tuple[str, ...]]] = {}
    first: dict[Any, tuple[str, ...]] = {}
    for key, nbytes, stack, _, dtype in rec.saves:
        ids.setdefault(key, f"s{len(ids)}")
        sizes[key] = max(sizes.get(key, 0), nbytes)
        dtypes.setdefault(key, dtype)
        saves.setdefault(key, []).append(stack)
        first.setdefault(key, stack)
    for path in rec.order:
        for key, (nbytes, dtype) in rec.inputs.get(path, {}).items():
            ids.setdefault(key, f"s{len(ids)}")
            sizes[key] = max(sizes.get(key, 0), nbytes)
            dtypes.setdefault(key, dtype)

    def kind(key: Any) -> str:
        if key in pre:
            return pre[key]
        return OUTPUT if key in out_keys else ACTIVATION

    storages = [Storage(ids[k], sizes[k], kind(k), tuple(dict.fromkeys(saves.get(k, ()))),
                        dtypes.get(k, "")) for k in ids]
    modules: dict[str, ModuleInfo] = {}
    for path in rec.order:
        modules[path] = ModuleInfo(
            path, rec.cls.get(path, "?"), rec.parent.get(path), rec.calls[path],
            tuple(ids[k] for k in rec.inputs.get(path, {})), flops.get(path, 0),
            path in rec.in_container, path in rec.builtin,
        )
    total = sum(sizes[k] for k in ids if kind(k) == ACTIVATION and saves.get(k))
    inclusive: dict[str, int] = {}
    for k, stack in first.items():
        if kind(k) != ACTIVATION:
            continue
        for path in stack:
            inclusive[path] = inclusive.get(path, 0) + sizes[k]
    device = _device_of(model, inputs)
    rep = ActivationReport(total=total, rows=[], storages=storages, modules=modules,
                           overhead=_rng_bytes(), device=str(device))
    rep.rows = [ModuleRow(p, inclusive.get(p, 0), rep.checkpoint_saves(p), modules[p].flops,
                          modules[p].calls) for p in rec.order]
    del rec
    return rep


def _fake_mode(model: torch.nn.Module, inputs: tuple[Any, ...]) -> Any:
    """A ``FakeTensorMode`` for a model or inputs on the meta device (None otherwise): code
    that reads values (Hugging Face's mask checks) sees fake tensors and skips what it cannot
    know, and nothing is allocated."""
    tensors = [t for _, t in iter_tensors(inputs)] + list(model.parameters())
    if not any(t.device.type == "meta" for t in tensors):
        return None
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    if any(isinstance(t, FakeTensor) for t in tensors):
        return None  # already fake: the caller's mode is running
    return FakeTensorMode(allow_non_fake_inputs=True)


def _map_tensors(x: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, (tuple, list)):
        return type(x)(_map_tensors(v, fn) for v in x)
    if isinstance(x, dict):
        return {k: _map_tensors(v, fn) for k, v in x.items()}
    return x


@functools.cache
def _rng_bytes() -> int:
    """Bytes of the CPU RNG state a checkpoint keeps per call (``preserve_rng_state``)."""
    return torch.get_rng_state().untyped_storage().nbytes()


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
            extrapolated linearly from this batch and half of it (dimension 0 of the inputs).

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
    with _preserved(model):
        rep = _report(model, inputs, loss_fn)
        if autocast is not None:
            dtype = _AUTOCAST.get(str(autocast).lower())
            if dtype is None:
                raise GradscopeError(
                    f"autocast={autocast!r}: expected one of bf16, fp16"
                )
            _autocast_column(rep, model, inputs, loss_fn, dtype, str(autocast).lower())
        if batch_scale is not None:
            _scaled_column(rep, model, inputs, loss_fn, float(batch_scale))
    return rep


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
    if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch:
        return x[:n]
    if isinstance(x, (tuple, list)):
        return type(x)(_slice_batch(v, batch, n) for v in x)
    if isinstance(x, dict):
        return {k: _slice_batch(v, batch, n) for k, v in x.items()}
    return x


def _with(row: ModuleRow, **changes: Any) -> ModuleRow:
    from dataclasses import replace

    return replace(row, **changes)


# ====================================================================== public: plans
class _Checkpointed:
    """A module's forward, run under a non-reentrant ``torch.utils.checkpoint``."""

    def __init__(self, forward: Callable[..., Any]) -> None:
        self.forward = forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(self.forward, *args, use_reentrant=False, **kwargs)


class CheckpointHandle:
    """What ``CheckpointPlan.apply`` installed; ``.remove()`` restores the model exactly
    (idempotent; also a context manager)."""

    def __init__(self) -> None:
        self._undo: list[tuple[torch.nn.Module, bool, Any, _Checkpointed]] = []
        self.removed = False

    def remove(self) -> None:
        undo, self._undo = self._undo, []
        self.removed = True
        for mod, had, previous, wrapper in reversed(undo):
            if mod.__dict__.get("forward") is not wrapper:
                continue  # replaced by someone else since: leave theirs
            if had:
                mod.__dict__["forward"] = previous
            else:
                del mod.__dict__["forward"]

    def __enter__(self) -> CheckpointHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def apply_checkpoints(model: torch.nn.Module, modules: tuple[str, ...] | list[str]
                      ) -> CheckpointHandle:
    """Wrap each named submodule's forward in a non-reentrant checkpoint (an instance
    attribute ``forward``; parameters, buffers, hooks and the state dict are untouched)."""
    handle = CheckpointHandle()
    try:
        for path in modules:
            try:
                mod = model.get_submodule(path)
            except AttributeError:
                raise BudgetError(
                    f"the plan names module {path!r}, which this model does not have"
                ) from None
            had = "forward" in mod.__dict__
            previous = mod.__dict__.get("forward")
            wrapper = _Checkpointed(mod.forward)
            mod.__dict__["forward"] = wrapper
            handle._undo.append((mod, had, previous, wrapper))
    except BaseException:
        handle.remove()
        raise
    return handle


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

    def verify(self, model: torch.nn.Module, *inputs: Any, loss_fn: LossFn = None
               ) -> Verification:
        """Measure the forward with and without the plan (``measure_forward``)."""
        with _preserved(model):
            base, method = _measure(model, inputs, loss_fn)
            with self.apply(model):
                measured, _ = _measure(model, inputs, loss_fn)
        return Verification(self.predicted, self.baseline, measured, base, method, self.budget)


def plan_checkpoints(
    model: torch.nn.Module,
    *inputs: Any,
    budget: int | str,
    loss_fn: LossFn = None,
    report: ActivationReport | None = None,
    max_recompute: int | str | None = None,
) -> CheckpointPlan:
    """The modules to checkpoint so the activations held at the end of the forward fit
    ``budget``, with the least recompute.

    Args:
        model, inputs, loss_fn: as for ``activation_report`` (a meta model plans too).
        budget: bytes, or a string: ``"2GiB"``, ``"300MB"``, ``"50%"`` (of the baseline).
        report: a report of the same model and inputs, to plan without another forward.
        max_recompute: leave out modules that free more than this (bytes, ``"64MiB"``,
            ``"10%"``): the backward brings about that much back at once when it recomputes
            one (see ``ActivationReport.plan``).

    Returns:
        ``CheckpointPlan``: ``.modules`` (none nested in another), ``.predicted``,
        ``.baseline``, ``.recompute_flops``, ``.apply(model)``, ``.verify(model, *inputs)``.

    Raises:
        BudgetError (a ``GradscopeError``): the budget cannot be read, or no plan reaches
        it; the message says the smallest reachable figure.
    """
    rep = report if report is not None else activation_report(model, *inputs, loss_fn=loss_fn)
    plan = rep.plan(budget, max_recompute=max_recompute)
    return CheckpointPlan(plan.modules, plan.predicted, plan.baseline, plan.recompute_flops,
                          plan.budget, plan.recompute_bytes)


def as_checkpoint_plan(plan: Plan) -> CheckpointPlan:
    """A plain ``Plan`` (from ``ActivationReport.evaluate`` or ``.sweep``) made appliable."""
    return CheckpointPlan(plan.modules, plan.predicted, plan.baseline, plan.recompute_flops,
                          plan.budget, plan.recompute_bytes)


# ====================================================================== measurement
def measure_forward(model: torch.nn.Module, *inputs: Any, loss_fn: LossFn = None) -> int:
    """Bytes allocated by one forward (and ``loss_fn``) and still held at its end, the
    outputs' storages apart: on the CPU from the profiler's allocation events (matched by
    address), on CUDA from ``torch.cuda.memory_allocated``. Independent of the saved-tensor
    accounting ``activation_report`` uses; RNG state and buffers are restored afterwards."""
    with _preserved(model):
        return _measure(model, inputs, loss_fn)[0]


def _measure(model: torch.nn.Module, inputs: tuple[Any, ...], loss_fn: LossFn
             ) -> tuple[int, str]:
    device = _device_of(model, inputs)
    if device.type == "meta":
        raise GradscopeError(
            "a model on the meta device allocates nothing: build it on a real device to "
            "measure (the report and the plan work on meta)"
        )
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        root = _forward(model, inputs, loss_fn)
        gc.collect()
        torch.cuda.synchronize(device)
        after = torch.cuda.memory_allocated(device)
        outs = {_key(t)[0]: _key(t)[1] for _, t in iter_tensors(root) if t.device == device}
        del root
        return after - before - sum(outs.values()), "cuda"
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with _quiet_stderr():  # kineto prints a line on start and stop at the C level
        prof.start()
    try:
        root = _forward(model, inputs, loss_fn)
        gc.collect()
    finally:
        with _quiet_stderr():
            prof.stop()
    out_ptrs = {t.untyped_storage().data_ptr() for _, t in iter_tensors(root)}
    events: list[tuple[int, int, int]] = []
    results = prof.profiler.kineto_results if prof.profiler is not None else None
    if results is None:
        raise GradscopeError("the profiler recorded nothing; cannot measure the forward")
    stack = list(results.experimental_event_tree())
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.typed[0] == _EventType.Allocation:
            f = e.typed[1]
            if f.device.type == "cpu":
                events.append((e.start_time_ns, f.ptr, f.alloc_size))
    events.sort()
    live: dict[int, int] = {}
    for _, ptr, size in events:
        if size > 0:
            live[ptr] = size
        else:
            live.pop(ptr, None)
    del root
    return sum(n for p, n in live.items() if p not in out_ptrs), "profiler"


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 sent to /dev/null for the block (only the profiler's start and stop
    run inside it, never the user's code)."""
    import os
    import sys

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


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
