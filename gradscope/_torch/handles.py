"""The one handle type of every gradscope hook owner, in the idiom of
``torch.utils.hooks.RemovableHandle``.

``scopes``, ``record_forward``, ``record_backward``, ``saved_memory``, ``leak_check`` and
``GradMonitor`` each keep what they installed (torch hook handles, saved-tensor hook pairs, a
``TorchFunctionMode``) in one ``HookHandle``. ``remove()`` takes everything off, newest first,
and is safe to call twice; the handle is a context manager that removes on ``__exit__``, also
when the block raises. If one removal fails, the others still run and the first error is
raised afterwards, so no hook is left behind by a failing neighbour.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class HookHandle:
    """Everything one gradscope hook owner installed, removable at once.

    Example:
        >>> import torch
        >>> lin = torch.nn.Linear(2, 2)
        >>> handle = HookHandle()
        >>> hook = handle.add(lin.register_forward_hook(lambda *a: None))  # returns the hook
        >>> len(lin._forward_hooks), len(handle)
        (1, 1)
        >>> handle.remove(); handle.remove()     # idempotent
        >>> len(lin._forward_hooks)
        0
    """

    __slots__ = ("_removers", "removed")

    def __init__(self) -> None:
        self._removers: list[Callable[[], Any]] = []
        self.removed = False

    def add(self, hook: Any) -> Any:
        """Keep ``hook`` (anything with ``.remove()``, or a zero-argument callable that undoes
        what was installed) for ``remove``; returns ``hook``."""
        remover = getattr(hook, "remove", None)
        if remover is None:
            if not callable(hook):
                raise TypeError(f"HookHandle.add needs a handle or a callable, got {hook!r}")
            remover = hook
        self._removers.append(remover)
        self.removed = False
        return hook

    def __len__(self) -> int:
        return len(self._removers)

    def remove(self) -> None:
        """Remove every hook, newest first; safe to call twice."""
        removers, self._removers = self._removers, []
        self.removed = True
        first: BaseException | None = None
        for remover in reversed(removers):
            try:
                remover()
            except BaseException as exc:  # run the others, then raise the first
                if first is None:
                    first = exc
        if first is not None:
            raise first

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
