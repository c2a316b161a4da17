"""Module scopes: which module's forward created each autograd node.

That can only be seen while the forward runs, so ``scopes(model)`` installs global module
forward hooks for the duration of a ``with`` block. When a module's forward returns, the hook
walks back from its outputs over ``next_functions`` and stamps every node created during that
forward (its autograd sequence number is at least the one current when the forward started)
that no inner module stamped first. Inner forwards end first, so each node gets the
*innermost* module, interior nodes included (the ``TBackward0`` inside ``F.linear``).

Path convention (what ``Node.module`` holds):

- the module's dotted name as in ``model.named_modules()`` (``encoder.layers.3.self_attn``);
- the root module's own ops get ``""``; ops outside every module of ``model`` get no stamp
  (``Node.module`` is None);
- a module called more than once within one call of its parent (shared weights, loops) gets
  ``#k`` on its last component for its k-th repeat call: ``blocks.0``, ``blocks.0#1``,
  ``blocks.0#2`` for the first three calls, and its children then live under that call
  (``blocks.0#2.attn``). Calls are counted per ``scopes`` block. Stripping every ``#k`` gives
  back a ``named_modules()`` name;
- an ``AccumulateGrad`` node (a parameter's gradient sink) gets the call path of the first
  call of the module that owns the parameter; other leaves get no stamp.

The hooks are global (``torch.nn.modules.module.register_module_forward_*``), so the model's
own hook dicts are never touched, and they are removed when the block ends, even when the
forward raises. Single-threaded forwards only: sequence numbers are per thread.

Under ``torch.compile`` the hooks stay out of Dynamo's way (``dynamo.ModuleHooks``: no graph
break, no recompile): a compiled module's call is one scope, its wrapper (``OptimizedModule``)
and the module it wraps being one frame with the module's name (``_orig_mod`` never appears in
a path); what happens inside the compiled graph is read from the graph's own FX metadata when
``gs.trace`` expands the region.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .._torch import dynamo, torchcompat
from .._torch.handles import HookHandle
from .._torch.stamps import (
    MODULE_CLASSES_KEY,
    MODULE_KEY,
    NO_SEQUENCE_NR,
    PASS_THROUGH,
    outside_gradscope,
    walk_nodes,
)
from ..errors import ScopesError
from . import compiled
from .nest import iter_tensors
from .paths import levels, strip_calls

_ACCUMULATE = "AccumulateGrad"


@dataclass
class _Frame:
    """One running forward: the module's call path, and the first sequence number it owns."""

    module: torch.nn.Module | None
    name: str | None  # plain named_modules() name; None for the frame outside the model
    path: str | None  # call path with #k suffixes; None outside the model
    start: int
    classes: str = ""  # class names along the path, one per depth level
    calls: dict[str, int] = field(default_factory=dict)  # child name -> calls so far


def _on_stack(frame: Any) -> bool:
    """Whether the Python frame ``frame`` is still running (on the current thread's stack)."""
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        if f is frame:
            return True
        f = f.f_back
    return False


def _hook_caller() -> Any:
    """The frame that runs the global hooks (``Module._call_impl``): the first one outside
    gradscope (the hook may be reached through ``dynamo.ModuleHooks``)."""
    return outside_gradscope(sys._getframe(2))


_is_top_mode = torchcompat.mode_on_top


class _HookMode(TorchFunctionMode):
    """While a module's own forward hooks run, stamps the nodes each torch call creates with
    the module's path (see ``ScopeRecorder.watch_hooks``)."""

    def __init__(self, rec: ScopeRecorder, frame: _Frame, caller: Any) -> None:
        super().__init__()
        self.rec, self.frame, self.caller = rec, frame, caller
        self.start = torchcompat.next_sequence_nr()
        self.depth = len(rec.stack)  # a submodule the hook calls stamps its own nodes
        self.active = True

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if dynamo.compiling():  # Dynamo traces this: call through
            return func(*args, **(kwargs or {}))
        out = func(*args, **(kwargs or {}))
        if self.active:
            if len(self.rec.stack) > self.depth:
                pass  # inside a submodule the hook called: its own post hook stamps these
            elif _on_stack(self.caller):
                self.rec.stamp_new(self.frame, out, self.start)
            else:  # the module's call returned: these ops are the caller's
                self.active = False
                self.caller = None  # its frame holds the module's output: let it go
        return out


# an op a module's forward hook makes is the hook's line (record_forward), not gradscope's
PASS_THROUGH.add(_HookMode.__torch_function__.__code__)


