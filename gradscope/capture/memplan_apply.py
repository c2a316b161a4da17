"""Applying a checkpoint plan: each planned module's forward, or each planned *segment* of
sibling modules, runs under a non-reentrant ``torch.utils.checkpoint``; the handle's
``.remove()`` puts the model back exactly.

- A module: an instance attribute ``forward`` that checkpoints the module's own forward
  (parameters, buffers, hooks and the state dict untouched).
- A segment ``conv1..bn1..relu`` (modules the forward calls one after the other, each handing
  its only output to the next; ``ActivationReport.segments``): the modules' classes are
  swapped for subclasses of the same name. When the parent calls the first module, the whole
  run goes through one checkpoint, each module called as usual inside it (its hooks run
  there, once); the parent's calls of the next modules with the very tensor the run handed
  back return it unchanged. A call that breaks the chain (another argument while the run is
  half through) raises a ``GradscopeError`` rather than compute something else.
"""

from __future__ import annotations

import copyreg
import threading
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from ..errors import GradscopeError
from ..model.memplan import SEGMENT, BudgetError, segment_paths


class _Checkpointed:
    """A module's forward, run under a non-reentrant ``torch.utils.checkpoint``."""

    def __init__(self, forward: Callable[..., Any]) -> None:
        self.forward = forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return checkpoint(self.forward, *args, use_reentrant=False, **kwargs)


class _Segment:
    """Sibling modules run as one checkpoint (see the module's docstring)."""

    def __init__(self, name: str, modules: list[torch.nn.Module]) -> None:
        self.name = name
        self.modules = modules
        self.classes = [type(m) for m in modules]
        self.local = threading.local()  # inside: depth in run(); pending: (tensor, next index)

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
            out = checkpoint(self.run, args[0], use_reentrant=False)
            if len(self.modules) > 1 and isinstance(out, torch.Tensor):
                self.local.pending = (out, 1)
            return out
        if pending is None:  # called on its own, not as part of the run
            return cls.__call__(mod, *args, **kwargs)
        tensor, expected = pending
        if expected != k or not single or args[0] is not tensor:
            self.local.pending = None
            raise GradscopeError(
                f"checkpoint segment {self.name!r}: the forward no longer hands each module's "
                f"output straight to the next (module {k + 1} of {len(self.modules)} got "
                "something else); remove the plan (handle.remove()) and plan again"
            )
        self.local.pending = (tensor, k + 1) if k + 1 < len(self.modules) else None
        return tensor


_RECONSTRUCT: Any = vars(copyreg)["_reconstructor"]  # what pickle protocols 0-1 use


def _segment_class(cls: type, segment: _Segment, k: int) -> type:
    plain: Any = cls
    def __call__(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        return segment.call(k, self, args, kwargs)

    def __reduce_ex__(self: torch.nn.Module, protocol: Any) -> Any:
        # a copy (copy.deepcopy, pickle) is of the plain class: it has no segment to run
        reduced = plain.__reduce_ex__(self, protocol)
        if isinstance(reduced, tuple) and len(reduced) > 1 and reduced[1][:1] == (type(self),):
            # copyreg's own reconstructor (no import of gradscope needed to load it)
            reduced = (_RECONSTRUCT, (cls, object, None), *reduced[2:])
        return reduced

    return type(cls.__name__, (cls,), {
        "__call__": __call__, "__reduce_ex__": __reduce_ex__, "__module__": cls.__module__,
        "__qualname__": cls.__qualname__, "_gradscope_segment": segment.name,
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
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise BudgetError(
            f"the plan names module {path!r}, which this model does not have"
        ) from None


def _wrap_forward(mod: torch.nn.Module, handle: CheckpointHandle) -> None:
    had = "forward" in mod.__dict__
    previous = mod.__dict__.get("forward")
    wrapper = _Checkpointed(mod.forward)
    mod.__dict__["forward"] = wrapper

    def undo() -> None:
        if mod.__dict__.get("forward") is not wrapper:
            return  # replaced by someone else since: leave theirs
        if had:
            mod.__dict__["forward"] = previous
        else:
            del mod.__dict__["forward"]

    handle._undo.append(undo)


def _wrap_segment(model: torch.nn.Module, name: str, handle: CheckpointHandle) -> None:
    mods = [_module(model, p) for p in segment_paths(name)]
    if len({id(m) for m in mods}) != len(mods):
        raise BudgetError(f"segment {name!r} names a module twice")
    segment = _Segment(name, mods)
    for k, (mod, cls) in enumerate(zip(mods, segment.classes, strict=True)):
        sub = _segment_class(cls, segment, k)
        mod.__class__ = sub

        def undo(mod: torch.nn.Module = mod, sub: type = sub, cls: type = cls) -> None:
            if type(mod) is sub:
                mod.__class__ = cls

        handle._undo.append(undo)


def apply_checkpoints(model: torch.nn.Module, modules: tuple[str, ...] | list[str]
                      ) -> CheckpointHandle:
    """Wrap each named submodule (or segment ``a..b..c`` of sibling modules) in a
    non-reentrant checkpoint; the handle's ``.remove()`` restores the model."""
    handle = CheckpointHandle()
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
