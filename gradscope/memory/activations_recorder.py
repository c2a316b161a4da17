"""Recording one forward for ``activation_report``: every saved tensor (its storage, the
module stack that saved it, whether it is still held at the end), every module call and its
inputs, and the FLOPs per module (``torch.utils.flop_counter``), read into the plain
``ActivationReport`` of ``gradscope.memory.activations_records`` (``_report``).

A model or inputs on the ``meta`` device run under a ``FakeTensorMode`` (``_fake_mode``):
nothing is allocated, and code that reads values sees fake tensors. ``_preserved`` runs a
forward without leaving a trace (RNG states and buffers restored); the measurement of
``memplan_measure`` uses it too.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .._torch import dynamo, torchcompat
from ..errors import GradscopeError
from ..graph.nest import device_of, iter_tensors
from .activations_records import (
    ACTIVATION,
    INPUT,
    OUTPUT,
    PARAM,
    ActivationReport,
    ModuleInfo,
    ModuleRow,
    Storage,
)
from .saved import _HooksGuard, _leaf_base, _Listener
from .untouched import captured_error

LossFn = Callable[[Any], Any] | None


def _key(t: torch.Tensor) -> tuple[Any, int]:
    """(identity, bytes) of ``t``'s storage."""
    try:
        return (t.device.type, torchcompat.storage_key(t)), t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError, AttributeError, TypeError):
        return ("tensor", id(t)), t.numel() * t.element_size()


class _Recorder(_Listener):
    """One forward: every save (storage, module stack, alive?) and every module call."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.names: dict[int, str] = {}
        self.cls: dict[str, str] = {}
        self.parent: dict[str, str | None] = {}
        self.in_container: set[str] = set()
        self.builtin: set[str] = set()
        for name, mod in dynamo.named_modules(model):  # no compile wrapper level
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
        # per open call (and the root level): the last child call that ended in it, as
        # (path, weak output, output's graph node); transient, dropped at the call's end
        self.frames: list[tuple[str | None, Any, Any] | None] = [None]
        self.links: list[tuple[str, str, int, int]] = []  # (a, b, tag of a's node, b's node)
        self.chain: dict[str, str] = {}  # the links the graph confirmed (``_check_links``)
        # per open call: its inputs' versions
        self.versions: list[list[tuple[torch.Tensor, int | None]]] = []
        self.mutating: set[str | None] = set()  # modules that changed an input in place
        # per module: the other objects it was called with (a Hugging Face cache); a
        # checkpoint keeps them, and so every tensor they hold at the end of the forward
        self.objects: dict[str, list[Any]] = {}

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
        self.frames.append(None)
        self.versions.append([(t, torchcompat.tensor_version(t)) for _, t in iter_tensors(args)])
        if path is not None:
            if path not in self.calls:
                self.order.append(path)
            self.calls[path] = self.calls.get(path, 0) + 1

    def post(self, module: torch.nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if not self.stack or self.stack[-1][0] != id(module):
            return
        _, path = self.stack.pop()
        self.frames.pop()
        if any(torchcompat.tensor_version(t) != v for t, v in self.versions.pop()):
            self.mutating.add(path)  # torch's checkpoint cannot recompute from a changed input
        self._chain(path, args, kwargs, output)
        if path is None:
            return
        kept = self.inputs.setdefault(path, {})
        for _, t in iter_tensors((args, kwargs), "input"):
            self._keep(kept, t)
        loose = [v for v in (*args, *kwargs.values()) if _loose(v)]
        if loose:
            self.objects.setdefault(path, []).extend(loose)

    def _keep(self, kept: dict[Any, tuple[int, str]], t: torch.Tensor) -> None:
        key, nbytes = _key(t)
        if key not in kept:
            kept[key] = (nbytes, str(t.dtype).replace("torch.", ""))
            self.held.append(t.detach())

    def settle_objects(self) -> None:
        """At the end of the forward: the tensors the modules' other arguments hold now
        (a key/value cache filled by later layers too) join the modules' inputs."""
        for path, objs in self.objects.items():
            kept = self.inputs.setdefault(path, {})
            for t in _tensors_held_by(objs):
                self._keep(kept, t)
        self.objects = {}

    def _chain(self, path: str | None, args: Any, kwargs: Any, output: Any) -> None:
        """Note a candidate chain link: the previous call at this level handed its only output
        to this call as its only argument (the graph check is ``_check_links``)."""
        prev = self.frames[-1]
        node = output.grad_fn if isinstance(output, torch.Tensor) else None
        self.frames[-1] = (path, weakref.ref(output), node) if (
            node is not None and path is not None) else None
        if (prev is None or node is None or path is None or kwargs or len(args) != 1
                or args[0] is not prev[1]()):
            return
        tag_a, tag_b = _tag(prev[2]), _tag(node)
        if tag_a is not None and tag_b is not None:
            assert prev[0] is not None
            self.links.append((prev[0], path, tag_a, tag_b))

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        pre = torch.nn.modules.module.register_module_forward_pre_hook(self.pre)
        post = torch.nn.modules.module.register_module_forward_hook(self.post, with_kwargs=True)
        guard = _HooksGuard(self)
        try:
            guard.push()
            with dynamo.wrapper_warning_quiet():
                yield
        finally:
            guard.pop()
            post.remove()
            pre.remove()
            torchcompat.forget_kwargs_flag(post)  # torch's handle leaves it behind


