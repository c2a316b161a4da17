"""The forward side of a ``GradMonitor``: ``modules=`` and ``activations=``.

``ForwardWatch`` owns which submodules are watched in the forward (their names and the index
of each by identity) and what their forwards add to a logged step: a tensor hook on each
output of a ``modules=`` submodule, whose gradient becomes one statistics row
(``stats.module_row``), and, with ``activations=True``, one device-side "not all finite"
flag per floating output of every module. Both go into the step's ``StepBuffers`` (through its
methods) and travel with the step's one transfer; nothing here reads a value on the host.

A value torch cannot test or reduce in its own dtype (float8: no ``isinf``/``isfinite`` for
``e4m3fn``, no norm for any float8) is read through ``tensor_facts.checkable``: a float32 copy
made for the check only (exact: every float8 value, NaN included, is a float32 value); the
user's tensor, and the gradient autograd passes on, are never changed. A packed float4 tensor
(two values a byte, nothing reads it element-wise) is skipped.

The monitor calls ``output`` from its one global forward hook (``dynamo.ModuleHooks``) for
every module that finishes a forward; ``needs_hooks`` says whether that hook is needed after
the first step (without ``modules=`` or ``activations=`` it is not).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import torch

from .._torch import torchcompat
from ..graph.nest import iter_tensors
from ..graph.tensor_facts import checkable
from .stats import local, module_row, unscale
from .step import StepBuffers, StepClock

_wrapped = torchcompat.is_functorch_wrapped


class ForwardWatch:
    """The ``modules=`` rows and ``activations=`` flags of a monitor's logged steps.

    Args:
        model: the watched model (its ``named_modules()`` are the activations' names).
        modules: the ``(name, module)`` pairs ``modules=`` selected.
        activations: flag the first non-finite module output of each logged step.
        clock: the monitor's ``StepClock`` (read: whether the step is logged).
        buffers: the monitor's ``StepBuffers`` (written through ``add_module_row`` /
            ``add_flag``).
        norm_type: the p of the module rows' norms.
        unscale: the inverse of the GradScaler's scale now (a device scalar), or None.
        guard: runs a hook body so that an unexpected failure stops the monitor with a
            warning instead of breaking the user's step (``GradMonitor._guard``).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        modules: Sequence[tuple[str, torch.nn.Module]],
        activations: bool,
        *,
        clock: StepClock,
        buffers: StepBuffers,
        norm_type: float,
        unscale: Callable[[], torch.Tensor | None],
        guard: Callable[..., Any],
    ) -> None:
        self.module_names = [n for n, _ in modules]
        named = list(model.named_modules()) if activations else []
        self.act_names = [n or type(model).__name__ for n, _ in named]
        self._module_index = {id(mod): i for i, (_, mod) in enumerate(modules)}
        self._act_index = {id(mod): i for i, (_, mod) in enumerate(named)}
        self._clock = clock
        self._buffers = buffers
        self._norm_type = norm_type
        self._unscale = unscale
        self._guard = guard

    @property
    def needs_hooks(self) -> bool:
        """Whether module forwards must still be seen (``modules=`` or ``activations=``)."""
        return bool(self._module_index or self._act_index)

    def output(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        """``module``'s forward returned ``output`` (the global forward hook)."""
        key = id(module)
        i = self._module_index.get(key)
        if i is not None:
            self._module_forward(i, output)
        i = self._act_index.get(key)
        if i is not None and self._clock.logged() and torch.is_grad_enabled():
            self._guard(self._check_outputs, i, output)

    # ------------------------------------------------------------------ modules=
    def _module_forward(self, index: int, output: Any) -> None:
        if not self._clock.logged() or not torch.is_grad_enabled():
            return
        for _, t in iter_tensors(output):
            if t.requires_grad:
                t.register_hook(partial(self._module_grad, index))

    def _module_grad(self, index: int, grad: torch.Tensor) -> None:
        self._guard(self._module_row, index, grad)

    def _module_row(self, index: int, grad: torch.Tensor) -> None:
        if grad.numel() == 0:
            return
        with torch.no_grad():
            g = checkable(grad.detach())  # float8 read widened (a copy); the gradient as it is
            if g is None:
                return
            row = module_row(g, self._norm_type)
            inv = self._unscale()
            if inv is not None:  # the figures that scale with a scaled gradient
                row = unscale(row, inv)
            self._buffers.add_module_row(index, row)

    # ------------------------------------------------------------------ activations=
    def _check_outputs(self, index: int, output: Any) -> None:
        with torch.no_grad():
            for _, t in iter_tensors(output):
                if _wrapped(t):  # inside torch.func.vmap / grad: a batched view, not checkable
                    continue
                if not (t.is_floating_point() or t.is_complex()):
                    continue
                # this rank's own values (a DTensor's local shard: no collective, and the
                # evidence of where a distributed step went bad is per rank); float8: a
                # float32 copy for the test only
                d = checkable(local(t.detach()))
                if d is not None:
                    self._buffers.add_flag(index, ~torch.isfinite(d).all())
