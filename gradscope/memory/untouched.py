"""Running the user's forward or step where it changes nothing: what every memory tool that
runs it (``step_memory``, ``measure_step``, ``max_batch``, ``activation_report``,
``plan_checkpoints``, ``CheckpointPlan.verify``, ``measure_forward``) runs under.

- ``isolated(fn)`` / ``@isolating``: ``fn`` in a forked child (``gradscope._torch.isolated``),
  where nothing it does reaches this process; where a fork cannot be used (CUDA initialised,
  ``torch.distributed`` initialised, no ``os.fork``, ``GRADSCOPE_FORK=0``) here.
- ``restored``: the in-process fallback, run in the child too: puts back what a run can reach
  (parameters copied back only where changed, grads, buffers reassigned, changed or
  registered, the modules' plain attributes reassigned or added, tensor attributes, the items
  of list, dict and set attributes, module-owned generators, optimizer state and
  hyper-parameters, torch's, Python's and NumPy's RNG, the inputs' values and ``.grad``) and
  keeps the optimizer's step hooks from firing. It cannot undo the version counters of
  tensors changed in place (an optimizer step), nor changes deep inside objects an attribute
  holds (a list's items are put back, not what happened inside them).
- ``captured_error``: a device mismatch raised by the user's forward or loss (a tensor
  captured from outside, on another device than the model) as one line.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import random
import sys
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar, cast

import torch

from .._torch.isolated import fork_refused, in_child, optimizer_hooks_paused
from .._torch.torchcompat import local_tensor
from ..errors import GradscopeError
from ..graph.nest import iter_tensors

# ====================================================================== isolating
#: seconds one isolated step may take before its child is ended (a day: a step is never slow
#: on purpose; the bound only keeps a hung child from hanging the caller for ever)
ISOLATED_TIMEOUT = 86_400.0


def isolated(fn: Callable[[], Any], what: str = "the step") -> Any:
    """``fn()`` where it cannot change this process: in a forked child when that is safe
    (``gradscope._torch.isolated``: parameters and their version counters, buffers reassigned
    or not, gradients, inputs' ``.grad``, optimizer state and hooks, every RNG and generator
    stay exactly as they were), else here, where ``restored`` puts back what it can reach.

    Raises:
        whatever ``fn`` raised; ``GradscopeError`` when the child gave no answer (``what``
        names what ``fn`` runs in that message).
    """
    if fork_refused() is not None:
        return fn()
    answer = in_child(fn, ISOLATED_TIMEOUT)
    if answer.failure is not None:
        raise GradscopeError(f"{what} could not be run apart from this process: "
                             f"{answer.failure}; GRADSCOPE_FORK=0 runs it here")
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
def restored(model: torch.nn.Module, optimizer: Any, inputs: Any = ()) -> Iterator[None]:
    """The block leaves what it can reach as before (the in-process fallback of ``isolated``):
    parameters (copied back only where a value changed), grads, buffers (a buffer the forward
    reassigned is put back as the same object), the modules' plain attributes (reassigned ones
    put back, added ones removed, tensors among them copied back where changed, the items of a
    list, dict or set among them put back), the modules' own ``torch.Generator``s, optimizer
    state and hyper-parameters, the RNG states, and the inputs' values (where changed in place)
    and ``.grad``; the optimizer's step hooks do not fire in the block. What it cannot undo:
    version counters moved where values did (the optimizer's step), and changes deeper inside
    the objects an attribute holds."""
    params = list(model.parameters())
    if optimizer is not None:
        known = {id(p) for p in params}
        for group in optimizer.param_groups:
            params.extend(p for p in group["params"] if id(p) not in known)
    # a DTensor's (FSDP2, tensor parallel) own shard: compared and put back without a collective
    values: list[tuple[torch.Tensor, torch.Tensor | None]] = [
        (local_tensor(p), local_tensor(p).detach().clone() if p.device.type != "meta" else None)
        for p in params]
    grads = [(p, p.grad) for p in params]
    buffers = [(local_tensor(b), local_tensor(b).detach().clone()) for b in model.buffers()
               if b.device.type != "meta"]
    owners = [(m, name, b) for m in model.modules() for name, b in m.named_buffers(recurse=False)]
    generators = [(g, g.get_state()) for m in model.modules() for g in vars(m).values()
                  if isinstance(g, torch.Generator)]
    attributes = [(m, _attributes(m)) for m in model.modules()]
    tensor_attrs = [(t, t.detach().clone()) for _, attrs in attributes for t in attrs.values()
                    if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter)
                    and t.device.type != "meta"]
    containers = [(c, _contents(c)) for _, attrs in attributes for c in attrs.values()
                  if type(c) in (list, dict, set)]
    input_grads = [(t, t.grad) for _, t in iter_tensors(inputs) if t.is_leaf]
    input_values = [(t, t.detach().clone()) for _, t in iter_tensors(inputs)
                    if t.device.type != "meta"]
    state = groups = None
    if optimizer is not None:
        state = optimizer.state
        groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
                  for g in optimizer.param_groups]
    devices = [d.index for d in {p.device for p in params} if d.type == "cuda"]
    with _random_kept(devices), torch.enable_grad(), optimizer_hooks_paused(optimizer):
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
                for shard, v in values:
                    if v is not None and _changed(shard, v):
                        shard.copy_(v)
                for b, v in buffers + tensor_attrs + input_values:
                    if _changed(b, v):
                        b.detach().copy_(v)
            for c, contents in containers:  # a list the forward appended to, a dict it filled
                if not _same_contents(_contents(c), contents):
                    _refill(c, contents)
            for m, attrs in attributes:
                now = vars(m)
                for name in [k for k in now if k not in attrs and k not in _MODULE_DICTS]:
                    del now[name]  # added by the run
                for name, value in attrs.items():
                    if now.get(name, _MISSING) is not value:
                        now[name] = value
            registered = {(id(m), name) for m, name, _ in owners}
            for m in model.modules():  # a buffer the run registered is gone again
                for name in [n for n, _ in m.named_buffers(recurse=False)
                             if (id(m), n) not in registered]:
                    delattr(m, name)
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


@contextlib.contextmanager
def _random_kept(devices: list[Any]) -> Iterator[None]:
    """The block leaves torch's (CPU and ``devices``' CUDA), Python's and NumPy's random
    states as they were."""
    py_state = random.getstate()
    np_random = sys.modules.get("numpy.random")
    np_state = np_random.get_state() if np_random is not None else None
    try:
        with torch.random.fork_rng(devices=devices):
            yield
    finally:
        random.setstate(py_state)
        if np_random is not None and np_state is not None:
            np_random.set_state(np_state)


#: a module's own dictionaries of parameters, buffers and children (put back by their own
#: means), and a marker for an attribute the run removed
_MODULE_DICTS = frozenset({"_parameters", "_buffers", "_modules"})
_MISSING = object()


def _attributes(module: torch.nn.Module) -> dict[str, Any]:
    """The module's plain attributes (its ``__dict__`` without the parameters, buffers and
    children), as they are now: what a forward's ``self.count = self.count + 1`` reassigns."""
    return {k: v for k, v in vars(module).items() if k not in _MODULE_DICTS}


