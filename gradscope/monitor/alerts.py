"""The gradient monitor's alert rules, over plain ``StepStats`` (no torch).

``AlertRules`` turns logged steps into ``Alert``s one at a time (what a live ``GradMonitor``
runs at each logged step, with the ``Thresholds`` it was given); ``alerts(log, thresholds)``
runs the same rules over a whole ``MonitorLog``, for instance one read back from a JSON Lines
file, and gives the alerts the live run gave (``leak`` alerts aside: they come from a walk of
the autograd graphs, not from the statistics).

Example:
    >>> from gradscope.monitor.log import MonitorLog, ParamStats, StepStats
    >>> zero = ParamStats(0.0, None, None, 0, 0, None)
    >>> steps = [StepStats(i, 0.0, {"w": zero}) for i in range(3)]
    >>> log = MonitorLog(["w"], 1, 50, 2.0, steps, [], numels={"w": 4})
    >>> [(a.kind, a.step, a.name) for a in alerts(log)]
    [('dead', 2, 'w')]
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import deque
from itertools import repeat

from ..errors import MonitorError
from .log import (
    VANISH,
    VANISH_RATIO,
    Alert,
    MonitorLog,
    ParamStats,
    StepStats,
    Thresholds,
)
from .spikes import (
    SpikeRule,
    SpikeStart,
    Tail,
    UpdateSpikes,
    jumps,
)

#: a parameter is "vanishing" or "dead" after this many consecutive logged steps
VANISH_PATIENCE = 3
#: ... unless its gradient grew this many times over those steps (twice a step): a gradient
#: leaving a tiny start is waking up, not stuck (a branch behind a layer scale of 1e-6 as the
#: scale grows: a Hugging Face ConvNeXt's under AdamW, 1e-10 -> 4e-9 -> 8e-9 per element,
#: then above eps). It is judged again over the last three at each later low step: one that
#: stops growing while still low alerts then
VANISH_WAKE = 4.0
#: a norm this many times above the running median of its last logged norms is "exploding"
SPIKE_FACTOR = 10.0
#: NaN/Inf seen again within this many logged steps of the last time is the same event (a
#: gradient that flaps between finite and not gives one alert, one incident with a count)
FLAP_WINDOW = 10
#: the running median needs at least this many earlier logged norms
SPIKE_MIN_HISTORY = 5
#: ... and this many times the largest of them (a jump, not a climb)
SPIKE_GROWTH = 2.0
#: ... by a gradient at least this share of the step's per-element size over all parameters
#: (the model's RMS gradient for p = 2): a gradient far below the rest that grows (a branch
#: behind a layer scale of 1e-6 waking up, as in ConvNeXt) is no explosion
SPIKE_SIGNIFICANT = 0.1
_SPIKE_WINDOW = 25
_MEDIAN_EVERY = 5


def alerts(log: MonitorLog, thresholds: Thresholds | None = None) -> list[Alert]:
    """The alerts the rules give over ``log``'s steps, in order (as the live run gave them;
    ``leak`` alerts are not derived from statistics and are not included). ``log.numels`` must
    name the element count of every parameter (a monitor's log and one read back from its
    JSON Lines file have them). ``thresholds``: default the log's own (the monitor's)."""
    missing = [n for n in log.names if n not in log.numels]
    if missing:
        raise MonitorError(
            f"the log has no element count for {missing[0]} (and {len(missing) - 1} more); "
            "give a log from GradMonitor.log or read_jsonl of a file it wrote"
        )
    rules = AlertRules(thresholds or log.thresholds, log.norm_type, log.numels)
    out: list[Alert] = []
    for st in log.steps:
        out.extend(rules.update(st))
        out.extend(rules.late(st))  # what the live monitor judged when the ratios came
    return out


class _Track:
    """Alert state of one parameter across logged steps."""

    __slots__ = ("low", "lows", "vanished", "zero", "window", "median", "age", "exploding",
                 "tail")

    def __init__(self) -> None:
        self.low = 0  # consecutive logged steps vanishing
        # the per-element sizes of the last VANISH_PATIENCE of them (only a low step adds
        # one), and whether this run of low steps was alerted
        self.lows: deque[float] = deque(maxlen=VANISH_PATIENCE)
        self.vanished = False
        self.zero = 0  # consecutive logged steps exactly zero
        self.window: deque[float] = deque(maxlen=_SPIKE_WINDOW)
        # the median of ``window``, recomputed every ``_MEDIAN_EVERY`` steps: it moves slowly,
        # and sorting a window per parameter per step would cost more than all the rest
        self.median = 0.0
        self.age = _MEDIAN_EVERY
        self.exploding = False
        self.tail = Tail()  # what the norm reached lately: a jump must pass it too


class AlertRules:
    """Turns each logged step into alerts. Each condition alerts when it starts, and all the
    parameters that enter it at the same step make one alert (the first named, all counted);
    NaN and Inf are events of the whole model: one alert when the first parameter turns
    non-finite, none while some stay so (an optimizer step spreads a NaN to every weight)."""

    def __init__(self, thresholds: Thresholds, norm_type: float, numels: dict[str, int]) -> None:
        self.thresholds = thresholds
        self.norm_type = norm_type
        self.numels = numels
        self.tracks: dict[str, _Track] = {}
        self._divisor: dict[str, float] = {}
        self._divisor_key: tuple[int, int, float] | None = None
        self.forward_bad = False
        self.nan = self.inf = False
        # logged steps since each kind was last seen (FLAP_WINDOW: long enough for a new event)
        self.quiet = {"nan": FLAP_WINDOW, "inf": FLAP_WINDOW}
        #: the spike rule (None: ``Thresholds.spike`` is None, detection off)
        self.spikes = (None if thresholds.spike is None else
                       SpikeRule(thresholds.spike, thresholds.spike_window,
                                 thresholds.spike_warmup))
        #: the update signal's rule (its ratios come after the step: ``late``)
        self.updates = (None if thresholds.spike is None else
                        UpdateSpikes(thresholds.spike, thresholds.spike_window,
                                     thresholds.spike_warmup))
        #: the spike event the last step started (``SpikeStart``), or None
        self.spike_started: SpikeStart | None = None
        #: the update-ratio spike event the last ``late`` started, or None
        self.update_started: SpikeStart | None = None

    @property
    def spike_ended(self) -> tuple[int, int] | None:
        """(first step, logged steps it lasted) of the spike event that ended at the last
        step, or None."""
        return None if self.spikes is None else self.spikes.ended

    @property
    def update_ended(self) -> tuple[int, int] | None:
        """(first step, full steps it lasted) of the update-ratio spike event that ended at
        the last ``late`` step, or None."""
        return None if self.updates is None else self.updates.ended

    def late(self, st: StepStats) -> list[Alert]:
        """The alerts of ``st``'s update-to-weight ratios, once they are known (after its
        ``update``, before the next step's): an update-ratio spike, unless a gradient-norm or
        loss spike event already covers the step (one event, the first signal named)."""
        self.update_started = None
        if self.updates is None:
            return []
        covered = self.spikes is not None and self.spikes.open is not None
        started = self.updates.update(st, self.numels)
        if started is None or covered:
            return []
        self.update_started = started
        return [Alert("spike", st.step, started.signal, started.message())]

    def recount(self, numels: dict[str, int]) -> None:
        """The element counts of the parameters watched from now on."""
        self.numels = numels

    def update(self, st: StepStats) -> list[Alert]:
        th = self.thresholds
        vanish = VANISH if th.vanish is None else th.vanish
        vanish_ratio = VANISH_RATIO if th.vanish_ratio is None else th.vanish_ratio
        explode = th.explode
        norm_type, numels = self.norm_type, self.numels
        out: list[Alert] = []
        first_bad = st.forward_nonfinite
        if first_bad is not None and not self.forward_bad:
            msg = f"step {st.step}: the output of {first_bad} is the first non-finite forward value"
            out.append(Alert("forward_nonfinite", st.step, first_bad, msg))
        self.forward_bad = first_bad is not None
        started = self.spike_started = (None if self.spikes is None
                                        else self.spikes.update(st))
        if started is not None:
            out.append(Alert("spike", st.step, started.signal, started.message()))
        if st.skipped:  # the GradScaler skipped it: scaled overflow, not the model's gradients
            return out
        # every norm is finite when their p-norm is: no parameter to look at for NaN/Inf
        out.extend(self._nonfinite(st) if not math.isfinite(st.total_norm) else
                   self._nonfinite_none())
        isfinite, divisor = math.isfinite, self._divisors()
        per_elem = {
            n: ps.norm / divisor.get(n, 1.0)
            for n, ps in st.params.items()
            if isfinite(ps.norm)
        }
        positive = [v for v in per_elem.values() if v > 0]
        median = statistics.median(positive) if positive else 0.0
        floor = vanish_floor(vanish, st.loss)
        # the model's per-element size this step (NaN when some norm is not finite: no gate)
        overall = _per_element(st.total_norm, sum(map(numels.get, st.params, repeat(1))),
                               norm_type)
        significant = SPIKE_SIGNIFICANT * overall if math.isfinite(overall) else 0.0
        dead, vanishing, exploding = [], [], []
        low_level = max(floor, vanish_ratio * median)  # below either is low
        low_now = {n: 0 < size < low_level for n, size in per_elem.items()}
        tracks, patience = self.tracks, VANISH_PATIENCE
        median_of = statistics.median
        for name, ps in st.params.items():
            track = tracks.get(name)
            if track is None:
                track = tracks[name] = _Track()
            size = per_elem.get(name)
            if size is None:
                continue
            # dead: exactly zero (every element zero, when the zero fraction was measured)
            if size == 0 and (ps.zero_frac is None or ps.zero_frac == 1.0):
                track.zero += 1
                if track.zero == patience:
                    dead.append(name)
            else:
                track.zero = 0
            # a bias vanishes with its weight: alone it is a sum over the batch that cancels;
            # one that grew VANISH_WAKE x over its last ``patience`` low steps is waking up
            if low_now[name] and low_now.get(_weight_of(name), True):
                track.low += 1
                track.lows.append(size)
                if (track.low >= patience and not track.vanished
                        and size < VANISH_WAKE * track.lows[0]):
                    track.vanished = True
                    vanishing.append((name, ps.norm, size))
            elif track.low:
                track.low, track.vanished = 0, False
                track.lows.clear()
            # exploding: above ``explode``, or SPIKE_FACTOR x the running median of the window
            # (and SPIKE_GROWTH x its largest value) for a significant gradient (its
            # per-element size at least SPIKE_SIGNIFICANT x the model's); alerted when the
            # condition starts, with the median (NaN when only the absolute level was crossed).
            # Written out here, not a method: it runs per parameter per logged step.
            norm, window = ps.norm, track.window
            level: float | None = None
            if len(window) >= SPIKE_MIN_HISTORY:
                # fresh while the window fills (the first logged steps, when gradients climb
                # fastest: a median five steps old made a climb plus a noisy batch look 15x)
                if track.age >= _MEDIAN_EVERY or len(window) < _SPIKE_WINDOW:
                    track.age, track.median = 0, median_of(window)
                track.age += 1
                level = track.median
            # a jump must also be GROWTH x everything in the window: a norm that climbs
            # steadily (a weight growing under a warm-up, a branch leaving its zero init) is no
            # explosion
            now = norm > explode or (
                size >= significant and level is not None and norm > SPIKE_FACTOR * level
                and jumps(norm, level, track.tail, SPIKE_FACTOR)
                and norm > SPIKE_GROWTH * max(window)
            )
            window.append(norm)
            track.tail.append(norm)
            if now and not track.exploding:
                exploding.append((name, norm, level if level is not None and norm <= explode
                                  else math.nan))
            track.exploding = now
        if dead:
            out.append(_dead_alert(st.step, dead))
        if vanishing:
            out.append(_vanish_alert(st.step, vanishing, floor, vanish, vanish_ratio, median))
        if exploding:
            out.append(_explode_alert(st.step, exploding, explode))
        return out

    def _divisors(self) -> dict[str, float]:
        """Per parameter, what its norm is divided by to give its per-element size
        (``_per_element``), computed once per set of element counts and norm type."""
        key = (id(self.numels), len(self.numels), self.norm_type)
        if self._divisor_key != key:
            p = self.norm_type  # the divisor of _per_element, so the sizes are the same floats
            self._divisor = {n: k ** (1.0 / p) if k > 1 and not math.isinf(p) else 1.0
                             for n, k in self.numels.items()}
            self._divisor_key = key
        return self._divisor

    def _nonfinite_none(self) -> list[Alert]:
        """``_nonfinite`` of a step whose gradients are all finite."""
        for kind in ("nan", "inf"):
            self.quiet[kind] = min(self.quiet[kind] + 1, FLAP_WINDOW)
            setattr(self, kind, False)
        return []

    def _nonfinite(self, st: StepStats) -> list[Alert]:
        out = []
        for kind, word in (("nan", "NaN value"), ("inf", "infinite value")):
            hit = [(n, ps) for n, ps in st.params.items() if _has(ps, kind)]
            quiet = self.quiet[kind]
            if hit and quiet >= FLAP_WINDOW:  # not seen for a while: a new event
                out.append(_nonfinite_alert(st.step, kind, word, hit))
            # a gradient that flaps (NaN every other step) stays one event
            self.quiet[kind] = 0 if hit else min(quiet + 1, FLAP_WINDOW)
            setattr(self, kind, bool(hit))
        return out

def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


@functools.lru_cache(maxsize=65536)
def _weight_of(name: str) -> str:
    """The weight a bias goes with, by PyTorch's names: ``fc.bias`` -> ``fc.weight``,
    ``lstm.bias_ih_l0`` -> ``lstm.weight_ih_l0``, ``attn.in_proj_bias`` -> ``attn.in_proj_weight``;
    any other name -> itself. A bias's gradient is the sum of its output's gradient over the
    batch and positions, which cancels where what follows ignores a shift (a softmax: BERT's
    key bias; a normalisation: a BatchNorm's shift before a convolution and another
    BatchNorm), while its weight's, the same gradient times the inputs, does not: so a bias
    is vanishing only when its weight is too (or when it has none watched)."""
    head, dot, last = name.rpartition(".")
    if "bias" not in last:
        return name
    return head + dot + last.replace("bias", "weight")


def vanish_floor(vanish: float, loss: float | None) -> float:
    """The absolute "vanishing" level of a step: ``vanish``, scaled down by the step's loss
    when it is known and below 1 (never up). Gradients are proportional to the loss, so a
    batch the model already fits (loss 1e-5) has tiny gradients that are not vanishing; with
    no loss observed (or a non-finite one) the level is ``vanish``."""
    if loss is None or not math.isfinite(loss):
        return vanish
    return vanish * min(1.0, abs(loss))


def _per_element(norm: float, numel: int, norm_type: float) -> float:
    """A norm as a per-element size (the RMS for p = 2), so tensors of any size compare."""
    if math.isinf(norm_type) or numel <= 1:
        return norm
    return norm / numel ** (1.0 / norm_type)


def _has(ps: ParamStats, kind: str) -> bool:
    count = ps.nan if kind == "nan" else ps.inf
    if count is not None:
        return count > 0
    # not countable (changed before counting): a NaN norm means a NaN, an infinite one an Inf
    return math.isnan(ps.norm) if kind == "nan" else math.isinf(ps.norm)


def _nonfinite_alert(
    step: int, kind: str, word: str, hit: list[tuple[str, ParamStats]]
) -> Alert:
    first, ps = hit[0]
    count = ps.nan if kind == "nan" else ps.inf
    if count is not None:
        what = _count(count, word)
    else:
        what = f"{word}s (not counted: the gradient changed after backward, e.g. clipped)"
    names = tuple(n for n, _ in hit)
    if len(hit) == 1:
        msg = f"step {step}: {what} in the gradient of {first}"
    else:
        label = "NaN" if kind == "nan" else "Inf"
        msg = (
            f"step {step}: {label} in the gradients of {len(hit)} parameters, "
            f"first {first} ({what})"
        )
    return Alert(kind, step, first, msg, len(hit), names)


def _dead_alert(step: int, dead: list[str]) -> Alert:
    if len(dead) == 1:
        msg = (
            f"step {step}: the gradient of {dead[0]} is exactly zero for {VANISH_PATIENCE} "
            "logged steps in a row (dead unit or a parameter cut off from the loss)"
        )
    else:
        msg = (
            f"step {step}: the gradients of {len(dead)} parameters are exactly zero for "
            f"{VANISH_PATIENCE} logged steps in a row (dead units or parameters cut off from "
            f"the loss), first {dead[0]}"
        )
    return Alert("dead", step, dead[0], msg, len(dead), tuple(dead))


def _vanish_alert(
    step: int,
    hit: list[tuple[str, float, float]],
    floor: float,
    vanish: float,
    ratio: float,
    median: float,
) -> Alert:
    name, norm, size = hit[0]
    if size < floor:
        why = (f"below {vanish:g} per element" if floor == vanish else
               f"below {vanish:g} x the loss {floor / vanish:.3g} per element")
    else:
        why = f"below {ratio:g} x the model's median {median:.3g} per element"
    if len(hit) == 1:
        msg = (
            f"step {step}: gradient norm of {name} is {norm:.3g} ({size:.3g} per element), "
            f"{why} for {VANISH_PATIENCE} logged steps in a row"
        )
    else:
        msg = (
            f"step {step}: vanishing gradients in {len(hit)} parameters for "
            f"{VANISH_PATIENCE} logged steps in a row, first {name}: norm {norm:.3g} "
            f"({size:.3g} per element), {why}"
        )
    return Alert("vanishing", step, name, msg, len(hit), tuple(n for n, _, _ in hit))


def _explode_alert(step: int, hit: list[tuple[str, float, float]], explode: float) -> Alert:
    name, norm, median = hit[0]
    why = f"above {explode:g}" if math.isnan(median) else (
        f"{norm / median:.0f}x its running median {median:.3g}"
    )
    if len(hit) == 1:
        msg = f"step {step}: gradient norm of {name} is {norm:.3g}, {why}"
    else:
        msg = (
            f"step {step}: exploding gradients in {len(hit)} parameters, first {name}: "
            f"norm {norm:.3g}, {why}"
        )
    return Alert("exploding", step, name, msg, len(hit), tuple(n for n, _, _ in hit))
