"""Applying a checkpoint plan: each planned module's forward, or each planned *segment* of
sibling modules, runs under a non-reentrant ``torch.utils.checkpoint``; the handle's
``.remove()`` puts the model back exactly.

- A module: an instance attribute ``forward`` that checkpoints the module's own forward
  (parameters, buffers, hooks and the state dict untouched). A pickle or copy of the module
  stores its plain forward in its place (``_Checkpointed.__reduce__``): loading needs no
  gradscope.
- A segment ``conv1..bn1..relu`` (modules the forward calls one after the other, each handing
  its only output to the next; ``ActivationReport.segments``): the modules' classes are
  swapped for subclasses of the same name. When the parent calls the first module, the whole
  run goes through one checkpoint, each module called as usual inside it (its hooks run
  there, once); the parent's calls of the next modules with the very tensor the run handed
  back return it unchanged. A call that breaks the chain (another argument while the parent's
  forward that started the run is still running) raises a ``GradscopeError`` rather than
  compute something else; a call from anywhere else runs the module as usual.
- Buffers stay exact: the backward's recomputation runs the forward again, which would update
  BatchNorm's running statistics (and ``num_batches_tracked``) a second time; every buffer
  of the checkpointed modules is put back as it was before the recomputation.
- Plans stack: a module that two applied plans checkpoint is wrapped once, and stays wrapped
  until the last of them is removed, in whatever order (``_STATE`` owns what was installed on
  each module).
"""

from __future__ import annotations

import contextlib
import copyreg
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from .._torch import dynamo
from ..errors import GradscopeError
from .activations_records import SEGMENT, BudgetError, segment_paths


@contextlib.contextmanager
def _buffers_kept(modules: list[torch.nn.Module]) -> Iterator[None]:
    """The block (a checkpoint's recomputation) leaves every buffer of ``modules`` as it
    found it: values changed in place are copied back, buffers reassigned are put back."""
    saved: list[tuple[dict[str, Any], str, torch.Tensor, torch.Tensor | None]] = []
    seen: set[int] = set()
    for top in modules:
        for mod in top.modules():
            if id(mod) in seen:
                continue
            seen.add(id(mod))
            for name, buf in mod._buffers.items():
                if buf is not None:
                    copy = buf.detach().clone() if buf.device.type != "meta" else None
                    saved.append((mod._buffers, name, buf, copy))
    try:
        yield
    finally:
        with torch.no_grad():
            for table, name, kept, copy in saved:
                if table.get(name) is not kept:
                    table[name] = kept  # reassigned (``self.count = self.count + 1``)
                if copy is not None:  # (the kernels' own updates bump no version)
                    kept.copy_(copy)


def _context(modules: list[torch.nn.Module]) -> Callable[[], Any]:
    refs = [weakref.ref(m) for m in modules]

    def context_fn() -> tuple[Any, Any]:
        live = [m for r in refs if (m := r()) is not None]
        return contextlib.nullcontext(), _buffers_kept(live)

    return context_fn


class _Checkpointed:
    """A module's forward, run under a non-reentrant ``torch.utils.checkpoint`` whose
    recomputation keeps the module's buffers."""

    def __init__(self, forward: Callable[..., Any], module: torch.nn.Module, had: bool,
                 previous: Any) -> None:
        self.forward = forward
        self.context_fn = _context([module])
        self.had, self.previous = had, previous  # the module's own ``forward`` attribute

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(self.forward, *args, use_reentrant=False,
                          context_fn=self.context_fn, **kwargs)

    def __reduce__(self) -> Any:
        # a pickle (torch.save) or copy of the module holds its plain forward instead
        reduced = self.forward.__reduce__()
        if not isinstance(reduced, tuple):
            raise TypeError(f"cannot pickle the forward {self.forward!r}")
        return reduced