def _contents(container: Any) -> list[Any]:
    """A shallow copy of a list's items, a dict's ``(key, value)`` pairs or a set's members."""
    return list(container.items()) if isinstance(container, dict) else list(container)


def _same_contents(a: list[Any], b: list[Any]) -> bool:
    """Whether two ``_contents`` hold the very same objects (compared by identity: values may
    be tensors, whose ``==`` is not a truth value)."""
    def same(x: Any, y: Any) -> bool:
        if isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y) == 2:
            return x[0] is y[0] and x[1] is y[1]  # a dict's pair
        return x is y

    return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))


def _refill(container: Any, contents: list[Any]) -> None:
    """``container`` (the same object) holding ``contents`` again."""
    if isinstance(container, dict):
        container.clear()
        container.update(contents)
    elif isinstance(container, set):
        container.clear()
        container.update(contents)
    else:
        container[:] = contents


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


#: what torch says when two tensors of one operation are on different devices (FakeTensor's
#: FakeTensorDeviceMismatchError, the meta device's check, the CUDA/CPU one)
_MISMATCH = ("Expected all tensors to be on the same device", "is not on the expected device",
             "found at least two devices")


def _device_mismatch(exc: BaseException) -> bool:
    """Whether ``exc`` (or an error it was raised from) is torch's device mismatch."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if type(cur).__name__ == "FakeTensorDeviceMismatchError" or (
                isinstance(cur, RuntimeError) and any(m in str(cur) for m in _MISMATCH)):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def captured_error(exc: BaseException, where: str, device: torch.device, fake: bool,
                   target_given: bool = True) -> GradscopeError | None:
    """The one line for a device mismatch raised in ``where`` ("the loss function", "the
    forward") while the model runs on ``device`` (``fake``: measured on fake tensors standing
    for a meta model), else None (not a device mismatch). ``target_given``: whether the tool
    takes the target with the batch (``step_memory``'s ``target=``); where it does not
    (``activation_report``), the fix is a tensor made on the model's device."""
    if not _device_mismatch(exc):
        return None
    runs = ("the model is on the meta device and is measured on stand-in (fake) tensors"
            if fake else f"the model runs on {device.type}")
    fix = ("pass the target with the batch instead (target= of step_memory and measure_step "
           "with loss_fn(output, target), build_target of max_batch; a model file's "
           "example_target and build_target(batch) are passed so)" if target_given else
           f"make that tensor on the {device.type} device, like the model (a model file: "
           f"example_target = ....to(\"{device.type}\"))")
    return GradscopeError(
        f"{where} uses a tensor on another device than the model ({runs}): a tensor captured "
        f"from outside, such as a target the loss closes over, does not follow the model "
        f"there; {fix}"
    )

