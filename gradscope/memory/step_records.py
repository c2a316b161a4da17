"""The memory of a whole training step, as plain data (``gs.step_memory``, ``gs.max_batch``;
the recording is in ``gradscope.memory.step``).

A step is its forward (and loss), its backward and, with an optimizer, ``optimizer.step()``
and ``zero_grad``. Every tensor storage the step touches is one interval of events (the
dispatched operations, in order): from the operation that made it (or the start, for what was
there before) to the last operation before it was released. The bytes live at an event are the
sum over the storages live then, each storage once, views free; each storage belongs to one
category:

- ``parameters``: the model's parameters and buffers;
- ``inputs``: the tensors the step was called with;
- ``optimizer_state``: the tensors the optimizer keeps (AdamW: two per parameter, made by the
  first step);
- ``gradients``: the parameters' ``.grad`` at the end of a backward;
- ``activations``: what the forward allocated and still held when it ended (saved for the
  backward, mostly);
- ``temporaries``: everything else (the backward's own tensors, the optimizer's scratch);
- ``gathered_parameters``: under FSDP2, the unsharded parameters its all-gathers make for a
  module's forward and backward (this rank's shards are ``parameters``);
- ``communication``: the buffers of the collectives the step calls (FSDP2's flat all-gather
  output, its reduce-scatter input).

Under an initialised process group every figure is this rank's: a DTensor counts its local
shard (``rank`` and ``world_size`` say which).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import GradscopeError
from ..graph.nodes import format_bytes
from ..output.envelope import dumps, envelope, open_document, write_json
from ..output.formats import Shown
from .activations_types import parse_size

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries",
              "inputs", "gathered_parameters", "communication")
PHASES = ("forward", "backward", "optimizer")
MAX_POINTS = 2000  # timeline points kept, at most

__all__ = ["CATEGORIES", "PHASES", "MaxBatch", "PeakAt", "StepMemory", "TimelinePoint",
           "thin"]


@dataclass(frozen=True)
class PeakAt:
    """Where the peak occurs: the operation (``aten.mm``, in the backward with its autograd
    node: ``MmBackward0 / aten.mm``), the module (a ``named_modules()`` path; None outside
    every module) and, in the forward, the source line that called it (``file.py:12``)."""

    op: str
    module: str | None = None
    line: str | None = None

    def __str__(self) -> str:
        where = f" in {self.module or 'the model'}" if self.module is not None else ""
        at = f" ({self.line})" if self.line else ""
        return f"{self.op}{where}{at}"


@dataclass(frozen=True)
class TimelinePoint:
    """One event: its index, the step (1, 2), the phase, the op, the module, bytes by
    category (``CATEGORIES`` order)."""

    index: int
    step: int
    phase: str
    op: str
    module: str | None
    bytes: tuple[int, ...]

    @property
    def total(self) -> int:
        return sum(self.bytes)

    def by_category(self) -> dict[str, int]:
        return dict(zip(CATEGORIES, self.bytes, strict=True))


@dataclass
class StepMemory(Shown):
    """The memory of a training step (``gs.step_memory``).

    Attributes:
        peak: the most bytes live at once over the recorded steps.
        peak_phase: ``forward``, ``backward`` or ``optimizer``.
        peak_step: the step it occurs in (1: the first, 2: the steady state).
        peak_at: the op, module and line of the peak (``PeakAt``).
        at_peak: bytes by category at the peak (``CATEGORIES``).
        first_step: the peak of the first step (the optimizer's state made during it).
        steady_state: the peak of the second step (the state there from the start): what a
            long run sees. Without an optimizer, one step is run and both are the same.
        before: bytes live before the step (parameters, buffers, inputs, optimizer state).
        timeline: the events, thinned to at most ``MAX_POINTS`` (every peak kept).
        events: how many events there were.
        device: where the step ran (``meta``: nothing was allocated).
        optimizer: the optimizer's class name (None: no optimizer step).
        autocast: the autocast dtype (None: none).
        plan: the checkpointed modules, when a plan was applied.
        measured: the peak measured by independent means (``measure_step``), when asked.
        measured_method: ``profiler`` (CPU) or ``cuda``.
        notes: what the figures cannot see, in words.
        rank: this process's rank when a process group was initialised (None: none was).
        world_size: the process group's size (None: no process group).
    """

    VIEW = "step_memory"

    peak: int
    peak_phase: str
    peak_step: int
    peak_at: PeakAt
    at_peak: dict[str, int]
    first_step: int
    steady_state: int
    before: int
    timeline: list[TimelinePoint]
    events: int
    device: str = "cpu"
    optimizer: str | None = None
    autocast: str | None = None
    plan: tuple[str, ...] = ()
    measured: int | None = None
    measured_method: str | None = None
    notes: list[str] = field(default_factory=list)
    rank: int | None = None
    world_size: int | None = None

    def fits(self, capacity: int | str) -> bool:
        """Whether the peak fits ``capacity`` (bytes, or ``"24GiB"``, ``"80GB"``)."""
        return self.peak <= _capacity(capacity)

    def summary(self) -> str:
        step = ("" if self.optimizer is None else
                f"; first step {format_bytes(self.first_step)}, steady state "
                f"{format_bytes(self.steady_state)}")
        parts = ", ".join(f"{c} {format_bytes(self.at_peak.get(c, 0))}" for c in CATEGORIES
                          if self.at_peak.get(c, 0))
        return (f"step peak {format_bytes(self.peak)} in the {self.peak_phase} at "
                f"{self.peak_at}{step} ({parts}; device {self.device}{self._on_rank()})")

    def _on_rank(self) -> str:
        return ("" if self.rank is None else
                f", rank {self.rank} of {self.world_size}")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["timeline"] = [[p.index, p.step, p.phase, p.op, p.module, list(p.bytes)]
                            for p in self.timeline]
        data["plan"] = list(self.plan)
        return envelope("step_memory", {"categories": list(CATEGORIES), **data})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepMemory:
        data = open_document(data, "step_memory")
        fields = {k: v for k, v in data.items() if k not in ("gradscope", "kind", "categories")}
        fields["peak_at"] = PeakAt(**fields["peak_at"])
        # a document of fewer categories (written before the distributed ones) reads as zeros
        known = list(data.get("categories", CATEGORIES[:6]))
        where = [known.index(c) if c in known else None for c in CATEGORIES]

        def spread(b: list[int]) -> tuple[int, ...]:
            return tuple(0 if k is None else b[k] for k in where)

        fields["timeline"] = [TimelinePoint(i, s, ph, op, mod, spread(b))
                              for i, s, ph, op, mod, b in fields["timeline"]]
        fields["at_peak"] = {c: fields["at_peak"].get(c, 0) for c in CATEGORIES}
        fields["plan"] = tuple(fields.get("plan", ()))
        return cls(**fields)

    def to_json(self, **extra: Any) -> str:
        return dumps({**self.to_dict(), **extra})

    def write_json(self, path: Any, **extra: Any) -> Any:
        """Write ``to_json(**extra)`` to ``path`` atomically; returns the path."""
        return write_json(path, {**self.to_dict(), **extra})

    def plot(self, path: Any, *, title: str = "") -> Any:
        """Write the timeline as a PNG (needs matplotlib): bytes stacked by category, the
        peak marked, the measured peak as a line when there is one. Returns the path."""
        from ..output.formats import renderer

        return renderer("step_memory_plot")(self, path, title=title)


@dataclass(frozen=True)
class MaxBatch:
    """The largest batch whose step fits (``gs.max_batch``).

    Attributes:
        batch: the largest batch size that fits (0: not even 1 fits).
        capacity: the bytes it had to fit.
        peak: that batch's step peak (None when ``batch`` is 0).
        at: that batch's ``StepMemory`` (None when ``batch`` is 0).
        next_peak: the peak of ``batch + 1`` (None when the search stopped at its limit).
        tried: ``(batch, peak)`` for every batch the search ran.
    """

    batch: int
    capacity: int
    peak: int | None
    at: StepMemory | None
    next_peak: int | None
    tried: tuple[tuple[int, int], ...] = ()

    def summary(self) -> str:
        cap = format_bytes(self.capacity)
        if self.batch == 0 or self.at is None or self.peak is None:
            first = self.tried[0][1] if self.tried else None
            needs = f" (batch 1 needs {format_bytes(first)})" if first is not None else ""
            return f"no batch fits in {cap}{needs}"
        sizes = [self.peak, self.capacity] + ([] if self.next_peak is None else [self.next_peak])
        shown = [format_bytes(b) for b in sizes]
        if len(set(shown)) < len(shown):  # 64.0 MiB fits, 64.0 MiB does not: say the bytes
            shown = [f"{b:,} B" for b in sizes]
        peak = shown[0] if shown[1] == cap else f"{shown[0]} of {shown[1]}"
        head = (f"batch {self.batch} fits in {cap} (peak {peak} in the "
                f"{self.at.peak_phase} at {self.at.peak_at})")
        if self.next_peak is None:
            return head + "; the search stopped at its limit"
        return head + f"; {self.batch + 1} needs {shown[2]}"


def _capacity(capacity: int | str) -> int:
    if isinstance(capacity, str) and capacity.strip().endswith("%"):
        raise GradscopeError(f"capacity {capacity!r}: give a size (24GiB, 80GB), not a share")
    return parse_size(capacity, of=1)


def thin(points: list[TimelinePoint], most: int = MAX_POINTS) -> list[TimelinePoint]:
    """At most ``most`` points: the events cut into equal runs, each run's highest point kept
    (so every local peak of a run, and the global peak, stay)."""
    if len(points) <= most:
        return list(points)
    per = -(-len(points) // most)
    out: list[TimelinePoint] = []
    for start in range(0, len(points), per):
        run = points[start:start + per]
        out.append(max(run, key=lambda p: p.total))
    return out