class _Segment:
    """Sibling modules run as one checkpoint (see the module's docstring)."""

    def __init__(self, name: str, modules: list[torch.nn.Module],
                 parent: torch.nn.Module) -> None:
        self.name = name
        self.modules = modules
        self.classes = [type(m) for m in modules]
        self.parent = weakref.ref(parent)
        self.context_fn = _context(modules)
        # inside: depth in run(); pending: (tensor, next index, the parent's frame)
        self.local = threading.local()

    def _parent_frame(self) -> int | None:
        """The id of the innermost frame of the parent module's call on this thread's stack
        (None when the parent is not running)."""
        parent = self.parent()
        if parent is None:
            return None
        codes = {torch.nn.Module._call_impl.__code__}
        fwd = getattr(type(parent).forward, "__code__", None)
        if fwd is not None:
            codes.add(fwd)
        frame: Any = sys._getframe(2)
        while frame is not None:
            if frame.f_code in codes and frame.f_locals.get("self") is parent:
                return id(frame)
            frame = frame.f_back
        return None

    def run(self, x: Any) -> Any:
        self.local.inside = getattr(self.local, "inside", 0) + 1
        try:
            for mod, cls in zip(self.modules, self.classes, strict=True):
                x = cls.__call__(mod, x)
            return x
        finally:
            self.local.inside -= 1

    def call(self, k: int, mod: torch.nn.Module, args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
        cls = self.classes[k]
        if getattr(self.local, "inside", 0):
            return cls.__call__(mod, *args, **kwargs)
        pending = getattr(self.local, "pending", None)
        single = len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor)
        if k == 0:
            self.local.pending = None
            if not single:
                return cls.__call__(mod, *args, **kwargs)
            out = checkpoint(self.run, args[0], use_reentrant=False,
                             context_fn=self.context_fn)
            if len(self.modules) > 1 and isinstance(out, torch.Tensor):
                self.local.pending = (out, 1, self._parent_frame())
            return out
        if pending is None:  # called on its own, not as part of the run
            return cls.__call__(mod, *args, **kwargs)
        tensor, expected, frame = pending
        if expected != k or not single or args[0] is not tensor:
            self.local.pending = None
            if frame is None or self._parent_frame() != frame:
                # the forward that started the run is over (it ended or raised half way):
                # this is a call of the module on its own
                return cls.__call__(mod, *args, **kwargs)
            raise GradscopeError(
                f"checkpoint segment {self.name!r}: the forward no longer hands each module's "
                f"output straight to the next (module {k + 1} of {len(self.modules)} got "
                "something else); remove the plan (handle.remove()) and plan again"
            )
        self.local.pending = (tensor, k + 1, frame) if k + 1 < len(self.modules) else None
        return tensor


_RECONSTRUCT: Any = vars(copyreg)["_reconstructor"]  # what pickle protocols 0-1 use


