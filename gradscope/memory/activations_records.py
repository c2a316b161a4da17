"""Activation memory per module and checkpoint plans, as plain data (``gs.activation_report``,
``gs.plan_checkpoints``; the recording is in ``gradscope.memory.activations``).

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

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import BudgetError
from ..graph.nodes import format_bytes, plural
from ..output.envelope import dumps, envelope, write_json
from .activations_types import (
    ACTIVATION,
    INPUT,
    OUTPUT,
    PARAM,
    SEGMENT,
    ModuleInfo,
    ModuleRow,
    Plan,
    Storage,
    Verification,
    format_flops,
    parse_size,
)

LONGEST_SEGMENT = 16  # modules in a segment the search tries, at most

__all__ = ["ACTIVATION", "INPUT", "OUTPUT", "PARAM", "SEGMENT", "ActivationReport", "BudgetError",
           "ModuleInfo", "ModuleRow", "Plan", "Storage", "Verification", "format_flops",
           "parse_size"]


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
        (each storage once, the inputs the checkpoints keep included). An entry is a module
        name or a segment (``conv1..bn1..relu``, see ``segments``)."""
        units = self._units(modules)
        if not units:
            return self.total
        covered = {m for members in units.values() for m in members}
        held: set[str] = set()
        for sid, _, saves in self._saved:
            if any(covered.isdisjoint(stack) for stack in saves):
                held.add(sid)
        calls = 0
        for members in units.values():
            if not any(self._saves_inside(m) for m in members):
                continue  # nothing saved inside: the checkpoint keeps nothing alive
            first = self.modules[members[0]]
            calls += first.calls
            held.update(sid for sid in first.inputs if sid in self._counted)
        return sum(self._sizes[s] for s in held) + calls * self.overhead

    def members(self, unit: str) -> tuple[str, ...]:
        """The modules of a plan entry: ``(unit,)`` for a module name; for a segment
        ``first..b..c`` the sibling modules ``first``, ``<parent>.b``, ``<parent>.c``, which the
        forward called one after the other, each handing its output straight to the next.

        Raises:
            BudgetError: no such module, or the names are not such a chain.
        """
        names = segment_paths(unit)
        for name in names:
            if name not in self.modules:
                raise BudgetError(
                    f"no module {name!r} was called by the forward; known modules: "
                    + ", ".join(repr(p) for p in list(self.modules)[:8])
                )
        for a, b in zip(names, names[1:]):
            if self.modules[a].chain_next != b:
                raise BudgetError(
                    f"{unit!r} is no segment: the forward did not hand {a!r}'s output straight "
                    f"to {b!r} and nothing else (segments: ActivationReport.segments())"
                )
        return names

    def segments(self, longest: int = LONGEST_SEGMENT) -> list[str]:
        """Every run of 2 to ``longest`` sibling modules that can be checkpointed as one: each
        called once, one right after the other, each call's only argument the previous one's
        only output, which nothing else in the graph used; the first does not change its input
        in place. A segment frees what the run saves
        inside and keeps only the first module's inputs, where checkpointing its modules one
        by one would keep each of their inputs (a stem's ``conv1..bn1..relu..maxpool``)."""
        out: list[str] = []
        for path, info in self.modules.items():
            if info.mutates_input:
                continue  # see ModuleInfo.mutates_input
            run = [path]
            nxt = info.chain_next
            while nxt is not None and len(run) < longest:
                run.append(nxt)
                out.append(segment_name(run))
                nxt = self.modules[nxt].chain_next
        return out

    def _saves_inside(self, path: str) -> bool:
        return path in self._has_saves

    def _units(self, modules: Iterable[str]) -> dict[str, tuple[str, ...]]:
        units = {u: self.members(u) for u in dict.fromkeys(modules)}
        _check_antichain([m for members in units.values() for m in members])
        return units

    def checkpoint_saves(self, path: str) -> int:
        """Bytes that checkpointing ``path`` alone frees."""
        if path not in self._saves_cache:
            self._saves_cache[path] = self.total - self.predict([path])
        return self._saves_cache[path]

    def flops(self, modules: Iterable[str]) -> int:
        return sum(self.modules[m].flops for u in modules for m in self.members(u))

    def evaluate(self, modules: Iterable[str], budget: int | None = None) -> Plan:
        """The ``Plan`` of a given set of modules (none nested in another)."""
        order = self._order()
        mods = tuple(sorted(set(modules), key=lambda u: order[self.members(u)[0]]))
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
            # the nearest recorded ancestor: a container never called (a ModuleList, as
            # transformers' ``h`` / ``layers``) has no row, its children belong to the module
            # above it (not to the model: checkpointing both would nest)
            parent = info.parent
            while parent and parent not in self.modules:
                parent = parent.rpartition(".")[0]
            children[_ROOT if path == "" else (parent or "")].append(path)
        fronts: dict[str, list[_Point]] = {}
        # post-order without recursion
        order: list[str] = []
        stack = [_ROOT]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(children[node])
        for node in reversed(order):
            front = self._children_front(node, children[node], fronts, limit)
            if node != _ROOT and not self.modules[node].mutates_input:
                saves = self.checkpoint_saves(node)
                if 0 < saves and node != "" and (limit is None or saves <= limit):
                    cost = self.modules[node].flops * _TIE + 1
                    front = _prune(front + [(cost, saves, (node,))])
            fronts[node] = front
        caches[limit] = fronts
        return fronts

    def _children_front(self, node: str, kids: list[str], fronts: dict[str, list[_Point]],
                        limit: int | None) -> list[_Point]:
        """The front of a module's children, in call order: each child passes on its own
        front, or a run of children ending at it is checkpointed as one segment (not all of
        them, where checkpointing the module itself does the same or more)."""
        whole = node not in (_ROOT, "")
        prefix: list[list[_Point]] = [[(0, 0, ())]]  # prefix[j]: the front of kids[:j]
        for j, kid in enumerate(kids):
            front = _merge(prefix[j], fronts[kid])
            extra: list[_Point] = []
            i = j
            while (i > 0 and j - i + 1 < LONGEST_SEGMENT
                   and self.modules[kids[i - 1]].chain_next == kids[i]):
                i -= 1
                if whole and i == 0 and j == len(kids) - 1:
                    break
                if self.modules[kids[i]].mutates_input:
                    continue  # the checkpoint would keep an input the run then changes
                seg = segment_name(kids[i:j + 1])
                saves = self.checkpoint_saves(seg)
                if 0 < saves and (limit is None or saves <= limit):
                    cost = self.flops([seg]) * _TIE + 1
                    extra.extend((p[0] + cost, p[1] + saves, p[2] + (seg,)) for p in prefix[i])
            prefix.append(_prune(front + extra) if extra else front)
        return prefix[-1]

    # -------------------------------------------------------------- output
    def to_dict(self) -> dict[str, Any]:
        return envelope("activations", {
            "total": self.total,
            "device": self.device,
            "overhead": self.overhead,
            "autocast": self.autocast,
            "autocast_total": self.autocast_total,
            "batch_scale": self.batch_scale,
            "scaled_total": self.scaled_total,
            "rows": [asdict(r) for r in self.rows],
            "blocks": list(self.blocks()),
            "segments": self.segments(),
            "in_place": [p for p, i in self.modules.items() if i.mutates_input],
            "notes": list(self.notes),
        })

    def to_json(self, **extra: Any) -> str:
        return dumps({**self.to_dict(), **extra})

    def write_json(self, path: Any, **extra: Any) -> Any:
        """Write ``to_json(**extra)`` to ``path`` atomically; returns the path."""
        return write_json(path, {**self.to_dict(), **extra})

    def summary(self) -> str:
        return (f"activations held at the end of the forward: {format_bytes(self.total)} "
                f"({plural(len(self.rows), 'module')}, device {self.device})")

    def __str__(self) -> str:
        """The text of ``render()``: ``print(report)`` shows what the terminal would."""
        return str(self.render())

    def render(self, *, top: int = 20) -> Any:
        """A rich renderable: the per-module table ranked by what a checkpoint frees."""
        from ..output.formats import renderer

        return renderer("activations")(self, top=top)

    def __rich__(self) -> Any:
        return self.render()

    def plot(self, path: Any, *, chosen: Plan | None = None, measured: int | None = None,
             title: str = "") -> Any:
        """Write the memory-vs-recompute curve of a budget sweep as a PNG (needs matplotlib):
        the plans' predicted bytes against their recompute FLOPs, "checkpoint every block"
        and ``chosen`` (with its ``measured`` bytes) marked. Returns the path."""
        from ..output.formats import renderer

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