_PLAIN = (str, bytes, int, float, complex, bool, type(None), torch.dtype, torch.device)


def _loose(v: Any) -> bool:
    """An argument that is neither a tensor, a plain nest, a module nor a plain value."""
    if isinstance(v, (torch.Tensor, torch.nn.Module, *_PLAIN)):
        return False
    return not isinstance(v, (tuple, list, dict))


def _tensors_held_by(objs: list[Any], depth: int = 8, most: int = 20000) -> list[torch.Tensor]:
    """The tensors reachable from ``objs`` through their attributes and containers
    (``gc.get_referents``, breadth first, at most ``depth`` levels and ``most`` objects;
    modules, classes, functions and plain values not entered)."""
    import types

    skip = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
            types.MethodType, types.CodeType, types.FrameType, torch.nn.Module, *_PLAIN)
    found: list[torch.Tensor] = []
    seen: set[int] = set()
    level = list(objs)
    for _ in range(depth):
        nxt: list[Any] = []
        for obj in level:
            if id(obj) in seen or len(seen) >= most:
                continue
            seen.add(id(obj))
            if isinstance(obj, torch.Tensor):
                found.append(obj)
            elif not isinstance(obj, skip):
                nxt.extend(gc.get_referents(obj))
        level = nxt
        if not level:
            break
    return found


_TAG = "gradscope.memplan.chain"
_tags = itertools.count(1)


def _tag(node: Any) -> int | None:
    """A number on ``node`` (in its ``metadata``), to find it again in the graph without
    keeping it alive; None when this torch's nodes have no ``metadata``."""
    meta = torchcompat.node_metadata(node)
    if meta is None:
        return None
    if _TAG not in meta:
        meta[_TAG] = next(_tags)
    return int(meta[_TAG])


def _check_links(rec: _Recorder, roots: list[Any]) -> dict[str, str]:
    """The chain links the graph confirms: every use of ``a``'s output node in the graph is
    inside ``b`` (reachable from ``b``'s output without passing ``a``'s), or ``b`` handed the
    very tensor back; ``{a: b}``."""
    if not rec.links:
        return {}
    wanted = {t for _, _, t, _ in rec.links} | {t for _, _, _, t in rec.links}
    found: dict[int, Any] = {}
    users: dict[int, list[Any]] = {}  # tag of a node -> the nodes that use it
    seen: set[int] = set()
    stack = [n for n in roots if n is not None]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        tag = _known_tag(node, wanted)
        if tag is not None:
            found[tag] = node
        for child, _ in node.next_functions:
            if child is None:
                continue
            child_tag = _known_tag(child, wanted)
            if child_tag is not None:
                users.setdefault(child_tag, []).append(node)
            stack.append(child)
    out: dict[str, str] = {}
    for a, b, tag_a, tag_b in rec.links:
        node_a, node_b = found.get(tag_a), found.get(tag_b)
        if node_a is None or node_b is None:
            continue
        if node_a is node_b or _all_inside(users.get(tag_a, []), node_b, node_a):
            out[a] = b
    return out


def _known_tag(node: Any, wanted: set[int]) -> int | None:
    meta = torchcompat.node_metadata(node)
    tag = meta.get(_TAG) if meta else None
    return tag if tag in wanted else None


def _all_inside(users: list[Any], start: Any, stop: Any) -> bool:
    """Every node of ``users`` is reachable from ``start`` without passing ``stop``."""
    left = {id(u) for u in users}
    seen: set[int] = {id(stop)}
    stack = [start]
    while stack and left:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        left.discard(id(node))
        stack.extend(c for c, _ in node.next_functions if c is not None)
    return not left


def _flops_by_module(counts: dict[str, dict[Any, int]], model: torch.nn.Module) -> dict[str, int]:
    """``FlopCounterMode.get_flop_counts()`` keyed by ``dynamo.named_modules()`` names (a
    compile wrapper and the module it wraps count the same FLOPs: one entry)."""
    root = type(model).__name__
    out: dict[str, int] = {}
    for name, per_op in counts.items():
        if name == root:
            path = ""
        elif name.startswith(root + "."):
            path = dynamo.plain_name(name[len(root) + 1:])
        else:
            continue
        out.setdefault(path, sum(per_op.values()))
    return out


