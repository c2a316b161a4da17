"""Activation memory per module and checkpoint plans, as plain data (``gs.activation_report``,
``gs.plan_checkpoints``; the recording is in ``gradscope.capture.memplan``).

The model of what a non-reentrant ``torch.utils.checkpoint`` of a module frees, read from one
recorded forward:

- every tensor autograd saved and still holds at the end of the forward is one *save* of a
  storage, made inside a stack of module calls (the plain ``named_modules()`` names);
- a storage stays held under a plan (a set of modules, none nested in another) when at least
  one of its saves happened outside every planned module: the checkpoint replaces each save
  made inside the module with a placeholder, and saves outside it (the next op saving the
  module's output) happen as before;
- a planned module keeps the tensors it was called with (positional and keyword, the storages
  of all its calls), plus a few bytes of RNG state per call (``overhead``);
- storages that existed before the forward (parameters, buffers, the inputs) and the storages
  of the outputs handed back are never counted: they are alive without the graph.

``ActivationReport.predict(modules)`` applies that model exactly (each storage once), and the
plan search works on it (``plan``).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import BudgetError
from .nodes import format_bytes

ACTIVATION, PARAM, INPUT, OUTPUT = "activation", "param", "input", "output"


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
    """

    path: str
    cls: str
    parent: str | None
    calls: int
    inputs: tuple[str, ...]
    flops: int
    in_container: bool = False
    builtin: bool = False


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
        modules: module names to wrap in a non-reentrant checkpoint, none nested in another.
        predicted: activation bytes held at the end of the forward under the plan.
        baseline: the same without any checkpoint.
        recompute_flops: forward FLOPs the backward recomputes (all calls of the modules).
        budget: the budget the plan was chosen for (None: a given set of modules).
        recompute_bytes: the most that one of its modules frees, i.e. about what the backward
            brings back at once when it recomputes that module; the backward's peak is
            about ``predicted + recompute_bytes`` (see ``ActivationReport.plan``).
    """

    modules: tuple[str, ...]
    predicted: int
    baseline: int
    recompute_flops: int
    budget: int | None = None
    recompute_bytes: int = 0

    @property
    def saved(self) -> int:
        """Bytes the plan frees compared with no checkpoint."""
        return self.baseline - self.predicted

    def summary(self) -> str:
        what = (f"checkpoint {len(self.modules)} module{'s' * (len(self.modules) != 1)}"
                if self.modules else "no checkpoint needed")
        budget = f" (budget {format_bytes(self.budget)})" if self.budget is not None else ""
        again = (f"; the largest module recomputed brings back about "
                 f"{format_bytes(self.recompute_bytes)} at once" if self.modules else "")
        return (f"{what}{budget}: activations {format_bytes(self.baseline)} -> "
                f"{format_bytes(self.predicted)} predicted, recomputing "
                f"{format_flops(self.recompute_flops)}{again}")

    def render(self, verification: Verification | None = None,
               every_block: Plan | None = None) -> Any:
        """A rich renderable: the plan, its modules, "every block" beside it, the measurement."""
        from .formats import renderer

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
    """

    predicted: int
    baseline: int
    measured: int
    measured_baseline: int
    method: str
    budget: int | None = None

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
        return (f"measured ({self.method}): {format_bytes(self.measured_baseline)} without the "
                f"plan, {format_bytes(self.measured)} with it; predicted "
                f"{format_bytes(self.predicted)} ({100 * self.error:+.1f}%){fit}")


