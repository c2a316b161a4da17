"""The parameters a monitor watches: one immutable snapshot, replaced whole when the model
changes (``WatchedParams``), and the global registration hooks that say it may have.

A ``GradMonitor`` is built on the tensors the model holds at that moment. Two things keep that
true while it trains:

* the first forward of the model checks that its parameters are still those tensors (a
  ``fully_shard``, ``.to()`` or re-assignment after the monitor was built is refused with
  ``UnsupportedSetupError``); a tensor swapped in for one call (``functional_call``) is not a
  change, and the check waits for the next forward (``WatchedParams.first_forward``);
* a parameter or submodule registered anywhere marks the model as possibly changed (two global
  registration hooks, held weakly: ``on_registration``); after the record of a logged step the
  monitor asks ``WatchedParams.refreshed`` for the parameters the model has now: a new
  snapshot (with the tensors it must hook) and a warning naming what was replaced, added or
  removed, or a frozen snapshot (the old names only) and a warning saying why it cannot follow
  (sharded parameters, another device, a tensor type it cannot measure).

Everything derived from the names and tensors (element counts, sampling seeds and sizes) is
computed here, once per snapshot; nothing is edited in place.
"""

from __future__ import annotations

import fnmatch
import warnings
import weakref
import zlib
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Any

import torch

from .._torch.torchcompat import is_dtensor
from ..errors import MonitorError, MonitorWarning, UnsupportedSetupError
from .checks import check_tensor_type
from .measure import Layout
from .stats import sample_size

_on_parameter_registered = torch.nn.modules.module.register_module_parameter_registration_hook
_on_module_registered = torch.nn.modules.module.register_module_module_registration_hook


def _weak_global(register: Any, method: Any) -> Any:
    """A global module hook that calls the bound ``method`` while its monitor lives: torch's
    global hook tables never keep a monitor (and its model) alive, and a monitor dropped
    without ``.remove()`` takes its hook with it when it is collected."""
    ref = weakref.WeakMethod(method)

    def hook(*args: Any) -> None:
        bound = ref()
        if bound is not None:
            bound(*args)

    handle = register(hook)
    weakref.finalize(method.__self__, handle.remove)
    return handle


def on_registration(method: Callable[..., None]) -> tuple[Any, Any]:
    """Call the bound ``method`` whenever a parameter or a submodule is registered on any
    module; returns the two hooks' handles."""
    return (
        _weak_global(_on_parameter_registered, method),
        _weak_global(_on_module_registered, method),
    )


def _seed(name: str) -> int:
    # the same lattice on every run and rank (str hash() is salted per process)
    return zlib.crc32(name.encode("utf-8", "surrogatepass"))