def _forward(model: torch.nn.Module, inputs: tuple[Any, ...], loss_fn: LossFn) -> Any:
    out = model(*inputs)
    return out if loss_fn is None else loss_fn(out)


@contextlib.contextmanager
def new_objects_collected() -> Iterator[None]:
    """``gc.collect()`` in the block scans only the objects made in it: those alive before
    are frozen (``gc.freeze``) for the block and put back afterwards (``gc.unfreeze``: into
    the oldest generation, where the full collection this replaces moved them too). With torch
    and transformers imported a full collection walks every object of the process (0.1-0.6 s
    each); the garbage a forward leaves is all new, and old garbage, frozen, cannot be freed
    inside a measurement. Where something else froze objects already
    (``gc.get_freeze_count()``), nothing is frozen: the collections are full ones."""
    if gc.get_freeze_count():
        gc.collect()
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def _preserved(model: torch.nn.Module) -> Iterator[None]:
    """Run forwards without leaving a trace: RNG states and buffers restored afterwards (a
    buffer copied back only where its values changed: an unchanged one keeps its version
    counter)."""
    buffers = [(b, b.detach().clone()) for b in model.buffers() if b.device.type != "meta"]
    devices = [d for d in {b.device for b in model.parameters()} if d.type == "cuda"]
    with torch.random.fork_rng(devices=devices), torch.enable_grad():
        try:
            yield
        finally:
            with torch.no_grad():
                for b, saved in buffers:
                    if not _equal(b, saved):
                        b.copy_(saved)


def _equal(now: torch.Tensor, before: torch.Tensor) -> bool:
    """Whether ``now`` holds ``before``'s values (False where that cannot be told)."""
    try:
        return bool(torch.equal(now, before))
    except Exception:  # noqa: BLE001 - a tensor subclass that cannot compare values
        return False


@contextlib.contextmanager
def _mismatch_said(where: str, device: torch.device, fake: bool) -> Iterator[None]:
    """A device mismatch raised in the block (a tensor captured from outside, on another
    device than the model) becomes one line (``untouched.captured_error``)."""
    try:
        yield
    except Exception as exc:
        said = captured_error(exc, where, device, fake, target_given=False)
        if said is None:
            raise
        raise said from None


def _record(model: torch.nn.Module, inputs: tuple[Any, ...], loss_fn: LossFn,
            autocast: torch.dtype | None = None, fake: Any = None,
            state: dict[str, torch.Tensor] | None = None,
            ) -> tuple[_Recorder, dict[str, int], set[Any]]:
    from torch.utils.flop_counter import FlopCounterMode

    rec = _Recorder(model)
    device = device_of(model, inputs)
    cast = (torch.autocast(device.type, dtype=autocast) if autocast is not None
            else contextlib.nullcontext())
    counter = FlopCounterMode(display=False)
    run: Callable[..., Any] = model
    if fake is not None and state is not None:
        # the forward sees the very fake tensors whose storages _report classified
        run = functools.partial(torch.func.functional_call, model, state, tie_weights=True)
    with new_objects_collected():
        with (fake if fake is not None else contextlib.nullcontext(), rec.installed(), counter,
              cast):
            with _mismatch_said("the forward", device, fake is not None):
                out = run(*inputs) if fake is None else run(inputs)
            with _mismatch_said("the loss function", device, fake is not None):
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
    rec.frames, rec.versions = [None], []
    rec.settle_objects()
    # the liveness of each save is read while the outputs (and their graph) are held
    alive = [s for s in rec.saves if s[3]() is not None]
    rec.saves = alive
    rec.chain = _check_links(rec, [t.grad_fn for _, t in iter_tensors(root)])
    del root
    return rec, flops, out_keys


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
            path in rec.in_container, path in rec.builtin, _next_in_chain(rec, path),
            path in rec.mutating,
        )
    total = sum(sizes[k] for k in ids if kind(k) == ACTIVATION and saves.get(k))
    inclusive: dict[str, int] = {}
    for k, stack in first.items():
        if kind(k) != ACTIVATION:
            continue
        for path in stack:
            inclusive[path] = inclusive.get(path, 0) + sizes[k]
    device = device_of(model, inputs)
    rep = ActivationReport(total=total, rows=[], storages=storages, modules=modules,
                           overhead=_rng_bytes(), device=str(device),
                           notes=torchcompat.notes("tensor_version", "node_metadata"))
    rep.rows = [ModuleRow(p, inclusive.get(p, 0), rep.checkpoint_saves(p), modules[p].flops,
                          modules[p].calls) for p in rec.order]
    del rec
    return rep


def _next_in_chain(rec: _Recorder, path: str) -> str | None:
    nxt = rec.chain.get(path)
    if nxt is None or rec.calls.get(path) != 1 or rec.calls.get(nxt) != 1:
        return None
    if rec.parent.get(path) != rec.parent.get(nxt):
        return None
    return nxt


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
