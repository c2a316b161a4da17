"""The monitor's step: when one is logged (``StepClock``) and what a logged step accumulates
on the device until its one transfer (``StepBuffers``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .measure import Measure
from .stats import UpdateSample


class StepClock:
    """``every`` and ``full_every``, the step and logged-step counters, and the autograd graph
    task whose end-of-backward callback is queued."""

    __slots__ = ("every", "full_every", "step", "logged_steps", "_task")

    def __init__(self, every: int, full_every: int) -> None:
        self.every = every
        self.full_every = full_every
        self.step = 0
        self.logged_steps = 0
        self._task = -1

    def logged(self) -> bool:
        """Whether the current step is logged."""
        return self.step % self.every == 0

    def full_due(self) -> bool:
        """Whether the current logged step has full statistics."""
        return self.logged_steps % self.full_every == 0

    def advance(self) -> None:
        """The current step is over."""
        if self.logged():
            self.logged_steps += 1
        self.step += 1

    def backward_ended(self) -> None:
        """The queued callback ran (where graph task ids cannot be read, the next backward is
        told by this)."""
        self._task = -1

    def accumulate_hook(
        self, task_id: Callable[[], Any], on_new: Callable[[], None]
    ) -> Callable[[Any], None]:
        """The post-accumulate-grad hook of every watched parameter: ``on_new()`` for the first
        parameter of a backward not seen yet (``task_id()``: its graph task), nothing for the
        others. By id rather than a flag, so a backward that raised (and never ran its
        callbacks) cannot block later steps. A closure, not a method: every parameter calls it
        on every backward (10,000 calls a step in a large mixture of experts)."""

        def hook(param: Any) -> None:
            task = task_id()
            if task != self._task:
                self._task = task
                on_new()

        return hook


class Drained(NamedTuple):
    """What one logged step accumulated, handed over by ``StepBuffers.drain``."""

    measure: Measure | None
    probe: Measure | None
    sample: UpdateSample | None
    module_calls: list[tuple[int, torch.Tensor]]
    flags: list[tuple[int, torch.Tensor]]
    losses: list[torch.Tensor]


class StepBuffers:
    """What a logged step accumulates before its transfer: the measurement that counts (the
    last backward's, or the one at ``optimizer.step()``), the probe at the step (replication
    detection), the update-ratio sample, the module rows, the activation flags and the
    losses given to ``observe_loss``."""

    __slots__ = ("pending", "probe", "sample", "_module_calls", "_flags", "_losses")

    def __init__(self, n_modules: int) -> None:
        self.pending: Measure | None = None
        self.probe: Measure | None = None
        self.sample: UpdateSample | None = None
        self._module_calls: list[list[torch.Tensor]] = [[] for _ in range(n_modules)]
        self._flags: list[tuple[int, torch.Tensor]] = []
        self._losses: list[torch.Tensor] = []

    def add_loss(self, loss: torch.Tensor) -> None:
        self._losses.append(loss)

    def add_module_row(self, index: int, row: torch.Tensor) -> None:
        self._module_calls[index].append(row)

    def add_flag(self, index: int, flag: torch.Tensor) -> None:
        self._flags.append((index, flag))

    def drain(self) -> Drained:
        """Hand everything over and start empty."""
        calls = [(i, c) for i, cs in enumerate(self._module_calls) for c in cs]
        out = Drained(self.pending, self.probe, self.sample, calls, self._flags, self._losses)
        self.clear()
        return out

    def clear(self, *_: Any) -> None:
        self.pending = self.probe = self.sample = None
        for calls in self._module_calls:
            calls.clear()
        self._flags = []
        self._losses = []
