"""The plain records of activation memory and checkpoint plans: sizes (``parse_size``), the
storages and module calls a recorded forward is read into, a report row, a ``Plan`` and its
``Verification`` (the report and the plan search are in ``gradscope.memory.activations_records``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ..errors import BudgetError
from ..graph.nodes import format_bytes

ACTIVATION, PARAM, INPUT, OUTPUT = "activation", "param", "input", "output"
SEGMENT = ".."  # joins a segment's module names (``conv1..bn1``): no module name holds it


# ====================================================================== sizes
_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z%]*)\s*$")


def parse_size(value: int | float | str, *, of: int | None = None) -> int:
    """Bytes from ``value``: an int, or a string like ``"2GiB"``, ``"512 MB"``, ``"1e9"``;
    ``"40%"`` is that share of ``of`` (the baseline) when ``of`` is given.

    Example:
        >>> parse_size("2GiB"), parse_size("1.5 kB"), parse_size("50%", of=300)
        (2147483648, 1500, 150)
    """
    if isinstance(value, bool):
        raise BudgetError(f"budget {value!r} is not a size; give bytes or a string like '2GiB'")
    if isinstance(value, (int, float)):
        if not math.isfinite(value) or value < 0:
            raise BudgetError(f"budget {value!r} must be a finite number of bytes, 0 or more")
        return int(value)
    m = _SIZE.match(str(value))
    unit = m.group(2).lower() if m else None
    if m is None or (unit not in _UNITS and unit != "%"):
        raise BudgetError(
            f"budget {value!r} is not a size; give bytes or a number with a unit "
            "(B, KB, KiB, MB, MiB, GB, GiB, TB, TiB), or a share of the baseline like '50%'"
        )
    number = float(m.group(1))
    if unit == "%":
        if of is None:
            raise BudgetError(
                f"budget {value!r} is a share, but there is no baseline to take it of"
            )
        return int(of * number / 100.0)
    return int(number * _UNITS[unit])


# ====================================================================== records
@dataclass(frozen=True, slots=True)
class Storage:
    """One storage the forward's graph (or a checkpoint) would hold at the end of the forward.

    Attributes:
        id: ``s0``, ``s1``... in the order first seen.
        nbytes: bytes of the storage.
        kind: ``activation`` (allocated by the forward, held only by the graph), ``param``
            (a parameter or buffer), ``input`` (a tensor the model was called with) or
            ``output`` (a storage of the outputs handed back); only activations count.
        saves: one entry per save still held at the end of the forward: the module names
            whose calls were running (outermost first; ``""`` is the model itself).
        dtype: dtype of the first saved (or input) tensor on it.
    """

    id: str
    nbytes: int
    kind: str
    saves: tuple[tuple[str, ...], ...]
    dtype: str = ""


@dataclass(frozen=True, slots=True)
class ModuleInfo:
    """One module of the model, as the forward called it.

    Attributes:
        path: its name in ``named_modules()`` (``""``: the model).
        cls: its class name.
        parent: the name of the module it belongs to (None for the model).
        calls: how many times the forward called it.
        inputs: storage ids of the tensors its calls got (what a checkpoint of it keeps).
        flops: forward FLOPs of all its calls, submodules included (``torch.utils.flop_counter``).
        in_container: it is an item of an ``nn.ModuleList`` / ``nn.Sequential``.
        builtin: its class is one of ``torch.nn``'s own (``Linear``, ``Sequential``...).
        chain_next: the sibling called right after it (same parent, nothing called between)
            when that call's only argument was this module's only output and nothing else in
            the graph used that output: the two can be checkpointed as one segment.
        mutates_input: a call changed one of its (positional) inputs in place (``ReLU(
            inplace=True)``): a checkpoint that starts with it cannot recompute it, so the
            search never starts one there.
    """

    path: str
    cls: str
    parent: str | None
    calls: int
    inputs: tuple[str, ...]
    flops: int
    in_container: bool = False
    builtin: bool = False
    chain_next: str | None = None
    mutates_input: bool = False


@dataclass(frozen=True, slots=True)
class ModuleRow:
    """One row of the report: a module called by the forward.

    Attributes:
        path: dotted module name (``""``: the model itself).
        activation_bytes: activation bytes held at the end of the forward by saves made in
            this module's calls (submodules included); a storage saved in several modules
            counts for the first that saved it.
        checkpoint_saves: bytes that wrapping this module alone in a non-reentrant checkpoint
            frees (may be 0, or negative when the inputs it keeps were otherwise freed).
        recompute_flops: its forward FLOPs (all calls): what the checkpoint recomputes.
        calls: how many times the forward called it.
        autocast_bytes: ``activation_bytes`` under autocast (when asked for).
        scaled_bytes: ``activation_bytes`` extrapolated to a batch k times larger (when asked).
    """

    path: str
    activation_bytes: int
    checkpoint_saves: int
    recompute_flops: int
    calls: int = 1
    autocast_bytes: int | None = None
    scaled_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    """A set of modules to checkpoint, and what it is predicted to give.

    Attributes:
        modules: module names to wrap in a non-reentrant checkpoint, none nested in another;
            an entry ``conv1..bn1..relu`` is a segment: sibling modules the forward calls one
            after the other, checkpointed as one (``ActivationReport.segments``).
        predicted: activation bytes held at the end of the forward under the plan.
        baseline: the same without any checkpoint.
        recompute_flops: forward FLOPs the backward recomputes (all calls of the modules).
        budget: the budget the plan was chosen for (None: a given set of modules).
        recompute_bytes: the most that one of its modules frees, i.e. about what the backward
            brings back at once when it recomputes that module; the backward's peak is
            about ``predicted + recompute_bytes`` (see ``ActivationReport.plan``).
        target: ``"activations"`` (``predicted`` and ``baseline`` are activation bytes at the
            end of the forward) or ``"peak"`` (they are the peaks of the whole training step,
            ``gs.step_memory``; ``plan_checkpoints(..., target="peak")``).
    """

    modules: tuple[str, ...]
    predicted: int
    baseline: int
    recompute_flops: int
    budget: int | None = None
    recompute_bytes: int = 0
    target: str = "activations"

    @property
    def saved(self) -> int:
        """Bytes the plan frees compared with no checkpoint."""
        return self.baseline - self.predicted

    def summary(self) -> str:
        segments = sum(SEGMENT in m for m in self.modules)
        single = len(self.modules) - segments
        counts = [f"{n} {word}{'s' * (n != 1)}" for n, word in
                  ((single, "module"), (segments, "segment")) if n]
        what = f"checkpoint {' and '.join(counts)}" if self.modules else "no checkpoint needed"
        budget = f" (budget {format_bytes(self.budget)})" if self.budget is not None else ""
        again = (f"; the largest module recomputed brings back about "
                 f"{format_bytes(self.recompute_bytes)} at once" if self.modules else "")
        figure = "step peak" if self.target == "peak" else "activations"
        return (f"{what}{budget}: {figure} {format_bytes(self.baseline)} -> "
                f"{format_bytes(self.predicted)} predicted, recomputing "
                f"{format_flops(self.recompute_flops)}{again}")

    def __str__(self) -> str:
        """The text of ``render()``: ``print(report)`` shows what the terminal would."""
        return str(self.render())

    def render(self, verification: Verification | None = None,
               every_block: Plan | None = None) -> Any:
        """A rich renderable: the plan, its modules, "every block" beside it, the measurement."""
        from ..output.formats import renderer

        return renderer("plan")(self, verification, every_block)

    def to_dict(self) -> dict[str, Any]:
        return {"modules": list(self.modules), "predicted": self.predicted,
                "baseline": self.baseline, "recompute_flops": self.recompute_flops,
                "budget": self.budget, "recompute_bytes": self.recompute_bytes}


@dataclass(frozen=True, slots=True)
class Verification:
    """A plan applied and measured by means independent of the plan's own counting (the
    profiler's CPU allocations, or CUDA allocator figures).

    Attributes:
        predicted / baseline: the plan's figures.
        measured: bytes allocated by the forward under the plan and still held at its end
            (outputs apart).
        measured_baseline: the same without the plan.
        method: how it was measured (``profiler`` or ``cuda``).
        budget: the plan's budget (None: none given).
        outputs_equal: the forward's outputs (the loss, with ``loss_fn``) with the plan equal
            those without, bitwise, from the same RNG state (None: not compared).
        buffers_equal: the model's buffers after a forward and backward with the plan equal
            those without (a recomputation that updates BatchNorm's running statistics a
            second time makes them differ; None: not compared).
    """

    predicted: int
    baseline: int
    measured: int
    measured_baseline: int
    method: str
    budget: int | None = None
    outputs_equal: bool | None = None
    buffers_equal: bool | None = None

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted - self.measured) / self.measured if self.measured else 0.0

    @property
    def fits(self) -> bool | None:
        return None if self.budget is None else self.measured <= self.budget

    def summary(self) -> str:
        fit = ""
        if self.budget is not None:
            fit = "; fits the budget" if self.fits else "; does NOT fit the budget"
        same = {None: "", True: "; outputs equal",
                False: "; outputs DIFFER from the model's without the plan"}[self.outputs_equal]
        bufs = {None: "", True: "", False: "; buffers DIFFER after the backward (the "
                "recomputation updated them)"}[self.buffers_equal]
        return (f"measured ({self.method}): {format_bytes(self.measured_baseline)} without the "
                f"plan, {format_bytes(self.measured)} with it; predicted "
                f"{format_bytes(self.predicted)} ({100 * self.error:+.1f}%){fit}{same}{bufs}")

    @property
    def equal(self) -> bool:
        """Neither the outputs nor the buffers were found to differ."""
        return self.outputs_equal is not False and self.buffers_equal is not False


def format_flops(n: int) -> str:
    """``1.23 GFLOP`` and the like."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6),
                        ("kFLOP", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} FLOP"