class ScopeRecorder:
    """What one ``scopes`` block records: the model's module names and classes, the call
    stack of running forwards, and the stamps it put on nodes. ``saved_memory`` drives one
    with its own module hooks (``pre``/``post``) to attribute saved tensors to modules."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.names: dict[int, str] = {}
        self.classes: dict[str, str] = {}
        for name, mod in model.named_modules(remove_duplicate=True):
            name = dynamo.plain_name(name)  # a torch.compile wrapper is its module
            self.names[id(mod)] = name
            self.classes[name] = type(mod).__name__
        self.owner: dict[int, str] = {}  # id(parameter) -> owning module's name
        for name, mod in model.named_modules():
            for p in mod.parameters(recurse=False):
                self.owner.setdefault(id(p), dynamo.plain_name(name))
        self.first_call: dict[str, str] = {}  # module name -> call path of its first call
        self.stack = [_Frame(None, None, None, 0)]
        self.stamped_acc: set[Any] = set()  # AccumulateGrad nodes stamped in this block
        self.hook_modes: list[_HookMode] = []  # see watch_hooks

    # -------------------------------------------------------------- hooks
    def name_of(self, module: torch.nn.Module) -> str | None:
        """The module's name in the model; a ``torch.compile`` wrapper has its module's."""
        name = self.names.get(id(module))
        if name is None:
            inner = dynamo.unwrap(module)
            if inner is not None:
                name = self.names.get(id(inner))
        return name

    def in_wrapper(self, module: torch.nn.Module) -> bool:
        """``module`` is what the running ``torch.compile`` wrapper wraps: one frame for both."""
        top = self.stack[-1].module
        return top is not None and top is not module and dynamo.unwrap(top) is module

    def pre(self, module: torch.nn.Module, args: Any) -> None:
        if self.hook_modes:
            self.settle()
        if self.in_wrapper(module):
            return
        name = self.name_of(module)
        if name is None:
            return  # a module outside the model (a loss, a helper): its ops go to the caller
        parent = self._ancestor(name)
        k = parent.calls.get(name, 0)
        parent.calls[name] = k + 1
        if not parent.name:  # outside the model, or directly in the root module
            rel = name
        else:
            rel = name[len(parent.name) + 1 :]
        base = f"{parent.path}.{rel}" if parent.path else rel
        path = f"{base}#{k}" if k else base
        self.first_call.setdefault(name, path)
        seq = torchcompat.next_sequence_nr()
        self.stack.append(_Frame(module, name, path, seq, self.class_chain(path)))

    def post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self.hook_modes:
            self.settle()
        if self.in_wrapper(module) or self.name_of(module) is None:
            return
        # Pop up to this module's frame: frames above it belong to forwards that raised.
        while len(self.stack) > 1:
            frame = self.stack.pop()
            if frame.module is module:
                break
        else:
            return
        if output is not None:
            self.stamp(frame, output)
        if module._forward_hooks:  # read only: they run after this global hook returns
            self.watch_hooks(frame, _hook_caller())

    # -------------------------------------------------------------- the module's own hooks
    def watch_hooks(self, frame: _Frame, caller: Any) -> None:
        """The module's own forward hooks run after gradscope's global one: nodes they create
        belong to the module too. Until the module's call returns (``caller``, the frame of
        ``Module._call_impl`` that runs the hooks, leaves the stack), a torch-function mode
        stamps each new node with the module's path."""
        mode = _HookMode(self, frame, caller)
        dynamo.eager_only(_HookMode.__torch_function__)
        mode.__enter__()
        self.hook_modes.append(mode)

    def settle(self) -> None:
        """Take off the hook modes of modules whose call has returned (newest first, and only
        while gradscope's mode is the innermost one, so a user's mode is never popped)."""
        while self.hook_modes:
            mode = self.hook_modes[-1]
            if mode.active and _on_stack(mode.caller):
                return
            if not dynamo.mode_on_top(mode):
                return
            self.hook_modes.pop()
            mode.active, mode.caller = False, None
            mode.__exit__(None, None, None)

    def close(self) -> None:
        """End of the block: every hook mode comes off."""
        for mode in self.hook_modes:
            mode.active = False
        self.settle()

    def class_chain(self, path: str) -> str:
        """The class names from the model down to ``path``: the model's own first, then one
        per depth level (``levels``), joined by "/"."""
        lv = levels(path)
        inner = (self.classes.get(strip_calls(".".join(lv[: d + 1])), "") for d in range(len(lv)))
        return "/".join([self.classes.get("", ""), *inner])

    def _ancestor(self, name: str) -> _Frame:
        """The innermost running frame whose module contains ``name`` (else the outside)."""
        for frame in reversed(self.stack):
            if frame.name is None:
                return frame
            if frame.name == "" or name.startswith(frame.name + "."):
                return frame
        return self.stack[0]

    # -------------------------------------------------------------- stamping
    def stamp(self, frame: _Frame, output: Any) -> None:
        key, cls_key = MODULE_KEY, MODULE_CLASSES_KEY
        chain = frame.classes
        start = frame.start
        mine = False  # whether the walk goes on below the node just seen

        def enter(fn: Any) -> bool:
            return mine

        # Any: torch's stubs type Node.metadata as a method; at run time it is a dict property.
        roots: list[Any] = [t.grad_fn for _, t in iter_tensors(output) if t.grad_fn is not None]
        for fn in walk_nodes(roots, enter=enter):
            seq = fn._sequence_nr()
            mine = NO_SEQUENCE_NR > seq >= start  # created during this forward: ours
            if seq == NO_SEQUENCE_NR:
                if type(fn).__name__ == _ACCUMULATE:
                    self.stamp_accumulate(fn)
                continue
            if not mine:
                continue
            meta = fn.metadata
            if key not in meta:
                meta[key] = frame.path
                meta[cls_key] = chain
                if type(fn).__name__ == compiled.REGION_NODE:
                    compiled.remember(fn)  # read its graph while its FX metadata is intact

    def stamp_new(self, frame: _Frame, output: Any, start: int) -> None:
        """Stamp the nodes created since sequence number ``start`` below ``output`` (those no
        inner module stamped first) with ``frame``'s path."""
        mine = False

        def enter(fn: Any) -> bool:
            return mine

        roots = [t.grad_fn for _, t in iter_tensors(output) if t.grad_fn is not None]
        for fn in walk_nodes(roots, enter=enter):
            mine = NO_SEQUENCE_NR > fn._sequence_nr() >= start
            if mine and MODULE_KEY not in fn.metadata:
                fn.metadata[MODULE_KEY] = frame.path
                fn.metadata[MODULE_CLASSES_KEY] = frame.classes

    def stamp_accumulate(self, fn: Any) -> None:
        if fn in self.stamped_acc:
            return
        owner = self.owner.get(id(fn.variable))
        if owner is None:
            return
        self.stamped_acc.add(fn)
        # A node kept alive from an earlier block may carry a stale stamp: overwrite it.
        path = self.first_call.get(owner, owner)
        fn.metadata[MODULE_KEY] = path
        fn.metadata[MODULE_CLASSES_KEY] = self.class_chain(path)


