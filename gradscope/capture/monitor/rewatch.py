"""Which parameters the monitor watches, read again when the model changes under it.

A ``GradMonitor`` is built on the tensors the model holds at that moment. Two things keep that
true while it trains:

* the first forward of the model checks that its parameters are still those tensors (a
  ``fully_shard``, ``.to()`` or re-assignment after the monitor was built is refused with
  ``UnsupportedSetupError``); a tensor swapped in for one call (``functional_call``) is not a
  change, and the check waits for the next forward (``first_forward``);
* a parameter or submodule registered anywhere marks the model as possibly changed (two global
  registration hooks, held weakly: ``on_registration``); before the next logged step the
  monitor reads the model's parameters again (``refresh``) and, if they differ, watches the
  current ones from then on, with a warning naming what was replaced, added or removed
  (``rewatch``), or says why it cannot (sharded parameters, another device, a tensor type it
  cannot measure) and keeps watching the old names only.

The functions take the monitor and change its watched set in place (``names``, ``_params`` and
what is derived from them).
"""

from __future__ import annotations

import fnmatch
import warnings
import weakref
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ...errors import MonitorError, MonitorWarning, UnsupportedSetupError
from .checks import check_tensor_type, is_dtensor
from .stats import sample_size

if TYPE_CHECKING:
    from .core import GradMonitor

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


def wanted(mon: GradMonitor, name: str) -> bool:
    """Whether the parameter ``name`` is one the monitor is asked to watch."""
    if mon._frozen is not None:  # the model changed in a way it cannot follow: the old ones
        return name in mon._frozen
    patterns = mon._patterns
    return patterns is None or any(fnmatch.fnmatchcase(name, pat) for pat in patterns)


def first_forward(mon: GradMonitor) -> None:
    """At the model's first forward: are its parameters still the monitor's tensors?"""
    if mon._checked_params:
        return
    current = dict(mon._model.named_parameters())
    for name, p in zip(mon.names, mon._params, strict=True):
        now = current.get(name)
        if now is not p and now is not None and not isinstance(now, torch.nn.Parameter):
            # a tensor swapped in for one call (torch.func.functional_call: EMA weights,
            # MAML): not a change of the model; look again at the next forward
            return
    mon._checked_params = True
    for name, p in zip(mon.names, mon._params, strict=True):
        if current.get(name) is not p:
            raise UnsupportedSetupError(
                f"parameter {name} of the model is no longer the tensor the GradMonitor "
                "was built on (fully_shard, .to() or a re-assignment replaced it); build "
                "the GradMonitor after wrapping and moving the model"
            )


def refresh(mon: GradMonitor) -> None:
    """Before a logged step, after a parameter or module was registered somewhere: watch
    the parameters the model has now (replaced or added since the monitor started; a
    warning names them)."""
    current = [
        (n, p) for n, p in mon._model.named_parameters() if p.requires_grad and wanted(mon, n)
    ]
    params = mon._params
    if len(current) == len(params) and all(
        p is q for (_, p), q in zip(current, params, strict=True)
    ):
        return
    rewatch(mon, current)


def rewatch(mon: GradMonitor, current: list[tuple[str, torch.nn.Parameter]]) -> None:
    """Watch ``current`` (the model's parameters now) instead of the monitor's, or warn that
    it cannot."""
    before = dict(zip(mon.names, mon._params, strict=True))
    now = dict(current)
    replaced = [n for n, p in current if n in before and before[n] is not p]
    added = [n for n, _ in current if n not in before]
    removed = [n for n in mon.names if n not in now]
    what = "; ".join(
        f"{label}: {', '.join(names)}"
        for label, names in (("replaced", replaced), ("added", added), ("removed", removed))
        if names
    )
    device = mon._params[0].device
    problem = None
    if mon._sharding is not None or any(is_dtensor(p) for _, p in current):
        problem = "sharded (DTensor) parameters are not re-read while training"
    elif any(p.device != device for _, p in current):
        problem = f"some are not on {device}"
    else:
        try:
            for name, p in current:
                if name in replaced or name in added:
                    check_tensor_type(name, p)
        except MonitorError as exc:
            problem = str(exc)
    if problem is not None:
        warnings.warn(
            f"GradMonitor: the model's parameters changed after it started ({what}); "
            f"they are NOT watched ({problem}): build a new GradMonitor",
            MonitorWarning,
            stacklevel=4,
        )
        mon._frozen = set(before)
        return
    warnings.warn(
        f"GradMonitor: the model's parameters changed after it started ({what}); "
        f"watching the model's current ones from step {mon.step} on",
        MonitorWarning,
        stacklevel=4,
    )
    mon.names = [n for n, _ in current]
    mon._params = [p for _, p in current]
    mon._numels = [p.numel() for p in mon._params]
    mon._numel_of.clear()
    mon._numel_of.update(zip(mon.names, mon._numels, strict=True))
    mon._seeds = [zlib.crc32(n.encode("utf-8", "surrogatepass")) for n in mon.names]
    mon._sample_k = sample_size(mon._numels, mon.update_sample)
    mon._incidents.watch(mon._params)  # the replay differentiates the current ones
    if mon._point == "backward":
        for name, p in current:
            if name in replaced or name in added:
                mon._handles.add(p.register_post_accumulate_grad_hook(mon._on_accumulate))