class WatchedParams:
    """One snapshot of the watched parameters: the model, the patterns asked for, the names
    frozen when the model changed in a way the monitor cannot follow, the names and tensors
    (model order), their element counts, the update-ratio sample's seeds and size, and the
    gradients' layout (``measure.Layout``).
    Immutable: ``refreshed`` returns a new one."""

    __slots__ = ("model", "patterns", "frozen", "names", "params", "numels", "numel_of",
                 "seeds", "update_sample", "sample_k", "layout")
    model: torch.nn.Module
    patterns: tuple[str, ...] | None
    frozen: frozenset[str] | None
    names: tuple[str, ...]
    params: tuple[torch.Tensor, ...]
    numels: tuple[int, ...]
    numel_of: MappingProxyType[str, int]
    seeds: tuple[int, ...]
    update_sample: int
    sample_k: int
    layout: Layout

    def __init__(
        self,
        model: torch.nn.Module,
        chosen: Sequence[tuple[str, torch.Tensor]],
        patterns: Sequence[str] | None,
        update_sample: int,
        frozen: frozenset[str] | None = None,
    ) -> None:
        set_ = object.__setattr__
        set_(self, "model", model)
        set_(self, "patterns", None if patterns is None else tuple(patterns))
        set_(self, "frozen", frozen)
        set_(self, "names", tuple(n for n, _ in chosen))
        set_(self, "params", tuple(p for _, p in chosen))
        set_(self, "numels", tuple(p.numel() for p in self.params))
        set_(self, "numel_of", MappingProxyType(dict(zip(self.names, self.numels, strict=True))))
        set_(self, "seeds", tuple(_seed(n) for n in self.names))
        set_(self, "update_sample", update_sample)
        # per tensor, lowered on a large model with many tensors (the sample's memory bound)
        set_(self, "sample_k", sample_size(self.numels, update_sample))
        # the gradients' groups and whether a step can take the fast path (measure.Layout)
        set_(self, "layout", Layout(self.params))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"WatchedParams is immutable ({name}); use refreshed()")

    def wanted(self, name: str) -> bool:
        """Whether the parameter ``name`` is one the monitor is asked to watch."""
        if self.frozen is not None:  # the model changed in a way it cannot follow: the old ones
            return name in self.frozen
        return self.patterns is None or any(fnmatch.fnmatchcase(name, p) for p in self.patterns)

    def first_forward(self) -> bool:
        """At a forward of the model: are its parameters still these tensors? True when the
        check is done (raises when they are not); False to look again at the next forward
        (a tensor swapped in for one call)."""
        current = dict(self.model.named_parameters())
        for name, p in zip(self.names, self.params, strict=True):
            now = current.get(name)
            if now is not p and now is not None and not isinstance(now, torch.nn.Parameter):
                # a tensor swapped in for one call (torch.func.functional_call: EMA weights,
                # MAML): not a change of the model; look again at the next forward
                return False
        for name, p in zip(self.names, self.params, strict=True):
            if current.get(name) is not p:
                raise UnsupportedSetupError(
                    f"parameter {name} of the model is no longer the tensor the GradMonitor "
                    "was built on (fully_shard, .to() or a re-assignment replaced it); build "
                    "the GradMonitor after wrapping and moving the model"
                )
        return True

    def refreshed(
        self, step: int, sharded: bool
    ) -> tuple[WatchedParams, list[torch.Tensor]] | None:
        """The parameters the model has now, when they differ from these: a new snapshot and
        the tensors new in it (to hook), with a warning naming the change; or a frozen copy
        of this one (and no tensor) with a warning saying why they cannot be watched. None
        when nothing changed. ``step``: the first step the new snapshot measures."""
        current: list[tuple[str, torch.Tensor]] = [
            (n, p) for n, p in self.model.named_parameters() if p.requires_grad and self.wanted(n)
        ]
        if len(current) == len(self.params) and all(
            p is q for (_, p), q in zip(current, self.params, strict=True)
        ):
            return None
        before = dict(zip(self.names, self.params, strict=True))
        now = dict(current)
        replaced = [n for n, p in current if n in before and before[n] is not p]
        added = [n for n, _ in current if n not in before]
        removed = [n for n in self.names if n not in now]
        what = "; ".join(
            f"{label}: {', '.join(names)}"
            for label, names in (("replaced", replaced), ("added", added), ("removed", removed))
            if names
        )
        problem = self._cannot_watch(current, set(replaced) | set(added), sharded)
        if problem is not None:
            warnings.warn(
                f"GradMonitor: the model's parameters changed after it started ({what}); "
                f"they are NOT watched ({problem}): build a new GradMonitor",
                MonitorWarning,
                stacklevel=5,
            )
            frozen = list(zip(self.names, self.params, strict=True))
            return WatchedParams(
                self.model, frozen, self.patterns, self.update_sample, frozenset(before)
            ), []
        warnings.warn(
            f"GradMonitor: the model's parameters changed after it started ({what}); "
            f"watching the model's current ones from step {step} on",
            MonitorWarning,
            stacklevel=5,
        )
        new = [p for n, p in current if n in replaced or n in added]
        return WatchedParams(
            self.model, current, self.patterns, self.update_sample, self.frozen
        ), new

    def _cannot_watch(
        self, current: list[tuple[str, torch.Tensor]], new: set[str], sharded: bool
    ) -> str | None:
        device = self.params[0].device
        if sharded or any(is_dtensor(p) for _, p in current):
            return "sharded (DTensor) parameters are not re-read while training"
        if any(p.device != device for _, p in current):
            return f"some are not on {device}"
        try:
            for name, p in current:
                if name in new:
                    check_tensor_type(name, p)
        except MonitorError as exc:
            return str(exc)
        return None