_ACTIVE: set[int] = set()  # ids of the models with an open block (one block per model)


class Scopes:
    """An open-able ``scopes`` block: ``with gs.scopes(model) as rec:`` installs the global
    module hooks, yields the ``ScopeRecorder`` (which owns what the block records), and removes
    them when the block ends, even when the forward raises."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.recorder: ScopeRecorder | None = None
        self.handle = HookHandle()

    def __enter__(self) -> ScopeRecorder:
        model = self.model
        if id(model) in _ACTIVE:
            raise ScopesError(
                "a gs.scopes block on this model is already open; nest the forward inside one "
                "block"
            )
        rec = self.recorder = ScopeRecorder(model)
        _ACTIVE.add(id(model))
        handle = self.handle
        handle.add(lambda: _ACTIVE.discard(id(model)))
        handle.add(rec.stamped_acc.clear)
        handle.add(rec.close)
        try:
            handle.add(dynamo.ModuleHooks(rec.pre, rec.post).install())
        except BaseException:
            handle.remove()
            raise
        return rec

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()

    def remove(self) -> None:
        """Remove the hooks now (safe twice); the block's ``__exit__`` does it too."""
        self.handle.remove()


def scopes(model: torch.nn.Module) -> Scopes:
    """Record which module of ``model`` created each autograd node during the block.

    Each node created inside a module's forward is stamped with the innermost module's path
    (see the module docstring for the ``#k`` convention of repeated calls); ``gs.trace``
    reads the stamps into ``Node.module``. The hooks are global and removed on exit, even
    when the forward raises: the model's own hook dicts are never touched.

    Args:
        model: the ``nn.Module`` whose submodules name the scopes.

    Raises:
        ScopesError: ``model`` is not an ``nn.Module``, or a ``scopes`` block on the same
            model is already open.

    Example:
        >>> import torch, gradscope as gs
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
        >>> with gs.scopes(net):
        ...     out = net(torch.randn(2, 3))
        >>> sorted({n.module for n in gs.trace(out, model=net).nodes if n.kind == "op"})
        ['0', '1']
    """
    if not isinstance(model, torch.nn.Module):
        raise ScopesError(
            f"scopes() needs the nn.Module whose forward runs, got {type(model).__name__}; "
            "use: with gs.scopes(model): out = model(x)"
        )
    return Scopes(model)
