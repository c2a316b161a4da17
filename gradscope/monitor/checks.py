"""The monitor's set-up checks: its arguments, which parameters and modules it watches, the
optimizer inside a wrapper, the GradScaler. Everything here runs once, in
``GradMonitor.__init__``, before any of the user's code, and raises ``MonitorError`` or
``UnsupportedSetupError`` with the fix."""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from .._torch.torchcompat import is_dtensor
from ..errors import MonitorError, UnsupportedSetupError
from .log import VANISH, Thresholds

MEASURE_POINTS = ("backward", "optimizer")


def select_modules(
    model: torch.nn.Module, modules: bool | str | Iterable[str]
) -> list[tuple[str, torch.nn.Module]]:
    """The submodules ``modules=`` names: True for all, False for none, else names or globs
    (``"encoder.*"``), each of which must match at least one submodule."""
    if isinstance(modules, bool):
        return [(n, m) for n, m in model.named_modules() if n] if modules else []
    patterns = [modules] if isinstance(modules, str) else list(modules)
    if not all(isinstance(p, str) for p in patterns):
        raise MonitorError(
            f"modules={modules!r} must be True, False, or submodule names/globs such as "
            "'encoder.layers.*'"
        )
    named = [(n, m) for n, m in model.named_modules() if n]
    unknown = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n, _ in named)]
    if unknown:
        shown = ", ".join(n for n, _ in named[:8]) + (", ..." if len(named) > 8 else "")
        raise MonitorError(
            f"modules= names no submodule of {type(model).__name__}: {', '.join(unknown)}; "
            f"give names as in named_modules() or globs (its submodules: {shown or 'none'})"
        )
    return [(n, m) for n, m in named if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


def select_params(
    model: torch.nn.Module, params: str | Iterable[str] | None
) -> list[tuple[str, torch.nn.Parameter]]:
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if params is None:
        chosen = named
    else:
        patterns = [params] if isinstance(params, str) else list(params)
        chosen = [(n, p) for n, p in named if any(fnmatch.fnmatchcase(n, pat) for pat in patterns)]
        if not chosen:
            shown = ", ".join(n for n, _ in named[:6]) + (", ..." if len(named) > 6 else "")
            raise MonitorError(
                f"params={patterns!r} matches no trainable parameter of {type(model).__name__}; "
                f"give names or globs such as 'encoder.*' (its parameters: {shown or 'none'})"
            )
    if not chosen:
        raise MonitorError(
            f"{type(model).__name__} has no parameter with requires_grad=True to monitor; "
            "pass the model being trained"
        )
    devices = sorted({str(p.device) for _, p in chosen})
    if len(devices) > 1:
        # the statistics of one step are packed into one tensor on one device
        raise MonitorError(
            f"the watched parameters are on several devices ({', '.join(devices)}); "
            "use one GradMonitor per device, selecting its parameters with params=..."
        )
    for name, p in chosen:
        check_tensor_type(name, p)
    return chosen


def check_tensor_type(name: str, p: torch.Tensor) -> None:
    if is_dtensor(p):
        return
    if isinstance(p, torch.nn.parameter.UninitializedParameter):
        raise UnsupportedSetupError(
            f"parameter {name} is not initialised yet (a lazy module); run one forward "
            "before building the GradMonitor"
        )
    # a Python subclass of Parameter is a plain tensor; one with its own __torch_dispatch__
    # (quantised or packed weights) is not something the norms can be read from
    if type(p).__torch_dispatch__ is not torch.Tensor.__torch_dispatch__:
        raise UnsupportedSetupError(
            f"parameter {name} is a {type(p).__name__}, a tensor subclass GradMonitor cannot "
            "measure (it knows plain tensors and DTensor); leave it out with params=[...]"
        )


def check_args(model: Any, every: Any, norm_type: Any, full_every: Any, measure: Any) -> None:
    if not isinstance(model, torch.nn.Module):
        raise MonitorError(
            f"GradMonitor needs an nn.Module, got {type(model).__name__}; "
            "pass the model being trained"
        )
    for name, value in (("every", every), ("full_every", full_every)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MonitorError(f"{name}={value!r} must be a positive integer (1: every step)")
    if not isinstance(norm_type, (int, float)) or isinstance(norm_type, bool) or not norm_type > 0:
        raise MonitorError(f"norm_type={norm_type!r} must be a positive number or math.inf")
    if measure not in MEASURE_POINTS:
        raise MonitorError(
            f"measure={measure!r} must be 'backward' (the gradients as backward left them, "
            "before clipping) or 'optimizer' (what optimizer.step() is given)"
        )


def unwrap_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside a wrapper (accelerate's AcceleratedOptimizer, Lightning's
    LightningOptimizer): step hooks run only on the optimizer whose step() does the work."""
    inner = optimizer
    for _ in range(4):
        nested = getattr(inner, "optimizer", None) or getattr(inner, "_optimizer", None)
        if isinstance(nested, torch.optim.Optimizer) and nested is not inner:
            inner = nested
        else:
            break
    if not isinstance(inner, torch.optim.Optimizer):
        raise MonitorError(
            f"optimizer= must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    return inner


#: ``vanish`` when the optimizer does not set it (``vanish_level``)


def vanish_level(optimizer: torch.optim.Optimizer | None) -> float:
    """The default "vanishing" level: ``VANISH`` per element, or, for an optimizer that
    divides each gradient by its running size plus ``eps`` (Adam, AdamW, RMSprop, Adagrad...:
    an ``eps`` in its param groups), the smallest ``eps`` when that is lower. Such an update is
    about g / (|g| + eps) of a full one: a gradient above ``eps`` per element still moves its
    weight at half the learning rate or more, one below it less and less. Under SGD the update
    is the gradient itself, and ``VANISH`` stays.

    Example:
        >>> w = torch.zeros(2, requires_grad=True)
        >>> vanish_level(torch.optim.AdamW([w])), vanish_level(torch.optim.SGD([w], lr=0.1))
        (1e-08, 1e-07)
    """
    if optimizer is None:
        return VANISH
    eps = [g["eps"] for g in optimizer.param_groups
           if isinstance(g.get("eps"), (int, float)) and g["eps"] > 0]
    return min([VANISH, *eps])


def check_scaler(scaler: Any) -> Any:
    if scaler is None:
        return None
    if not isinstance(scaler, torch.amp.GradScaler):
        raise MonitorError(
            f"scaler= must be a torch.amp.GradScaler, got {type(scaler).__name__}"
        )
    return scaler if scaler.is_enabled() else None


def check_options(replicated: Any, update_sample: Any, history: Any) -> None:
    if replicated not in (None, True, False):
        raise MonitorError(f"replicated={replicated!r} must be None (detect), True or False")
    if isinstance(update_sample, bool) or not isinstance(update_sample, int) or (
        update_sample < 1
    ):
        raise MonitorError(f"update_sample={update_sample!r} must be a positive integer")
    if history is not None and (
        isinstance(history, bool) or not isinstance(history, int) or history < 1
    ):
        raise MonitorError(
            f"history={history!r} must be a positive integer (the logged steps kept) or None "
            "(keep all; jsonl=PATH writes every step to a file instead)"
        )


def check_stream_path(path: Any) -> Path:
    """The JSON Lines file of ``jsonl=``, checked (not opened: the monitor opens it once every
    other argument is accepted, so a refused monitor leaves an existing log as it was)."""
    if not isinstance(path, (str, os.PathLike)):
        raise MonitorError(f"jsonl={path!r} must be a file path")
    target = Path(path)
    if target.exists() and not target.is_file():
        raise MonitorError(f"jsonl={str(target)!r} exists and is not a regular file")
    if not target.parent.is_dir():
        raise MonitorError(f"jsonl={str(target)!r} cannot be written: its folder does not exist")
    return target


def adaptive(optimizer: torch.optim.Optimizer | None) -> bool:
    """Whether ``optimizer`` divides each gradient by its own running size (an ``eps`` in its
    param groups: Adam, AdamW, RMSprop, Adagrad...): then a gradient far smaller than the
    model's others still moves its weight at about the learning rate, and being small
    *relative to the model* says nothing (``vanish_ratio`` is off by default)."""
    return optimizer is not None and any("eps" in g for g in optimizer.param_groups)


#: ``GradMonitor``'s threshold keywords and their defaults (the fields of ``Thresholds``)
THRESHOLD_KEYWORDS: dict[str, Any] = {
    "vanish": None, "vanish_ratio": None, "explode": 1e3, "spike": 10.0, "spike_window": 50,
    "spike_warmup": 10,
}


def grouped_thresholds(thresholds: Any, **keywords: Any) -> tuple[Any, ...]:
    """The six threshold values from ``thresholds=`` (a ``Thresholds``), refusing a keyword
    given beside it (two places for one setting)."""
    if not isinstance(thresholds, Thresholds):
        raise MonitorError(
            f"thresholds={thresholds!r}: give a gradscope.Thresholds, for instance "
            "thresholds=gs.Thresholds(explode=100.0)"
        )
    given = [k for k, default in THRESHOLD_KEYWORDS.items() if keywords[k] != default]
    if given:
        raise MonitorError(
            f"GradMonitor got thresholds= and {given[0]}={keywords[given[0]]!r}: give one or "
            f"the other, for instance thresholds=Thresholds({given[0]}={keywords[given[0]]!r}, ...)"
        )
    return tuple(getattr(thresholds, k) for k in THRESHOLD_KEYWORDS)
