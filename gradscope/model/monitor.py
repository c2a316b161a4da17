"""The gradient monitor's plain records: what ``GradMonitor`` fills and the views draw.

No torch here (the model layer): every figure is a Python float or int, so a history can be
kept, compared, pickled or written out long after the tensors are gone.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MonitorError

#: the kinds an ``Alert`` can have, most severe first
ALERT_KINDS = ("nan", "inf", "exploding", "dead", "vanishing", "forward_nonfinite", "leak")


@dataclass(frozen=True)
class ParamStats:
    """Gradient statistics of one parameter (or one module's gradient output) at one step.

    ``norm`` uses the monitor's ``norm_type``. ``max_abs``, ``mean_abs`` and ``zero_frac`` are
    None on a step without full statistics. ``nan`` and ``inf`` are exact counts (0 when the
    norm is finite); None only when the gradient held non-finite values but was changed (e.g.
    clipped) before they could be counted. ``update_ratio`` is ``||w_new - w_old|| / ||w_old||``
    of the optimizer step, from a sample of the weights (exact for tensors of at most
    ``update_sample`` elements); None without ``optimizer=``, on steps without full
    statistics, and for module statistics.
    """

    norm: float
    max_abs: float | None
    mean_abs: float | None
    nan: int | None
    inf: int | None
    zero_frac: float | None
    update_ratio: float | None = None


@dataclass(frozen=True)
class StepStats:
    """One logged step: the total norm (as ``torch.nn.utils.get_total_norm``) and per-parameter
    statistics in model order; ``modules``: gradient-output statistics (with ``modules=True``).

    ``full``: the step has full statistics. ``skipped``: the GradScaler skipped the optimizer
    step (non-finite gradients). ``scope``: None without ``torch.distributed``; ``"global"``
    when every rank reports the same global figures; ``"rank N"`` when they are this rank's own.
    ``measured_at``: ``"backward"`` (as the last backward left them) or ``"optimizer"`` (at
    ``optimizer.step()``). ``forward_nonfinite``: with ``activations=True``, the module whose
    output was the step's first non-finite forward value (None when all were finite).
    """

    step: int
    total_norm: float
    params: dict[str, ParamStats]
    modules: dict[str, ParamStats] = field(default_factory=dict)
    full: bool = True
    skipped: bool = False
    scope: str | None = None
    measured_at: str = "backward"
    forward_nonfinite: str | None = None


@dataclass(frozen=True)
class Alert:
    """Something worth a look: ``kind`` is one of nan, inf, dead, vanishing, exploding,
    forward_nonfinite, leak; ``name`` the (first) parameter, module, or for a leak the step
    whose graph is still alive; ``step`` the step it was seen at. One event gives one alert:
    ``names`` lists every parameter it concerns (``count`` of them)."""

    kind: str
    step: int
    name: str
    message: str
    count: int = 1
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.names:  # a single-subject alert concerns its name
            object.__setattr__(self, "names", (self.name,))


@dataclass(frozen=True)
class Thresholds:
    """When a gradient alerts (``GradMonitor``'s arguments of the same names; the rules are
    ``gradscope.model.alerts``).

    ``vanish``: a per-element size (norm / numel^(1/p)) below this for ``VANISH_PATIENCE``
    logged steps is "vanishing"; ``vanish_ratio``: ... or below this fraction of the model's
    median per-element size at the same step; ``explode``: a norm above this (or
    ``SPIKE_FACTOR`` x its running median) is "exploding"."""

    vanish: float = 1e-7
    vanish_ratio: float = 1e-4
    explode: float = 1e3


@dataclass
class DroppedSummary:
    """What the logged steps that a bounded history dropped held: how many, from which step to
    which, the largest finite total norm, the steps whose gradients were not finite or that
    the GradScaler skipped, and per parameter the largest finite norm and how many steps had a
    NaN (``nan``) or an infinity (``inf``) in its gradient."""

    steps: int = 0
    first_step: int | None = None
    last_step: int | None = None
    max_total_norm: float | None = None
    nonfinite_steps: int = 0
    skipped_steps: int = 0
    max_norm: dict[str, float] = field(default_factory=dict)
    nan: dict[str, int] = field(default_factory=dict)
    inf: dict[str, int] = field(default_factory=dict)

    def add(self, st: StepStats) -> None:
        """Fold one dropped step in (constant memory per parameter)."""
        self.steps += 1
        if self.first_step is None:
            self.first_step = st.step
        self.last_step = st.step
        if st.skipped:
            self.skipped_steps += 1
            return
        total = st.total_norm
        if total == total and total not in (math.inf, -math.inf):
            if self.max_total_norm is None or total > self.max_total_norm:
                self.max_total_norm = total
        else:
            self.nonfinite_steps += 1
        top = self.max_norm
        for name, ps in st.params.items():
            norm = ps.norm
            if norm == norm and norm != math.inf:
                if norm > top.get(name, -1.0):
                    top[name] = norm
            else:
                kind = nonfinite_kind(ps)
                counts = self.nan if kind == "nan" else self.inf
                counts[name] = counts.get(name, 0) + 1


def nonfinite_kind(ps: ParamStats) -> str | None:
    """"nan" when the gradient held a NaN, else "inf" when it held an infinity, else None (from
    the exact counts; from the norm when they could not be taken)."""
    if ps.nan or (ps.nan is None and ps.norm != ps.norm):
        return "nan"
    if ps.inf or (ps.inf is None and ps.norm in (math.inf, -math.inf)):
        return "inf"
    return None


@dataclass
class MonitorLog:
    """What a monitor recorded, as plain data (what the views take).

    ``numels``: each parameter's element count (what the alert rules compare norms by);
    ``thresholds``: the monitor's alert thresholds. ``dropped``: what the logged steps no longer
    in ``steps`` held (the monitor keeps the last ``history=`` of them)."""

    names: list[str]
    every: int
    full_every: int
    norm_type: float
    steps: list[StepStats]
    alerts: list[Alert]
    distributed: str | None = None
    numels: dict[str, int] = field(default_factory=dict)
    thresholds: Thresholds = field(default_factory=Thresholds)
    dropped: DroppedSummary = field(default_factory=DroppedSummary)


# ---------------------------------------------------------------- JSON Lines, both ways
#: the fields of a ParamStats in a JSON Lines record (non-finite floats written as null)
STAT_FIELDS = ("norm", "max_abs", "mean_abs", "nan", "inf", "zero_frac", "update_ratio")


def _finite_or_none(v: float | None) -> float | None:
    return v if v is None or math.isfinite(v) else None


def _stats_dict(ps: ParamStats) -> dict[str, Any]:
    d = ps.__dict__
    return {
        f: d[f] if f in ("nan", "inf") else _finite_or_none(d[f]) for f in STAT_FIELDS
    }


def alert_dict(a: Alert) -> dict[str, Any]:
    return {"kind": a.kind, "name": a.name, "message": a.message, "count": a.count,
            "names": list(a.names)}


def log_header(log: MonitorLog) -> dict[str, Any]:
    """What the first line of a JSON Lines log carries under ``"log"``: enough to read the
    steps back into a ``MonitorLog`` and replay the alert rules over it."""
    return {
        "names": list(log.names),
        "every": log.every,
        "full_every": log.full_every,
        "norm_type": log.norm_type if math.isfinite(log.norm_type) else "inf",
        "numels": dict(log.numels),
        "thresholds": asdict(log.thresholds),
        "distributed": log.distributed,
        "dropped": log.dropped.steps,
    }


def step_record(st: StepStats, alerts: list[Alert]) -> dict[str, Any]:
    """One logged step as a JSON object (one line of the JSON Lines log)."""
    return {
        "step": st.step,
        "total_norm": _finite_or_none(st.total_norm),
        "full": st.full,
        "skipped": st.skipped,
        "scope": st.scope,
        "measured_at": st.measured_at,
        "forward_nonfinite": st.forward_nonfinite,
        "params": {n: _stats_dict(ps) for n, ps in st.params.items()},
        "modules": {n: _stats_dict(ps) for n, ps in st.modules.items()},
        "alerts": [alert_dict(a) for a in alerts],
    }


def _float(v: Any) -> float:
    return math.nan if v is None else float(v)


def _stats_from(d: dict[str, Any]) -> ParamStats:
    opt = {f: d.get(f) for f in ("max_abs", "mean_abs", "zero_frac", "update_ratio")}
    return ParamStats(norm=_float(d.get("norm")), nan=d.get("nan"), inf=d.get("inf"), **opt)


def read_jsonl(path: str | Path) -> MonitorLog:
    """A ``MonitorLog`` read back from a JSON Lines file that ``GradMonitor.to_jsonl`` (or
    ``jsonl=``) wrote. Non-finite figures, written as null, come back as NaN (their NaN and
    Inf counts are exact)."""
    steps: list[StepStats] = []
    alerts: list[Alert] = []
    header: dict[str, Any] = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                header = obj.get("log", header)
                st = StepStats(
                    step=int(obj["step"]),
                    total_norm=_float(obj.get("total_norm")),
                    params={n: _stats_from(d) for n, d in obj.get("params", {}).items()},
                    modules={n: _stats_from(d) for n, d in obj.get("modules", {}).items()},
                    full=bool(obj.get("full", True)),
                    skipped=bool(obj.get("skipped", False)),
                    scope=obj.get("scope"),
                    measured_at=obj.get("measured_at", "backward"),
                    forward_nonfinite=obj.get("forward_nonfinite"),
                )
                alerts.extend(
                    Alert(a["kind"], st.step, a["name"], a["message"], a.get("count", 1),
                          tuple(a.get("names", ())))
                    for a in obj.get("alerts", ())
                )
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise MonitorError(
                    f"{path}: line {number} is not a gradscope monitor record ({exc}); give a "
                    "file written by GradMonitor.to_jsonl or GradMonitor(jsonl=...)"
                ) from None
            steps.append(st)
    names = header.get("names") or list(dict.fromkeys(n for st in steps for n in st.params))
    norm_type = header.get("norm_type", 2.0)
    dropped = DroppedSummary(steps=int(header.get("dropped", 0)))
    return MonitorLog(
        names=names,
        every=int(header.get("every", 1)),
        full_every=int(header.get("full_every", 1)),
        norm_type=math.inf if norm_type == "inf" else float(norm_type),
        steps=steps,
        alerts=alerts,
        distributed=header.get("distributed"),
        numels={str(k): int(v) for k, v in header.get("numels", {}).items()},
        thresholds=Thresholds(**header.get("thresholds", {})),
        dropped=dropped,
    )
