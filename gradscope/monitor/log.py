"""The gradient monitor's plain records: what ``GradMonitor`` fills and the views draw.

No torch here (the model layer): every figure is a Python float or int, so a history can be
kept, compared, pickled or written out long after the tensors are gone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from ..errors import MonitorError
from ..output.envelope import dumps, envelope, float_from_json, json_float, open_document
from ..output.formats import renderer
from .incident import Incident

#: the kinds an ``Alert`` can have, most severe first
ALERT_KINDS = (
    "nan", "inf", "exploding", "spike", "dead", "vanishing", "forward_nonfinite", "leak"
)


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
    ``loss``: the step's loss (the mean of the micro-batches' losses given to
    ``GradMonitor.observe_loss``), or None.
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
    loss: float | None = None


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


#: The default "vanishing" level per element (an optimizer with a smaller ``eps`` lowers it).
VANISH = 1e-7
#: The default relative level: below this fraction of the model's median per-element size
#: (off under an adaptive optimizer: ``monitor.checks.adaptive``).
VANISH_RATIO = 1e-4


@dataclass(frozen=True)
class Thresholds:
    """When a gradient alerts: ``GradMonitor(model, thresholds=Thresholds(explode=100))`` (the
    monitor's keywords of the same names still work, one or the other); the rules are
    ``gradscope.monitor.alerts``.

    ``vanish``: a per-element size (norm / numel^(1/p)) below this for ``VANISH_PATIENCE``
    logged steps is "vanishing" (times the step's loss when it is known and below 1:
    ``alerts.vanish_floor``); ``vanish_ratio``: ... or below this fraction of the model's
    median per-element size at the same step; ``explode``: a norm above this (or
    ``SPIKE_FACTOR`` x its running median and ``SPIKE_GROWTH`` x the largest of its window)
    is "exploding". ``spike``: a total gradient norm,
    loss or update ratio above this times the median of its last ``spike_window`` logged
    values (the first ``spike_warmup`` ignored) is a "spike" (``gradscope.monitor.spikes``);
    None: no spike detection (no spike alerts, incidents or per-sample replays). ``vanish``
    None (the default of ``GradMonitor``): ``VANISH``, or the optimizer's ``eps`` when it has
    a smaller one (``monitor.checks.vanish_level``); ``vanish_ratio`` None: ``VANISH_RATIO``,
    or off under an optimizer that divides by each gradient's running size
    (``monitor.checks.adaptive``).

    Example:
        >>> th = Thresholds(explode=100.0)
        >>> th.vanish, th.resolved(1e-8).vanish, th.resolved(1e-8).explode
        (None, 1e-08, 100.0)
    """

    vanish: float | None = None
    vanish_ratio: float | None = None
    explode: float = 1e3
    spike: float | None = 10.0
    spike_window: int = 50
    spike_warmup: int = 10


    def resolved(self, vanish: float) -> Thresholds:
        """These thresholds with ``vanish`` set where it was left to the optimizer (None)."""
        return self if self.vanish is not None else replace(self, vanish=vanish)


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
    incidents: list[Incident] = field(default_factory=list)
    #: the logged steps ``append`` keeps in ``steps`` (None: all); older ones are summed up
    cap: int | None = None
    #: the alert rules ``append`` runs (``gradscope.monitor.alerts.AlertRules``); None: none
    rules: Any = field(default=None, repr=False, compare=False)
    _sink: JsonlSink | None = field(default=None, init=False, repr=False, compare=False)
    _held: list[tuple[StepStats, int, Incident | None, dict[str, int]]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    # ------------------------------------------------------------ a live log
    def append(self, st: StepStats, incident_for: Any = None, *, hold: bool = False,
               explain: Any = None) -> list[Alert]:
        """Record one logged step: keep it (the oldest beyond ``cap`` folded into
        ``dropped``), run the alert rules, ask ``incident_for(st, alerts)`` for the event it
        starts (an ``Incident`` or None), and write its line to the JSON Lines sink (``hold``:
        not before ``complete`` gives its update ratios; ``explain(step)``: a cause to note on
        an update-ratio spike, as for ``complete``). Returns the new alerts."""
        self.steps.append(st)
        new = self.rules.update(st) if self.rules is not None else []
        self.alerts.extend(new)
        incident = incident_for(st, new) if incident_for is not None else None
        if incident is not None:
            self.incidents.append(incident)
        ended = getattr(self.rules, "spike_ended", None)
        if ended is not None:  # a spike event ended here: its length
            _end_event(self.incidents, *ended, update=False)
        late: dict[str, int] = {}
        if not hold:  # its update ratios, if it has any, are known now
            incident, late = self._late(st, incident, explain)
        if self._sink is not None:
            last = self.incidents[-1] if self.incidents and incident is None else None
            extra: dict[str, int] = {}
            if last is not None and last.last_step == st.step:
                extra["repeat_of"] = last.step
            if ended is not None:  # streamed before the event's length was known
                extra["spike_of"], extra["spike_steps"] = ended
            self._held.append((st, len(self.alerts), incident, extra | late))
            if not hold:
                self._flush()
        self._trim()
        return new

    def add_alert(self, alert: Alert) -> None:
        """An alert that comes from outside the statistics (a leak): in the next step's line."""
        self.alerts.append(alert)

    def complete(self, step: int, ratios: dict[str, float], explain: Any = None) -> None:
        """Give the update ratios of logged step ``step`` (measured after its record), and
        judge them (``AlertRules.late``): their alerts and incident go in that step's line.
        ``explain(step)``: a likelier cause to put first in an update-ratio spike's note (the
        monitor's learning-rate jump), or None."""
        done = None
        for k in range(len(self.steps) - 1, -1, -1):
            st = self.steps[k]
            if st.step == step:
                done = self.steps[k] = _with_ratios(st, ratios)
                break
        held = [(_with_ratios(h, ratios) if h.step == step else h, n, inc, extra)
                for h, n, inc, extra in self._held]
        mine = next((k for k, (h, *_) in enumerate(held) if h.step == step), None)
        if done is None and mine is not None:
            done = held[mine][0]
        if done is not None:
            incident, late = self._late(done, None if mine is None else held[mine][2], explain)
            if mine is not None:  # the step's line, still held, carries what they gave
                h, _, _, extra = held[mine]
                held[mine] = (h, len(self.alerts), incident, extra | late)
        self._held = held
        self._flush()

    def _late(self, st: StepStats, incident: Incident | None,
              explain: Any) -> tuple[Incident | None, dict[str, int]]:
        """Run the rules on ``st``'s update ratios (``AlertRules.late``); returns the incident
        of ``st``'s line (``incident``, or the update-ratio spike's when it has none) and what
        the line adds when an update-ratio event ended at ``st`` (``update_spike_of``)."""
        rules = self.rules
        if rules is None:
            return incident, {}
        self.alerts.extend(rules.late(st))
        started = rules.update_started
        if started is not None:
            note = ("no per-sample norms: the update ratio is measured after optimizer.step(), "
                    "when the parameters have changed")
            cause = explain(st.step) if explain is not None else None
            spike = Incident(step=st.step, kind="spike", signal="update", ratio=started.ratio,
                             note=f"{cause}; {note}" if cause else note)
            self.incidents.append(spike)
            incident = incident or spike
        ended = rules.update_ended
        if ended is None:
            return incident, {}
        _end_event(self.incidents, *ended, update=True)
        return incident, {"update_spike_of": ended[0], "update_spike_steps": ended[1]}

    def rewatch(self, names: list[str], numels: dict[str, int]) -> None:
        """The monitor watches other parameters from now on."""
        self.names = list(names)
        self.numels = dict(numels)
        if self.rules is not None:
            self.rules.recount(self.numels)

    def stream_to(self, path: str | Path) -> None:
        """Write each logged step to the JSON Lines file ``path`` as it is recorded (the file
        is replaced; ``read_jsonl`` reads it back)."""
        self._sink = JsonlSink(path)

    def close(self) -> None:
        """Write what is held and close the sink (idempotent)."""
        if self._sink is not None:
            self._flush()
            self._sink.close()

    def _flush(self) -> None:
        sink = self._sink
        if sink is None or sink.closed:
            self._held = []
            return
        for st, n_alerts, incident, extra in self._held:
            obj = step_record(st, self.alerts[sink.alerts_written : n_alerts], incident)
            obj.update(extra)  # repeat_of, spike_of: streamed before the event's end
            sink.alerts_written = n_alerts
            sink.write(first_record(obj, self) if sink.lines == 0 else obj)
        self._held = []

    def _trim(self) -> None:
        steps, cap = self.steps, self.cap
        if cap is not None and len(steps) > cap:
            for old in steps[: len(steps) - cap]:
                self.dropped.add(old)
            del steps[: len(steps) - cap]

    # ------------------------------------------------------------ views
    def report(self, *, width: int = 24) -> Any:
        """A rich renderable (``GradMonitor.report``), live or read back with ``read_jsonl``."""
        return renderer("monitor_report")(self, width=width)

    def to_jsonl(self, path: str | Path) -> Path:
        """Write one JSON object per logged step (``read_jsonl`` reads it back)."""
        return renderer("monitor_jsonl")(self, Path(path))

    def to_json(self, path: str | Path) -> Path:
        """Write the log as one JSON document: the records of ``to_jsonl`` under ``"steps"``
        (``read_jsonl`` reads it back)."""
        return renderer("monitor_json")(self, Path(path))

    def to_csv(self, path: str | Path) -> Path:
        """Write one CSV row per (logged step, parameter)."""
        return renderer("monitor_csv")(self, Path(path))


def _end_event(incidents: list[Incident], first: int, steps: int, *, update: bool,
               any_signal: bool = False) -> bool:
    """A spike event that started at logged step ``first`` lasted ``steps``: set its
    incident's ``steps`` (the update-ratio signal's event if ``update``, else the other
    signals'; ``any_signal``: either). Returns whether one was found."""
    for i in reversed(incidents):
        if i.kind == "spike" and i.step == first and (any_signal
                                                      or (i.signal == "update") == update):
            i.steps = steps
            return True
    return False


def _with_ratios(st: StepStats, ratios: dict[str, float]) -> StepStats:
    params = {
        n: replace(ps, update_ratio=ratios[n]) if n in ratios else ps
        for n, ps in st.params.items()
    }
    return replace(st, params=params)


class JsonlSink:
    """A JSON Lines file written one flushed line at a time (a live monitor's ``jsonl=``)."""

    def __init__(self, path: str | Path) -> None:
        target = Path(path)
        try:
            self._file = open(target, "w", encoding="utf-8")  # noqa: SIM115 - close()
        except OSError as exc:
            raise MonitorError(
                f"jsonl={str(target)!r} cannot be written: {exc.strerror}"
            ) from None
        self.lines = 0
        self.alerts_written = 0

    @property
    def closed(self) -> bool:
        return self._file.closed

    def write(self, obj: dict[str, Any]) -> None:
        self._file.write(dumps(obj, indent=None) + "\n")
        self._file.flush()
        self.lines += 1

    def close(self) -> None:
        self._file.close()


# ---------------------------------------------------------------- JSON Lines, both ways
#: the fields of a ParamStats in a JSON Lines record (non-finite floats as "nan", "inf",
#: "-inf": the envelope's one encoding; a log written before it has null there, beside a
#: ``"nonfinite"`` map that says which)
STAT_FIELDS = tuple(f.name for f in fields(ParamStats))
#: the counts; every other field is a float (or None)
_COUNT_FIELDS = ("nan", "inf")
_FLOAT_FIELDS = tuple(f for f in STAT_FIELDS if f not in _COUNT_FIELDS)


def _json_or_none(v: float | None) -> float | str | None:
    return None if v is None else json_float(v)


def _stats_dict(ps: ParamStats) -> dict[str, Any]:
    """The fields of ``STAT_FIELDS``, NaN and infinities as their strings."""
    d = ps.__dict__
    return {f: d[f] if f in _COUNT_FIELDS else _json_or_none(d[f]) for f in STAT_FIELDS}


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


def step_record(
    st: StepStats, alerts: list[Alert], incident: Incident | None = None
) -> dict[str, Any]:
    """One logged step as a JSON object (one line of the JSON Lines log); ``incident``: the
    event this step starts, if any."""
    obj: dict[str, Any] = {
        "step": st.step,
        "total_norm": json_float(st.total_norm),
        "full": st.full,
        "skipped": st.skipped,
        "scope": st.scope,
        "measured_at": st.measured_at,
        "forward_nonfinite": st.forward_nonfinite,
        "loss": _json_or_none(st.loss),
        "params": {n: _stats_dict(ps) for n, ps in st.params.items()},
        "modules": {n: _stats_dict(ps) for n, ps in st.modules.items()},
        "alerts": [alert_dict(a) for a in alerts],
    }
    if incident is not None:  # only on a step that has one
        obj["incident"] = incident.to_dict()
    return obj


def first_record(obj: dict[str, Any], log: MonitorLog) -> dict[str, Any]:
    """The first line of a JSON Lines log: the envelope (``{"gradscope": 2, "kind":
    "monitor"}``), the first logged step, and under ``"log"`` what reading it back needs."""
    return envelope("monitor", {**obj, "log": log_header(log)})


def _float(v: Any) -> float:
    return math.nan if v is None else float_from_json(v)


#: how a log written before the envelope said which null figure was not finite
_LEGACY_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def _stats_from(d: dict[str, Any]) -> ParamStats:
    values: dict[str, Any] = {
        f: None if d.get(f) is None else float_from_json(d[f]) for f in _FLOAT_FIELDS
    }
    for f, kind in (d.get("nonfinite") or {}).items():  # a log written before the envelope
        if f in values and kind in _LEGACY_NONFINITE:
            values[f] = _LEGACY_NONFINITE[kind]
    values["norm"] = _float(values["norm"])
    return ParamStats(nan=d.get("nan"), inf=d.get("inf"), **values)


def _not_a_record(path: str | Path, where: str | int, exc: Exception) -> MonitorError:
    at = f"line {where}" if isinstance(where, int) else where
    return MonitorError(
        f"{path}: {at} is not a gradscope monitor record ({exc}); give a file written by "
        "GradMonitor.to_jsonl, GradMonitor.to_json or GradMonitor(jsonl=...)"
    )


def _records(f: Any, path: str | Path) -> Iterator[tuple[str | int, dict[str, Any]]]:
    """The step records of a monitor log, with where each is (a line number, or the
    ``steps[k]`` of a one-document log): the lines of JSON Lines, or the ``"steps"`` of one
    document (``to_json``), whose header is given to the first record as its ``"log"``."""
    first, number = "", 0
    for number, line in enumerate(f, 1):  # noqa: B007 (used after the loop)
        if line.strip():
            first = line
            break
    if not first:
        return
    try:
        obj = json.loads(first)
    except ValueError as exc:  # not one record per line: one document over several lines
        try:
            obj = json.loads(first + f.read())
        except ValueError:
            raise _not_a_record(path, number, exc) from None
        if not isinstance(obj, dict) or "steps" not in obj:
            raise _not_a_record(path, number, exc) from None
    if isinstance(obj, dict) and isinstance(obj.get("steps"), list):
        open_document(obj, "monitor")
        steps = obj["steps"]
        for k, rec in enumerate(steps):
            if not isinstance(rec, dict):
                raise _not_a_record(path, f"steps[{k}]", TypeError("not an object"))
            yield f"steps[{k}]", ({**rec, "log": obj.get("log", {})} if k == 0 else rec)
        return
    if not isinstance(obj, dict):
        raise _not_a_record(path, number, TypeError("not an object"))
    yield number, obj
    for at, line in enumerate(f, number + 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise _not_a_record(path, at, exc) from None
        if not isinstance(rec, dict):
            raise _not_a_record(path, at, TypeError("not an object"))
        yield at, rec


def read_jsonl(path: str | Path) -> MonitorLog:
    """A ``MonitorLog`` read back from a JSON Lines file that ``GradMonitor.to_jsonl`` (or
    ``jsonl=``) wrote, from the one document ``GradMonitor.to_json`` wrote, or from a log
    written before the envelope. Non-finite figures come back as
    they were (``"nan"``, ``"inf"``, ``"-inf"``; an older log's nulls as its ``"nonfinite"``
    map says, or NaN)."""
    steps: list[StepStats] = []
    alerts: list[Alert] = []
    incidents: list[Incident] = []
    header: dict[str, Any] = {}
    with open(path, encoding="utf-8") as f:
        for number, obj in _records(f, path):
            try:
                if "kind" in obj or "gradscope" in obj:
                    open_document(obj, "monitor")
                header = obj.get("log", header)
                st = StepStats(
                    step=int(obj["step"]),
                    total_norm=_LEGACY_NONFINITE.get(
                        str((obj.get("nonfinite") or {}).get("total_norm")),
                        _float(obj.get("total_norm")),
                    ),
                    params={n: _stats_from(d) for n, d in obj.get("params", {}).items()},
                    modules={n: _stats_from(d) for n, d in obj.get("modules", {}).items()},
                    full=bool(obj.get("full", True)),
                    skipped=bool(obj.get("skipped", False)),
                    scope=obj.get("scope"),
                    measured_at=obj.get("measured_at", "backward"),
                    forward_nonfinite=obj.get("forward_nonfinite"),
                    loss=None if obj.get("loss") is None else float_from_json(obj["loss"]),
                )
                alerts.extend(
                    Alert(a["kind"], st.step, a["name"], a["message"], a.get("count", 1),
                          tuple(a.get("names", ())))
                    for a in obj.get("alerts", ())
                )
                if obj.get("incident") is not None:
                    incidents.append(Incident.from_dict(obj["incident"]))
                repeat = obj.get("repeat_of")
                if repeat is not None:  # a later bad step of a streamed event
                    inc = next((i for i in reversed(incidents) if i.step == int(repeat)), None)
                    if inc is not None:
                        inc.repeats += 1
                        inc.last_step = st.step
                for key, update in (("spike_of", False), ("update_spike_of", True)):
                    of = obj.get(key)
                    if of is None:
                        continue  # a streamed spike event ended here: its length
                    first, length = int(of), int(obj[key.replace("_of", "_steps")])
                    # an update-ratio event's own key; "spike_of" names the other signals'
                    # (in a log of before update events had theirs, any spike of that step)
                    if not _end_event(incidents, first, length, update=update) and not update:
                        _end_event(incidents, first, length, update=False, any_signal=True)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise _not_a_record(path, number, exc) from None
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
        incidents=incidents,
    )