def _check_antichain(plan: list[str]) -> None:
    if len(set(plan)) != len(plan):
        twice = next(p for p in plan if plan.count(p) > 1)
        raise BudgetError(f"module {twice!r} is in the plan twice (alone or in a segment)")
    for p in plan:
        for q in plan:
            if p != q and _inside(p, q):
                raise BudgetError(
                    f"modules {q!r} and {p!r} are nested; a plan checkpoints modules none of "
                    "which is inside another"
                )


def segment_paths(unit: str) -> tuple[str, ...]:
    """The module names of a plan entry: ``("layer1.0.conv1", "layer1.0.bn1")`` for
    ``layer1.0.conv1..bn1``; ``(unit,)`` for a module name."""
    parts = unit.split(SEGMENT)
    parent = parts[0].rpartition(".")[0]
    return (parts[0], *(f"{parent}.{p}" if parent else p for p in parts[1:]))


def segment_name(members: Sequence[str]) -> str:
    """``conv1..bn1..relu`` for the sibling modules ``conv1``, ``bn1``, ``relu`` (a segment
    of ``layer1.0``'s children is ``layer1.0.conv1..bn1``); a single module is its name."""
    return SEGMENT.join([members[0], *(m.rpartition(".")[2] for m in members[1:])])


def _names(modules: Sequence[str]) -> str:
    shown = ", ".join(repr(m) if m else "the whole model" for m in modules[:4])
    return shown + (f" and {len(modules) - 4} more" if len(modules) > 4 else "") or "nothing"