def format_flops(n: int) -> str:
    """``1.23 GFLOP`` and the like."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6),
                        ("kFLOP", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} FLOP"


# ====================================================================== the report
@dataclass
class ActivationReport:
    """Activation memory per module and what checkpointing each would free.

    Attributes:
        total: activation bytes held at the end of the forward (each storage once;
            parameters, buffers, inputs and outputs apart).
        rows: one ``ModuleRow`` per module the forward called, in call order.
        storages: every storage counted (and the inputs a checkpoint would keep).
        modules: per module name, what the plan search needs (``ModuleInfo``).
        overhead: bytes a checkpoint keeps per call besides its inputs (the RNG state).
        device: the device the forward ran on (``meta`` for models built without weights).
        autocast: the autocast dtype of ``autocast_bytes`` (None when not asked).
        autocast_total: ``total`` under that autocast.
        batch_scale: the factor of ``scaled_bytes`` (None when not asked).
        scaled_total: ``total`` extrapolated to that batch.
        notes: what the figures cannot see, in words.
    """

    total: int
    rows: list[ModuleRow]
    storages: list[Storage]
    modules: dict[str, ModuleInfo]
    overhead: int = 0
    device: str = "cpu"
    autocast: str | None = None
    autocast_total: int | None = None
    batch_scale: float | None = None
    scaled_total: int | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._sizes = {s.id: s.nbytes for s in self.storages}
        self._counted = {s.id for s in self.storages if s.kind == ACTIVATION}
        self._saved = [(s.id, s.nbytes, s.saves) for s in self.storages
                       if s.kind == ACTIVATION and s.saves]
        self._saves_cache: dict[str, int] = {}
        self._has_saves = {m for s in self.storages for stack in s.saves for m in stack}

    # -------------------------------------------------------------- the model
    def row(self, path: str) -> ModuleRow:
        for r in self.rows:
            if r.path == path:
                return r
        raise KeyError(path)

    def predict(self, modules: Iterable[str]) -> int:
        """Activation bytes held at the end of the forward when ``modules`` are checkpointed
        (each storage once, the inputs the checkpoints keep included)."""
        plan = set(modules)
        unknown = plan - set(self.modules)
        if unknown:
            raise BudgetError(
                f"no module {sorted(unknown)[0]!r} was called by the forward; known modules: "
                + ", ".join(repr(p) for p in list(self.modules)[:8])
            )
        _check_antichain(plan)
        held: set[str] = set()
        if not plan:
            return self.total
        for sid, _, saves in self._saved:
            if any(not plan.intersection(stack) for stack in saves):
                held.add(sid)
        calls = 0
        for path in plan:
            info = self.modules[path]
            if not self._saves_inside(path):
                continue  # nothing saved inside: the checkpoint keeps nothing alive
            calls += info.calls
            held.update(sid for sid in info.inputs if sid in self._counted)
        return sum(self._sizes[s] for s in held) + calls * self.overhead

    def _saves_inside(self, path: str) -> bool:
        return path in self._has_saves

    def checkpoint_saves(self, path: str) -> int:
        """Bytes that checkpointing ``path`` alone frees."""
        if path not in self._saves_cache:
            self._saves_cache[path] = self.total - self.predict([path])
        return self._saves_cache[path]

    def flops(self, modules: Iterable[str]) -> int:
        return sum(self.modules[p].flops for p in modules)

    def evaluate(self, modules: Iterable[str], budget: int | None = None) -> Plan:
        """The ``Plan`` of a given set of modules (none nested in another)."""
        mods = tuple(sorted(set(modules), key=self._order().__getitem__))
        again = max((self.checkpoint_saves(m) for m in mods), default=0)
        return Plan(mods, self.predict(mods), self.total, self.flops(mods), budget, again)

    def _order(self) -> dict[str, int]:
        return {p: i for i, p in enumerate(self.modules)}

    def blocks(self) -> tuple[str, ...]:
        """The modules of the usual "checkpoint every block" rule: the items of
        ``nn.ModuleList`` / ``nn.Sequential`` containers of one class of the model's own (not
        a ``torch.nn`` layer; two at least), the
        class found nearest the model's root (ties: the most frequent), outermost ones only;
        empty when the model has no repeated blocks."""
        counts: dict[str, int] = {}
        depth: dict[str, int] = {}
        for info in self.modules.values():
            if info.in_container and not info.builtin:
                counts[info.cls] = counts.get(info.cls, 0) + 1
                d = info.path.count(".")
                depth[info.cls] = min(depth.get(info.cls, d), d)
        counts = {c: n for c, n in counts.items() if n >= 2}
        if not counts:
            return ()
        best = min(counts, key=lambda c: (depth[c], -counts[c]))
        chosen = [p for p, i in self.modules.items()
                  if i.cls == best and i.in_container and not i.builtin]
        return tuple(p for p in chosen if not any(_inside(p, q) for q in chosen if q != p))

    # -------------------------------------------------------------- the search
    def plan(self, budget: int | str, *, max_recompute: int | str | None = None) -> Plan:
        """The modules to checkpoint so that at most ``budget`` bytes of activations are held
        at the end of the forward, with the least recompute (forward FLOPs; among equal
        FLOPs, the fewest modules).

        The search is a dynamic programme over the module tree: each module either is
        checkpointed (and none of its submodules), or passes the choice to its submodules; it
        keeps, per subtree, the Pareto front of (recompute, bytes freed). Bytes freed are taken
        as the sum of each module's ``checkpoint_saves``; the chosen set is then evaluated
        exactly (``predict``) and, where sharing between modules makes the sum optimistic, the
        search runs again asking for the difference.

        The model itself (path ``""``) is no candidate: checkpointing the whole forward holds
        almost nothing at its end but recomputes all of it in one go during backward, which
        brings every activation back at once. The same holds, in part, for any large module:
        the backward's peak is about ``predicted + recompute_bytes``. ``max_recompute`` (bytes,
        ``"64MiB"`` or ``"10%"`` of the baseline) keeps out modules that free more than that,
        so the plan cannot fit the end of the forward by moving the peak into the backward.

        Raises:
            BudgetError: no plan reaches the budget; the message names the smallest figure
                checkpointing can reach.
        """
        target = parse_size(budget, of=self.total)
        limit = None if max_recompute is None else parse_size(max_recompute, of=self.total)
        if target >= self.total:
            return Plan((), self.total, self.total, 0, target)
        fronts = self._fronts(limit)
        root_front = fronts[_ROOT]
        need = self.total - target
        tried: set[tuple[str, ...]] = set()
        for _ in range(12):
            chosen = _pick(root_front, need)
            if chosen is None:
                break
            mods = tuple(chosen[2])
            if mods in tried:
                break
            tried.add(mods)
            plan = self.evaluate(mods, target)
            if plan.predicted <= target:
                return plan
            need += plan.predicted - target
        best = self.smallest(limit)
        if best.predicted <= target:
            return Plan(best.modules, best.predicted, self.total, best.recompute_flops, target,
                        best.recompute_bytes)
        bound = ("" if limit is None else
                 f" with no module freeing more than {format_bytes(limit)} (max_recompute)")
        raise BudgetError(
            f"no checkpoint plan{bound} holds at most {format_bytes(target)} of activations: the "
            f"smallest reachable figure is {format_bytes(best.predicted)} (checkpointing "
            f"{_names(best.modules)}; baseline {format_bytes(self.total)}). What stays: saves "
            "made outside every module (the loss), the inputs the checkpoints keep, and the "
            "outputs; lower the batch size or give a budget of at least "
            f"{format_bytes(best.predicted)}"
        )

    def smallest(self, max_recompute: int | None = None) -> Plan:
        """The plan that holds the fewest bytes the search can find (ties: least recompute),
        among modules that free at most ``max_recompute`` bytes each (any, when None)."""
        fronts = self._fronts(max_recompute)
        candidates = [self.evaluate(p[2]) for p in fronts[_ROOT]]
        return min(candidates, key=lambda p: (p.predicted, p.recompute_flops, len(p.modules)))

    def sweep(self, points: int = 12) -> list[Plan]:
        """Plans for budgets from the baseline down to the smallest reachable figure (the
        memory-vs-recompute curve), each budget once."""
        low = min(self.smallest().predicted, self.total)
        out: list[Plan] = []
        seen: set[tuple[str, ...]] = set()
        for k in range(points):
            budget = int(self.total - (self.total - low) * k / max(points - 1, 1))
            try:
                plan = self.plan(budget)
            except BudgetError:
                continue
            if plan.modules not in seen:
                seen.add(plan.modules)
                out.append(plan)
        return out

    def _fronts(self, limit: int | None) -> dict[str, list[_Point]]:
        caches: dict[int | None, dict[str, list[_Point]]] = self.__dict__.setdefault(
            "_front_caches", {})
        if limit in caches:
            return caches[limit]
        children: dict[str, list[str]] = {p: [] for p in self.modules}
        children[_ROOT] = []
        for path, info in self.modules.items():
            parent = _ROOT if path == "" else (info.parent if info.parent in self.modules else "")
            if path == "":
                parent = _ROOT
            children[parent].append(path)
        fronts: dict[str, list[_Point]] = {}
        # post-order without recursion
        order: list[str] = []
        stack = [_ROOT]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(children[node])
        for node in reversed(order):
            front: list[_Point] = [(0, 0, ())]
            for child in children[node]:
                front = _merge(front, fronts[child])
            if node != _ROOT:
                saves = self.checkpoint_saves(node)
                if 0 < saves and node != "" and (limit is None or saves <= limit):
                    cost = self.modules[node].flops * _TIE + 1
                    front = _prune(front + [(cost, saves, (node,))])
            fronts[node] = front
        caches[limit] = fronts
        return fronts

    # -------------------------------------------------------------- output
    def to_dict(self) -> dict[str, Any]:
        return {
            "gradscope_activations": 1,
            "total": self.total,
            "device": self.device,
            "overhead": self.overhead,
            "autocast": self.autocast,
            "autocast_total": self.autocast_total,
            "batch_scale": self.batch_scale,
            "scaled_total": self.scaled_total,
            "rows": [asdict(r) for r in self.rows],
            "blocks": list(self.blocks()),
            "notes": list(self.notes),
        }

    def to_json(self, **extra: Any) -> str:
        data = self.to_dict()
        data.update(extra)
        return json.dumps(data, indent=1)

    def write_json(self, path: Any, **extra: Any) -> Any:
        """Write ``to_json(**extra)`` to ``path`` atomically; returns the path."""
        from .files import write_atomic

        return write_atomic(path, self.to_json(**extra))

    def summary(self) -> str:
        return (f"activations held at the end of the forward: {format_bytes(self.total)} "
                f"({len(self.rows)} modules, device {self.device})")

    def render(self, *, top: int = 20) -> Any:
        """A rich renderable: the per-module table ranked by what a checkpoint frees."""
        from .formats import renderer

        return renderer("activations")(self, top=top)

    def __rich__(self) -> Any:
        return self.render()

    def plot(self, path: Any, *, chosen: Plan | None = None, measured: int | None = None,
             title: str = "") -> Any:
        """Write the memory-vs-recompute curve of a budget sweep as a PNG (needs matplotlib):
        the plans' predicted bytes against their recompute FLOPs, "checkpoint every block"
        and ``chosen`` (with its ``measured`` bytes) marked. Returns the path."""
        from .formats import renderer

        return renderer("activations_plot")(self, path, chosen=chosen, measured=measured,
                                            title=title)


_ROOT = "\x00root"  # the tree's root above the model's own module ("")
_TIE = 1 << 20  # recompute cost = flops * _TIE + modules: fewer modules among equal FLOPs
_MAX_FRONT = 256

_Point = tuple[int, int, tuple[str, ...]]  # (cost, bytes freed, modules)


def _prune(points: list[_Point]) -> list[_Point]:
    """The Pareto front: for growing cost, strictly growing bytes freed; at most
    ``_MAX_FRONT`` points (thinned evenly in bytes freed, both ends kept)."""
    points.sort(key=lambda p: (p[0], -p[1]))
    front: list[_Point] = []
    for p in points:
        if not front or p[1] > front[-1][1]:
            front.append(p)
    if len(front) > _MAX_FRONT:
        top = front[-1][1] or 1
        kept: list[_Point] = []
        last_bucket = -1
        for p in front:
            bucket = p[1] * _MAX_FRONT // top
            if bucket != last_bucket:
                kept.append(p)
                last_bucket = bucket
        if kept[-1] is not front[-1]:
            kept.append(front[-1])
        front = kept
    return front


def _merge(a: list[_Point], b: list[_Point]) -> list[_Point]:
    if len(b) == 1:
        return a
    if len(a) == 1:
        return b
    return _prune([(x[0] + y[0], x[1] + y[1], x[2] + y[2]) for x in a for y in b])


def _pick(front: Sequence[_Point], need: int) -> _Point | None:
    for p in front:  # sorted by cost
        if p[1] >= need:
            return p
    return None


def _inside(path: str, outer: str) -> bool:
    return outer == "" or path.startswith(outer + ".")


def _check_antichain(plan: set[str]) -> None:
    for p in plan:
        for q in plan:
            if p != q and _inside(p, q):
                raise BudgetError(
                    f"modules {q!r} and {p!r} are nested; a plan checkpoints modules none of "
                    "which is inside another"
                )


def _names(modules: Sequence[str]) -> str:
    shown = ", ".join(repr(m) if m else "the whole model" for m in modules[:4])
    return shown + (f" and {len(modules) - 4} more" if len(modules) > 4 else "") or "nothing"