def _segment_call(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The ``__call__`` of a segment member's class (``_segment_class``)."""
    cls: Any = type(self)
    return cls._gradscope_run.call(cls._gradscope_k, self, args, kwargs)


def _segment_class(cls: type, segment: _Segment, k: int) -> type:
    plain: Any = cls

    def __reduce_ex__(self: torch.nn.Module, protocol: Any) -> Any:
        # a copy (copy.deepcopy, pickle) is of the plain class: it has no segment to run
        reduced = plain.__reduce_ex__(self, protocol)
        if isinstance(reduced, tuple) and len(reduced) > 1 and reduced[1][:1] == (type(self),):
            # copyreg's own reconstructor (no import of gradscope needed to load it)
            reduced = (_RECONSTRUCT, (cls, object, None), *reduced[2:])
        return reduced

    return type(cls.__name__, (cls,), {
        "__call__": _segment_call, "__reduce_ex__": __reduce_ex__, "__module__": cls.__module__,
        "__qualname__": cls.__qualname__, "_gradscope_segment": segment.name,
        "_gradscope_run": segment, "_gradscope_k": k,
    })


class CheckpointHandle:
    """What ``CheckpointPlan.apply`` installed; ``.remove()`` restores the model exactly
    (idempotent; also a context manager)."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []
        self.removed = False

    def remove(self) -> None:
        undo, self._undo = self._undo, []
        self.removed = True
        for step in reversed(undo):
            step()

    def __enter__(self) -> CheckpointHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def _module(model: torch.nn.Module, path: str) -> torch.nn.Module:
    """The module a plan's path names: plans name modules without a compile wrapper's
    ``_orig_mod`` level (``dynamo.named_modules``), so a compiled model's is looked up in the
    module it wraps; a path that still has the level is found too."""
    inner = dynamo.unwrap(model)
    if inner is not None and path.split(".")[0] != "_orig_mod":
        model = inner
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise BudgetError(
            f"the plan names module {path!r}, which this model does not have"
        ) from None


class _Installed:
    """What the applied plans installed on one module, and how many of them use it. Weak
    references only: the module itself holds what was installed (its ``forward`` attribute,
    its class), so the table never keeps a model alive."""

    def __init__(self) -> None:
        self.forward: weakref.ref[_Checkpointed] | None = None
        self.forward_users = 0
        self.segment: tuple[weakref.ref[_Segment], weakref.ref[type]] | None = None
        self.segment_users = 0

    def wrapper(self, mod: torch.nn.Module) -> _Checkpointed | None:
        """The installed forward wrapper, if it is still the module's forward."""
        w = self.forward() if self.forward is not None else None
        return w if w is not None and mod.__dict__.get("forward") is w else None

    def segment_of(self, mod: torch.nn.Module) -> _Segment | None:
        """The installed segment, if the module still has its class."""
        if self.segment is None:
            return None
        seg, sub = self.segment[0](), self.segment[1]()
        return seg if seg is not None and sub is not None and type(mod) is sub else None


# every module a plan touches -> what is installed on it (owned by this file's functions)
_STATE: weakref.WeakKeyDictionary[torch.nn.Module, _Installed] = weakref.WeakKeyDictionary()


def _installed(mod: torch.nn.Module) -> _Installed:
    state = _STATE.get(mod)
    if state is None:
        state = _STATE[mod] = _Installed()
    return state


def _wrap_forward(mod: torch.nn.Module, handle: CheckpointHandle) -> None:
    state = _installed(mod)
    wrapper = state.wrapper(mod)
    if wrapper is None:
        had = "forward" in mod.__dict__
        wrapper = _Checkpointed(mod.forward, mod, had, mod.__dict__.get("forward"))
        mod.__dict__["forward"] = wrapper
        state.forward, state.forward_users = weakref.ref(wrapper), 0
    state.forward_users += 1
    mine = weakref.ref(wrapper)
    del wrapper

    def undo() -> None:
        wrapper = mine()
        if wrapper is None or state.wrapper(mod) is not wrapper:
            return  # already put back, or replaced by someone else since: leave theirs
        state.forward_users -= 1
        if state.forward_users > 0:
            return  # another applied plan still checkpoints it
        state.forward = None
        if wrapper.had:
            mod.__dict__["forward"] = wrapper.previous
        else:
            del mod.__dict__["forward"]

    handle._undo.append(undo)


def _wrap_segment(model: torch.nn.Module, name: str, handle: CheckpointHandle) -> None:
    paths = segment_paths(name)
    mods = [_module(model, p) for p in paths]
    if len({id(m) for m in mods}) != len(mods):
        raise BudgetError(f"segment {name!r} names a module twice")
    states = [_installed(m) for m in mods]
    current = [st.segment_of(m) for st, m in zip(states, mods, strict=True)]
    first = current[0]
    if first is not None and all(c is first for c in current) and first.modules == mods:
        for st in states:  # the same segment, applied by another plan: shared
            st.segment_users += 1
        segment = first
    else:
        for c in current:
            if c is not None:
                raise BudgetError(
                    f"segment {name!r} overlaps the checkpoint segment {c.name!r} of a plan "
                    "applied before; remove that plan first (handle.remove())"
                )
        parent_path = paths[0].rpartition(".")[0]
        segment = _Segment(name, mods, _module(model, parent_path) if parent_path else model)
        for k, (mod, cls, st) in enumerate(zip(mods, segment.classes, states, strict=True)):
            sub = _segment_class(cls, segment, k)
            mod.__class__ = sub
            st.segment, st.segment_users = (weakref.ref(segment), weakref.ref(sub)), 1
    mine = weakref.ref(segment)
    del segment

    def undo() -> None:
        seg = mine()
        if seg is None:
            return
        for mod, st, cls in zip(mods, states, seg.classes, strict=True):
            if st.segment_of(mod) is not seg:
                continue  # already put back, or replaced since
            st.segment_users -= 1
            if st.segment_users > 0:
                continue
            st.segment = None
            mod.__class__ = cls

    handle._undo.append(undo)


def apply_checkpoints(model: torch.nn.Module, modules: tuple[str, ...] | list[str]
                      ) -> CheckpointHandle:
    """Wrap each named submodule (or segment ``a..b..c`` of sibling modules) in a
    non-reentrant checkpoint; the handle's ``.remove()`` restores the model."""
    handle = CheckpointHandle()
    # under torch.compile the checkpointed calls run as plain Python between compiled pieces
    # (Dynamo cannot trace checkpoint with a context_fn, nor the segments' frame walk)
    dynamo.eager_only(_Checkpointed.__call__, _Segment.call, _segment_call)
    try:
        for entry in modules:
            if SEGMENT in entry:
                _wrap_segment(model, entry, handle)
            else:
                _wrap_forward(_module(model, entry), handle)
    except BaseException:
        handle.remove()
        raise
    return handle
