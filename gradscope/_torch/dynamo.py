"""Staying invisible to Dynamo: gradscope's hooks must never change what ``torch.compile``
compiles.

Hooks that Dynamo would trace inline (global module hooks inside a compiled ``_call_impl``, a
``TorchFunctionMode``'s ``__torch_function__``) start with ``compiling()`` and return at once,
so the traced code is a no-op. Hooks that run *while* a compiled frame executes (saved-tensor
pack hooks, the hooks of a module whose forward Dynamo compiles) would be compiled as frames of
their own: ``eager_only`` marks their code so Dynamo skips them and everything they call.
``ModuleHooks`` registers global module hooks that Dynamo does not see at all: they are taken
off for the length of each compilation (so no guard on the hook dicts is installed and no
recompile follows when they go), and the warning ``OptimizedModule`` prints about global hooks
is silenced while they are on, since these hooks expect the wrapper's extra call (``unwrap``
maps it to the wrapped module).

Dynamo's internals are read through ``torchcompat`` (probed by feature, not by version), and
``torch._dynamo`` is imported only when the program already did (it costs seconds). Every name
here is also importable from ``gradscope.graph.compiled``, where the recorders reach it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from . import torchcompat

#: ``torch.compiler.is_compiling``: True while Dynamo traces (a constant it folds) and during a
#: compile session; hooks that Dynamo may inline test it first and return.
compiling: Callable[[], bool] = torchcompat.compiling
dynamo_loaded = torchcompat.dynamo_loaded


_PENDING: set[Any] = set()  # code objects waiting for torch._dynamo to be imported
_MARKED: set[Any] = set()


def _code_of(fn: Any) -> Any:
    fn = getattr(fn, "__func__", fn)  # bound method
    fn = getattr(fn, "func", fn)  # functools.partial
    fn = getattr(fn, "__func__", fn)
    return getattr(fn, "__code__", None)


def eager_only(*fns: Any) -> None:
    """Dynamo never compiles these functions' frames, nor frames they call, when they run
    while a compiled frame executes (saved-tensor hooks, hooks of a module whose forward is
    compiled): they run as plain Python. Inline tracing is not affected, so a hook that Dynamo
    traces must still return at once under ``compiling()``. Takes effect once
    ``torch._dynamo`` is imported (``arm`` runs then)."""
    for fn in fns:
        code = _code_of(fn)
        if code is not None and code not in _MARKED:
            _PENDING.add(code)
    arm()


def arm() -> bool:
    """Mark the pending code objects if ``torch._dynamo`` is loaded; True when it is."""
    if not dynamo_loaded():
        return False
    if _PENDING:
        mark = torchcompat.frame_skipper()
        if mark is None:  # another torch: nothing to mark with (torchcompat noted it)
            _PENDING.clear()
            return True
        for code in list(_PENDING):
            mark(code)
            _MARKED.add(code)
        _PENDING.clear()
    return True


def unwrap(module: Any) -> Any:
    """The module a ``torch.compile(module)`` wrapper (``OptimizedModule``) wraps, else None."""
    if type(module).__name__ != "OptimizedModule":
        return None
    return getattr(module, "_orig_mod", None)


def plain_name(name: str) -> str:
    """``_orig_mod.fc1.weight`` -> ``fc1.weight``: a ``named_modules``/``named_parameters``
    name of a compiled module, without the wrapper's ``_orig_mod`` level."""
    if "_orig_mod" not in name:
        return name
    return ".".join(p for p in name.split(".") if p != "_orig_mod")


def named_modules(model: Any) -> list[tuple[str, Any]]:
    """``model.named_modules()`` as the user names them: a ``torch.compile`` wrapper
    (``OptimizedModule``) is left out and the module it wraps takes its name, so no name has
    an ``_orig_mod`` level (``layer1.0``, not ``_orig_mod.layer1.0``) and nothing is listed
    twice. Every path gradscope prints or writes comes from here or ``plain_name``.

    Example:
        >>> import torch
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> [name for name, _ in named_modules(net)]
        ['', '0']
    """
    return [(plain_name(name), mod) for name, mod in model.named_modules()
            if unwrap(mod) is None]


def module_names(model: Any) -> dict[int, str]:
    """``id(module) -> name`` for ``named_modules(model)``; a compile wrapper is not in it."""
    return {id(mod): name for name, mod in named_modules(model)}


