"""An incident: where a training step went bad, as plain data (no torch).

``GradMonitor(..., replay=True)`` fills one when a logged step's gradients turn non-finite (it
replays that step's bad micro-batch under ``record_forward(check_finite=True)`` and
``record_backward``) or when the total norm jumps past the explode threshold. The record names
the origin (``phase``, ``op``, ``module``, ``line``), what the op was given (``inputs``) and the
modules whose gradient norm changed most since the last good logged step (``changes``). Under
``torch.distributed`` it also names the rank the step went bad on, from every rank's evidence
(``first_rank``; for a spike, the rank whose own loss jumped: ``spike_rank``).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

#: what went bad: gradients with NaN/Inf, or a total norm past the explode threshold
INCIDENT_KINDS = ("nonfinite", "exploding", "spike")
#: where it started: the model's forward, its backward, or outside the model (the loss made a
#: non-finite gradient before it reached the model's outputs)
PHASES = ("forward", "backward", "outside")

#: a spike whose largest example carries less than this share of the micro-batch's squared
#: gradient norm is carried by no single example
SPREAD_SHARE = 0.5


@dataclass(frozen=True)
class OpInput:
    """One tensor the op was given (or saved for its backward): ``name`` as the autograd node
    calls it (``self``, ``other``, ``result``...), its shape, dtype, smallest and largest finite
    value (None when it has none), and whether it held NaN or Inf."""

    name: str
    shape: list[int]
    dtype: str
    min: float | None
    max: float | None
    nan: bool = False
    inf: bool = False

    def describe(self) -> str:
        """``self [64, 10] float32: min 0.0, max 0.93`` (and ``, has Inf`` / ``, has NaN``)."""
        shape = "x".join(str(d) for d in self.shape) or "scalar"
        rng = (
            f"min {self.min:.4g}, max {self.max:.4g}"
            if self.min is not None and self.max is not None
            else "no finite value"
        )
        bad = "".join(
            s for s, on in ((", has NaN", self.nan), (", has Inf", self.inf)) if on
        )
        return f"{self.name} [{shape}] {self.dtype}: {rng}{bad}"


@dataclass(frozen=True)
class ModuleChange:
    """A module whose gradient norm changed: its norm at the last good logged step (None when
    there was none) and at the bad step (NaN/Inf kept as such)."""

    module: str
    good: float | None
    bad: float

    @property
    def ratio(self) -> float | None:
        """``bad / good`` (None without a good norm or when it was 0)."""
        if self.good is None or self.good == 0 or not math.isfinite(self.bad):
            return None
        return self.bad / self.good

    def describe(self) -> str:
        good = "-" if self.good is None else f"{self.good:.3g}"
        ratio = self.ratio
        grew = f" ({ratio:.3g}x)" if ratio is not None else ""
        return f"{self.module or '(model)'}: {good} -> {self.bad:.3g}{grew}"


@dataclass(frozen=True)
class SampleNorm:
    """One example of a replayed micro-batch: ``index`` (its position in the micro-batch),
    ``id`` (the data's own id when known), ``norm`` (the norm of its own gradient, scaled as
    the batch loss reduces it) and ``share`` (its squared norm over the sum of every
    example's squared norm)."""

    index: int
    norm: float
    share: float
    id: str | None = None

    def describe(self) -> str:
        who = f"sample {self.id}" if self.id is not None else f"sample {self.index}"
        return f"{who}: {self.norm:.3g} ({self.share:.0%})"


@dataclass(frozen=True)
class SampleModule:
    """A module's part of one example's gradient: its norm and its share of the example's
    squared norm."""

    module: str
    norm: float
    share: float


@dataclass
class Incident:
    """The first bad step of an event, and where it started.

    Attributes:
        step: the monitor's step number.
        kind: ``nonfinite``, ``exploding`` or ``spike``.
        phase: ``forward`` (an op's forward output first held NaN/Inf), ``backward`` (the
            forward was finite; an op's backward made the first NaN/Inf), ``outside`` (the
            gradient reaching the model's outputs was already non-finite: the loss made it),
            or None when the step could not be replayed.
        op: the autograd node (``LogBackward0``), or the aten op inside a compiled region,
            or the torch function when the op made no node; None when unknown.
        module: dotted module path whose forward ran the op ("" for the model's own forward),
            or None (outside the model, or unknown).
        line: ``file.py:NN`` of the user's code that ran the op, or None.
        code: the text of that line, or None.
        value: ``nan`` or ``inf`` (what the op made), or None.
        input: when no op made it: the tensor the forward was given that already held it
            (``the input x``, ``the input input_ids``, ``the parameter fc.weight``); ``op``,
            ``module`` and ``line`` then say which call read it first. None otherwise.
        inputs: the tensors the op was given or saved for its backward, with their ranges.
        changes: the modules whose gradient norm changed most since the last good logged step.
        micro_batch: which micro-batch of the step was replayed (0 is the first), or None.
        replayed: whether the step was replayed.
        note: one line saying why the step was not replayed or what the replay could not
            tell, or None.
        repeats: the later non-finite logged steps of the same event (each within
            ``FLAP_WINDOW`` logged steps of the one before: a gradient that flaps), counted
            here rather than made incidents of their own; ``last_step`` the last of them.
        signal, ratio, steps: a spike's signal (``grad_norm``, ``loss``, ``update``), its
            value over its baseline at the first step, and how many logged steps it lasted
            (None while it goes on; ``gradscope.monitor.spikes``).
        samples: a spike's examples of the replayed micro-batch whose own gradients are the
            largest (``SampleNorm``, largest first); ``sample_modules``: the modules where the
            top example's gradient concentrates (``SampleModule``, largest first).
        rank: under ``torch.distributed``, the rank where the step first went bad (every rank
            records the same incident); None in one process or when no rank's forward or
            loss shows it (``ranks`` says why). ``ranks``: one line per rank, what it saw
            (``first_rank``). For a spike: the rank whose own loss jumped while the others'
            did not (``spike_rank``).
    """

    step: int
    kind: str
    phase: str | None = None
    op: str | None = None
    module: str | None = None
    line: str | None = None
    code: str | None = None
    value: str | None = None
    input: str | None = None
    inputs: list[OpInput] = field(default_factory=list)
    changes: list[ModuleChange] = field(default_factory=list)
    micro_batch: int | None = None
    replayed: bool = False
    note: str | None = None
    repeats: int = 0
    last_step: int | None = None
    signal: str | None = None
    ratio: float | None = None
    steps: int | None = None
    samples: list[SampleNorm] = field(default_factory=list)
    sample_modules: list[SampleModule] = field(default_factory=list)
    rank: int | None = None
    ranks: list[str] = field(default_factory=list)

    def origin(self) -> str:
        """``LogBackward0 in head (model.py:12)``, or what is known of it."""
        if self.op is None:
            if self.module is not None:  # not replayed: the module whose output was not finite
                return f"the output of {self.module or 'the model'}"
            return "origin unknown"
        if self.module is None:
            where = " outside the model" if self.phase == "outside" else ""
        else:
            where = f" in {self.module}" if self.module else " in the model's own forward"
        at = f" ({self.line})" if self.line else ""
        return f"{self.op}{where}{at}"

    def summary(self) -> str:
        """Two to four lines a person reads first: what happened where, the code line, what
        the op was given, and which modules changed most."""
        lines = []
        if self.kind == "spike":
            return self._spike_summary()
        if self.kind == "exploding":
            head = f"step {self.step}: the gradient norm exploded"
            if self.op is not None:
                head += f"; it first left its range at {self.origin()}"
        else:
            made = self.value or "NaN/Inf"
            if self.phase == "forward" and self.input is not None:
                head = (f"step {self.step}: {self.input} already held {made} before the "
                        f"forward ran (first read by {self.origin()})")
            elif self.phase == "forward":
                head = f"step {self.step}: the forward made {made} at {self.origin()}"
            elif self.phase == "backward":
                head = f"step {self.step}: the backward made {made} at {self.origin()}"
            elif self.phase == "outside":
                head = (
                    f"step {self.step}: the gradient reaching the model's outputs was already "
                    f"{made}: the loss made it"
                )
                if self.op is not None:
                    head += f", at {self.origin()}"
            else:
                head = f"step {self.step}: non-finite gradients"
        if self.rank is not None:
            head += f" on rank {self.rank} first"
        if self.repeats:
            head += (f" (and {self.repeats} more non-finite step"
                     f"{'' if self.repeats == 1 else 's'} up to step {self.last_step})")
        lines.append(head)
        if self.code:
            lines.append(f"  {self.line}: {self.code}")
        if self.inputs:
            lines.append("  " + self.op_sentence())
        if self.changes:
            shown = "; ".join(c.describe() for c in self.changes[:3])
            lines.append(f"  gradient norms vs the last good step: {shown}")
        if self.note and len(lines) < 4:
            lines.append(f"  {self.note}")
        return "\n".join(lines[:4])

    def spike_sentence(self) -> str:
        """``spike x37 at step 1204 (the gradient norm, 3 steps): sample 13 carries 91% of
        the gradient, through layers.5.attn``."""
        what = {"grad_norm": "the gradient norm", "loss": "the loss",
                "update": "the update ratio"}.get(self.signal or "", self.signal or "?")
        lasted = "" if self.steps is None else (
            f", {self.steps} logged step{'' if self.steps == 1 else 's'}")
        ratio = "" if self.ratio is None else f" x{self.ratio:.3g}"
        head = f"spike{ratio} at step {self.step} ({what}{lasted})"
        if self.rank is not None:
            head += f" from rank {self.rank}"
        if self.samples:
            top = self.samples[0]
            who = f"sample {top.id}" if top.id is not None else f"sample {top.index}"
            mb = "" if self.micro_batch is None else f" of micro-batch {self.micro_batch}"
            if top.share < SPREAD_SHARE:  # its modules would be the batch's, not its own
                return f"{head}: no single example carries it (the largest, {who}{mb}, " \
                       f"{top.share:.0%} of the gradient)"
            head += f": {who}{mb} carries {top.share:.0%} of the gradient"
            if self.sample_modules:
                head += f", through {self.sample_modules[0].module or '(model)'}"
        return head

    def _spike_summary(self) -> str:
        lines = [self.spike_sentence()]
        if len(self.samples) > 1:
            lines.append("  largest samples: " + "; ".join(
                s.describe() for s in self.samples[:4]))
        if self.changes:
            shown = "; ".join(c.describe() for c in self.changes[:3])
            lines.append(f"  gradient norms vs the last good step: {shown}")
        if self.note:
            lines.append(f"  {self.note}")
        return "\n".join(lines[:4])

    def op_sentence(self) -> str:
        """``LogBackward0 was given self [64, 10] float32: min 0.0, max 0.93``."""
        parts = ", ".join(i.describe() for i in self.inputs[:3])
        return f"{self.op or 'the op'} was given {parts}"

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data (non-finite floats as null, as in the monitor's JSONL)."""
        d = asdict(self)
        d["changes"] = [
            {"module": c.module, "good": _finite(c.good), "bad": _finite(c.bad),
             "bad_kind": _kind(c.bad)}
            for c in self.changes
        ]
        d["inputs"] = [
            dict(asdict(i), min=_finite(i.min), max=_finite(i.max)) for i in self.inputs
        ]
        d["ratio"] = _finite(self.ratio)
        d["samples"] = [dict(asdict(x), norm=_finite(x.norm), share=_finite(x.share))
                        for x in self.samples]
        d["sample_modules"] = [dict(asdict(x), norm=_finite(x.norm), share=_finite(x.share))
                               for x in self.sample_modules]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Incident:
        """The inverse of ``to_dict``."""
        changes = [
            ModuleChange(c["module"], c["good"], _unkind(c["bad"], c.get("bad_kind")))
            for c in d.get("changes", [])
        ]
        inputs = [OpInput(**i) for i in d.get("inputs", [])]
        samples = [SampleNorm(**x) for x in d.get("samples", [])]
        modules = [SampleModule(**x) for x in d.get("sample_modules", [])]
        keep = {k: v for k, v in d.items()
                if k not in ("changes", "inputs", "samples", "sample_modules")}
        return cls(**keep, changes=changes, inputs=inputs, samples=samples,
                   sample_modules=modules)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> Incident:
        return cls.from_dict(json.loads(text))


#: a spike's rank (``spike_rank``): its own loss at least ``LOSS_JUMP`` x the median of its
#: last ``RANK_LOSS_WINDOW`` logged losses (``RANK_LOSS_MIN`` of them at least), and at least
#: ``LOSS_APART`` x the next rank's jump
LOSS_JUMP = 2.0
LOSS_APART = 1.5
RANK_LOSS_WINDOW = 8
RANK_LOSS_MIN = 3


def spike_rank(losses: Sequence[float | None], history: Sequence[Sequence[float]]
               ) -> tuple[int | None, list[str]]:
    """Which rank a spiking step came from, by each rank's own loss (``losses[r]``: this
    step's, None when not observed) against its own recent ones (``history[r]``: its last
    logged finite losses, oldest first). The gradients are reduced before they are measured,
    so a rank's share of the jump is not known; a rank's loss that jumped while the others'
    did not is its evidence. Returns (the rank, one line per rank); the rank is None when no
    rank's loss jumped apart from the others' (the last line says why)."""
    jumps: list[tuple[float, int]] = []
    lines = []
    for r, loss in enumerate(losses):
        past = [v for v in (history[r] if r < len(history) else ()) if math.isfinite(v)]
        if loss is None:
            lines.append(f"rank {r}: its loss was not observed (observe_loss)")
            continue
        base = statistics.median(past) if len(past) >= RANK_LOSS_MIN else None
        if base is None or base <= 0 or not math.isfinite(loss) or loss < 0:
            why = (f"{len(past)} earlier logged loss{'' if len(past) == 1 else 'es'}"
                   if base is None else "not comparable with its earlier ones")
            lines.append(f"rank {r}: its loss was {loss:.4g} ({why})")
            continue
        jump = loss / base
        jumps.append((jump, r))
        lines.append(f"rank {r}: its loss was {loss:.4g}, {jump:.3g}x its median of the last "
                     f"{len(past)} logged steps")
    jumps.sort(reverse=True)
    if jumps and jumps[0][0] >= LOSS_JUMP and (
            len(jumps) == 1 or jumps[0][0] >= LOSS_APART * max(jumps[1][0], 1.0)):
        return jumps[0][1], lines
    if not jumps:
        why = ("which rank needs each rank's loss (observe_loss) over a few logged steps"
               if all(loss is None for loss in losses) else
               "which rank needs a few earlier logged losses on each rank")
    else:
        why = ("no rank's own loss jumped apart from the others' (the gradients are reduced "
               "before they are measured: which rank's share is not known)")
    return None, [*lines, why]


def evidence_key(loss: float | None, first: int | None, at: int | None
                 ) -> tuple[int, int] | None:
    """How early one rank's evidence shows a non-finite step (smaller is earlier): a
    non-finite forward output by its place in the step's order of outputs, then a non-finite
    loss; None when the rank's forward and loss show nothing."""
    if first is not None:
        return 0, at if at is not None else 0
    if loss is not None and not math.isfinite(loss):
        return 1, 0
    return None


def first_rank(
    seen: Sequence[tuple[float | None, bool, int | None, int | None]], modules: Sequence[str]
) -> tuple[int | None, str | None, list[str]]:
    """Which rank a non-finite step began on, from every rank's own evidence (``seen[r]``:
    its loss, None when not observed; whether its forward outputs were watched; the index
    into ``modules`` of its first module whose output was not finite and that output's place
    in the step's order of outputs, None when all were finite). Earliest first: a non-finite
    forward output (the earlier output first, then the lower rank), then a non-finite loss
    from a finite forward (``outside``); ranks with neither got it downstream (from the
    others, through a collective or the gradients' reduction). Returns (the rank, its phase,
    one line per rank); the rank is None when no rank's forward or loss shows it (it began in
    a backward or in the reduction: which rank's is not known)."""
    keys: list[tuple[tuple[int, int, int], int, str | None]] = []
    lines = []
    watched = any(flagged or loss is not None for loss, flagged, _, _ in seen)
    for r, (loss, flagged, first, at) in enumerate(seen):
        key = evidence_key(loss, first, at)
        if first is not None and key is not None:  # (a key whenever an output was not finite)
            name = modules[first] if 0 <= first < len(modules) else f"module #{first}"
            keys.append(((*key, r), r, "forward"))
            lines.append(f"rank {r}: the forward first made NaN/Inf in {name or '(model)'}")
        elif key is not None:  # from a finite forward: the loss made it; unwatched: either
            keys.append(((*key, r), r, "outside" if flagged else None))
            lines.append(f"rank {r}: the loss was {loss}" + (
                " (the forward's outputs were finite)" if flagged else ""))
        elif loss is not None or flagged:
            lines.append(f"rank {r}: its forward and loss were finite: downstream")
        else:
            lines.append(f"rank {r}: nothing watched (activations=False, no observe_loss)")
    if not keys:
        why = ("no rank's forward or loss was non-finite: it began in a backward or in the "
               "gradients' reduction (which rank's is not known)") if watched else (
               "which rank went first needs activations=True or observe_loss")
        return None, None, [*lines, why]
    _, rank, phase = min(keys)
    return rank, phase, lines


def _finite(v: float | None) -> float | None:
    return v if v is None or math.isfinite(v) else None


def _kind(v: float) -> str | None:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return None


def _unkind(v: float | None, kind: str | None) -> float:
    if kind == "nan":
        return math.nan
    if kind == "inf":
        return math.inf
    if kind == "-inf":
        return -math.inf
    return math.nan if v is None else v


# ---------------------------------------------------------------------- alert lines
def origin_suffix(alert: Any, incidents: list[Incident]) -> str:
    """What an alert line adds about the incident of its step: ``; origin: SqrtBackward0 in
    dist (m.py:24) (backward)`` for a NaN/Inf alert, ``; grew most: ...`` for an explosion;
    "" when there is none. The alert itself stays as the rules made it (a saved log's
    alerts, replayed, are the live run's)."""
    inc = next((i for i in incidents if i.step == alert.step), None)
    if inc is None:
        return ""
    if alert.kind in ("nan", "inf", "forward_nonfinite") and inc.input is not None:
        return f"; origin: {inc.input}, which already held {inc.value} before the forward"
    if alert.kind in ("nan", "inf") and inc.kind == "nonfinite":
        if inc.op is not None:
            return f"; origin: {inc.origin()} ({inc.phase})"
        if inc.phase == "outside":
            return "; origin: the loss, outside the model (pass loss_fn= to name its op)"
        return ""
    if alert.kind == "spike" and inc.kind == "spike":
        if inc.samples:
            return "; " + inc.spike_sentence().partition(": ")[2]
        return f"; grew most: {inc.changes[0].describe()}" if inc.changes else ""
    if alert.kind == "exploding" and inc.kind == "exploding" and inc.changes:
        return f"; grew most: {inc.changes[0].describe()}"
    return ""


def alert_line(alert: Any, incidents: list[Incident]) -> str:
    """The alert's message, with the origin of its step's incident when there is one."""
    return alert.message + origin_suffix(alert, incidents)


# ---------------------------------------------------------------------- changes
def module_of(param: str) -> str:
    """The module path that owns a parameter name (``fc1.weight`` -> ``fc1``; ``w`` -> ""),
    without the ``_orig_mod`` of a ``torch.compile`` wrapper."""
    path = param.rpartition(".")[0]
    return ".".join(p for p in path.split(".") if p != "_orig_mod")


def module_norms(norms: dict[str, float], norm_type: float) -> dict[str, float]:
    """Per owning module, the p-norm of its parameters' gradient norms (model order)."""
    parts: dict[str, list[float]] = {}
    for name, v in norms.items():
        parts.setdefault(module_of(name), []).append(v)
    return {m: _pnorm(vs, norm_type) for m, vs in parts.items()}


def _pnorm(values: list[float], p: float) -> float:
    if any(math.isnan(v) for v in values):
        return math.nan
    if math.isinf(p):
        return max(values, default=0.0)
    if any(math.isinf(v) for v in values):
        return math.inf
    top = max(values, default=0.0)
    if top == 0:
        return 0.0
    return top * sum((v / top) ** p for v in values) ** (1.0 / p)


def changes(
    good: dict[str, float] | None, bad: dict[str, float], norm_type: float, top: int = 5
) -> list[ModuleChange]:
    """The modules whose gradient norm changed most from ``good`` (per-parameter norms of the
    last good logged step, or None) to ``bad``: non-finite ones first (model order), then by
    growth.

    Example:
        >>> [c.module for c in changes({"a.w": 1.0, "b.w": 1.0}, {"a.w": 2.0, "b.w": 50.0}, 2)]
        ['b', 'a']
    """
    before = module_norms(good, norm_type) if good else {}
    after = module_norms(bad, norm_type)
    rows = [ModuleChange(m, before.get(m), v) for m, v in after.items()]

    def key(c: ModuleChange) -> tuple[int, float]:
        if not math.isfinite(c.bad):
            return (0, 0.0)
        r = c.ratio
        return (1, -(r if r is not None else 0.0))

    rows.sort(key=key)  # stable: model order among the non-finite
    return rows[:top]