# -------------------------------------------------------------------- the OptimizedModule warning
_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks on modules"
_quiet_users = 0
_quiet_item: Any = None


def _quiet(on: bool) -> None:
    """Silence OptimizedModule's warning about global hooks while gradscope's are installed
    (they expect the wrapper's extra call); the filter entry is ours alone and leaves with the
    last user."""
    global _quiet_users, _quiet_item
    if on:
        _quiet_users += 1
        if _quiet_users == 1:
            warnings.filterwarnings("ignore", message=_WARNING, category=UserWarning)
            _quiet_item = warnings.filters[0]
        return
    _quiet_users = max(0, _quiet_users - 1)
    if _quiet_users == 0 and _quiet_item is not None:
        filters = warnings.filters  # a list (typeshed declares a Sequence)
        try:
            if isinstance(filters, list):
                filters.remove(_quiet_item)
        except ValueError:  # someone restored the filter list (catch_warnings): already gone
            pass
        mutated = getattr(warnings, "_filters_mutated", None)
        if mutated is not None:
            mutated()
        _quiet_item = None


@contextmanager
def wrapper_warning_quiet() -> Iterator[None]:
    """For global module hooks gradscope installs itself (``register_module_forward_*``) that
    expect the wrapper's extra call: OptimizedModule's warning about them is not shown (it
    would be about gradscope's hooks, not the user's)."""
    _quiet(True)
    try:
        yield
    finally:
        _quiet(False)


class ModuleHooks:
    """Global module forward pre/post hooks (``always_call``) that ``torch.compile`` does not
    see: taken off while Dynamo compiles, no-ops if traced anyway, and run as plain Python when
    called from inside a compiled frame. Removal is idempotent.

    Example:
        >>> hooks = ModuleHooks(lambda m, a: None, lambda m, a, o: None).install()
        >>> hooks.remove(); hooks.remove()
    """

    def __init__(self, pre: Callable[..., Any], post: Callable[..., Any]) -> None:
        self.pre = pre
        self.post = post
        self.handles: list[Any] = []
        self.installed = False
        self.hidden = False
        self.callbacks: tuple[Any, Any] | None = None
        self.handler: Any = None

    def install(self) -> ModuleHooks:
        if self.installed:
            return self
        self.installed = True
        _quiet(True)
        self._register()
        self._arm()
        return self

    def remove(self) -> None:
        if not self.installed:
            return
        self.installed = False
        self._unregister()
        if self.callbacks is not None:
            handler = self.handler
            start, end = self.callbacks
            for lst, cb in ((getattr(handler, "start_callbacks", []), start),
                            (getattr(handler, "end_callbacks", []), end)):
                if cb in lst:
                    lst.remove(cb)
            self.callbacks = None
        _quiet(False)

    # ------------------------------------------------------------------ internals
    def _register(self) -> None:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        self.handles = [
            register_module_forward_pre_hook(self._pre),
            register_module_forward_hook(self._post, always_call=True),
        ]

    def _unregister(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []

    def _armed(self) -> bool:
        """The compile callbacks are in place (``torch._dynamo.reset()`` clears them all)."""
        cbs = self.callbacks
        return cbs is not None and cbs[0] in self.handler.start_callbacks

    def _arm(self) -> None:
        if self._armed() or not arm():
            return
        eager_only(self._pre, self._post)
        handler = _callback_handler()
        if handler is None:
            return
        self.handler = handler

        def hide(args: Any) -> None:
            if self.installed and not self.hidden:
                self.hidden = True
                self._unregister()

        def show(args: Any) -> None:
            if self.installed and self.hidden:
                self.hidden = False
                self._register()

        handler.register_start_callback(hide)
        handler.register_end_callback(show)
        self.callbacks = (hide, show)

    def _pre(self, module: Any, args: Any) -> None:
        if compiling():
            return None
        if not self._armed():
            self._arm()  # torch._dynamo imported since install, or reset() cleared callbacks
        self.pre(module, args)
        return None

    def _post(self, module: Any, args: Any, output: Any) -> None:
        if compiling():
            return None
        self.post(module, args, output)
        return None


_callback_handler = torchcompat.compile_callbacks

# -------------------------------------------------------------------- torch function modes
mode_on_top = torchcompat.mode_on_top
pop_mode = torchcompat.pop_mode
push_mode = torchcompat.push_mode
