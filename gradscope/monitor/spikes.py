"""Spike detection: a logged step whose total gradient norm, loss or update ratio jumps far
above its recent level, as plain data (no torch; the monitor's ``AlertRules`` runs it).

A value is a spike when it is above ``Thresholds.spike`` (default 10) times its baseline: the
median of the last ``Thresholds.spike_window`` logged finite values of the same signal, the
first ``Thresholds.spike_warmup`` logged values ignored (the early steps of a run, whose
norms fall fast, are no baseline), and only once ``SPIKE_MIN_VALUES`` values are in the
window. Every finite value enters the window, spikes included (the median is not moved by a
few of them, and a run that settles at a new level stops spiking after half a window).

An event starts at the first spiking logged step (any signal; the one with the largest ratio
names it) and lasts while some signal still spikes: one alert and one incident per event,
its length (``steps``) known when it ends. Skipped and non-finite steps are not figures (a
NaN is another event) and neither start nor end one.

Signals: ``grad_norm`` (``StepStats.total_norm``), ``loss`` (``StepStats.loss``, when the
monitor was given the loss), judged by ``SpikeRule`` as each step is logged; and ``update``
(``update_level``: the update-to-weight ratios of a full-statistics step with ``optimizer=``,
as one figure), judged by ``UpdateSpikes`` when the ratios arrive: they are measured after
``optimizer.step()`` and reach the log with the next logged step, after that step's own rules
ran. An update event is its own (full steps in a row that spike), with no per-sample replay
(the parameters have changed by then).

A spike's cause may be the optimizer's, not the data's: with ``optimizer=`` the monitor keeps
the learning rate of every optimizer step (the largest of its param groups, Python numbers
only), and ``rate_jump`` tells when one since the last logged step was above ``RATE_FACTOR``
x the median of the ``RATE_WINDOW`` before it; the spike incident's note then says so.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections import deque
from dataclasses import dataclass
from typing import Any

#: what a spike is measured on as a step is logged (``update`` comes later: ``UpdateSpikes``)
SIGNALS = ("grad_norm", "loss")
#: values a signal's window needs before it can tell a spike
SPIKE_MIN_VALUES = 5
#: a jump must also pass TAIL_FACTOR x the TAIL_QUANTILE of the last TAIL_WINDOW logged values
#: (once TAIL_MIN are in): how high the signal itself has been going, not only its median
TAIL_WINDOW = 200
TAIL_QUANTILE = 0.99
TAIL_FACTOR = 2.0
TAIL_MIN = 50
TAIL_EVERY = 5


class Tail:
    """The last ``TAIL_WINDOW`` values of a signal, in a fixed array (8 bytes a value: one per
    parameter for the exploding rule), and whether a value is above what they usually reach.
    The level is recomputed at most every ``TAIL_EVERY`` values (a sort of 200 per parameter
    per step would cost a noisy run more than the rest of the rules; a quantile of 200 values
    moves little in 5)."""

    __slots__ = ("values", "next", "full", "age", "cached")

    def __init__(self) -> None:
        self.values = array("d", bytes(8 * TAIL_WINDOW))
        self.next = 0
        self.full = False
        self.age = TAIL_EVERY
        self.cached = 0.0

    def __len__(self) -> int:
        return TAIL_WINDOW if self.full else self.next

    def append(self, value: float) -> None:
        self.values[self.next] = value
        self.next = (self.next + 1) % TAIL_WINDOW
        self.full = self.full or self.next == 0
        self.age += 1

    def level(self) -> float:
        """The ``TAIL_QUANTILE`` of the values held (0.0 while fewer than ``TAIL_MIN``), as of
        at most ``TAIL_EVERY - 1`` values ago."""
        n = len(self)
        if n < TAIL_MIN:
            return 0.0
        if self.age >= TAIL_EVERY:
            held = sorted(self.values if self.full else self.values[:n])
            self.cached, self.age = held[int(TAIL_QUANTILE * (n - 1))], 0
        return self.cached


def jumps(value: float, median: float, tail: Tail, factor: float) -> bool:
    """Whether ``value`` is a spike: above ``factor`` x ``median`` (its recent level) and
    above ``TAIL_FACTOR`` x what the signal reached in its last ``TAIL_WINDOW`` values (their
    ``TAIL_QUANTILE``). The second test is what keeps a healthy heavy-tailed run quiet: near a
    loss of zero a batch with one hard example lifts the loss and the gradient norm 100x their
    median every few steps (a classifier at loss 1e-5: 800 alerts in 5,000 steps by the median
    alone, 20-30 with both); a run whose signal is steady (q99 near its median) is judged by
    the median alone, as a spike there exceeds both."""
    if not (median > 0 and value > factor * median):
        return False
    return value > TAIL_FACTOR * tail.level()


@dataclass(frozen=True)
class SpikeStart:
    """A spike event's first logged step: which signal, its value, the baseline (median)
    it is compared with, ``ratio`` = value / baseline, and ``over``: how many logged values
    the median is of."""

    step: int
    signal: str
    value: float
    baseline: float
    ratio: float
    over: int

    def message(self) -> str:
        return (
            f"step {self.step}: {_word(self.signal)} spiked x{self.ratio:.3g} "
            f"({self.value:.4g} against a median of {self.baseline:.4g} over the last "
            f"{self.over} logged steps)"
        )


def _word(signal: str) -> str:
    return {"grad_norm": "the gradient norm", "loss": "the loss",
            "update": "the update ratio"}.get(signal, signal)


def signals(st: Any) -> dict[str, float]:
    """The step's finite figures, by signal (a ``StepStats``)."""
    out: dict[str, float] = {}
    if math.isfinite(st.total_norm):
        out["grad_norm"] = st.total_norm
    loss = getattr(st, "loss", None)
    if loss is not None and math.isfinite(loss):
        out["loss"] = loss
    return out


#: optimizer steps of learning rates a spike's cause is looked for against, and how far
#: above their median a rate is a jump (a warm-up over 50 steps doubles it at most)
RATE_WINDOW = 50
RATE_FACTOR = 10.0


@dataclass(frozen=True)
class RateJump:
    """The learning rate of an optimizer step before a spike, far above the rates before it:
    ``ago`` optimizer steps before the spiking step, ``rate`` (the largest of its param
    groups), ``baseline`` (the median of the earlier steps' rates) and ``ratio``."""

    ago: int
    rate: float
    baseline: float
    ratio: float

    def message(self, *, own: bool = False) -> str:
        """``own``: the rates looked at ended with the spiking step's own (an update-ratio
        spike, whose update that rate made), so ``ago`` 1 is that step."""
        ago = self.ago - 1 if own else self.ago
        when = ("this step" if ago == 0 else "the step before" if ago == 1
                else f"{ago} steps before")
        return (f"the learning rate of {when} was x{self.ratio:.3g} its running median "
                f"({self.rate:.3g} against {self.baseline:.3g}): that update moved every "
                "weight, the likelier cause")


def rate_jump(rates: list[float], recent: int, factor: float) -> RateJump | None:
    """Whether one of the last ``recent`` learning rates in ``rates`` (one per optimizer
    step, oldest first, the spiking step's own excluded) is above ``factor`` x the median
    of those before it (at least ``SPIKE_MIN_VALUES`` of them)."""
    recent = max(1, min(recent, len(rates) - SPIKE_MIN_VALUES))
    if len(rates) < SPIKE_MIN_VALUES + 1:
        return None
    base = statistics.median(rates[:-recent])
    top = max(range(len(rates) - recent, len(rates)), key=lambda i: rates[i])
    if base > 0 and rates[top] > factor * base:
        return RateJump(len(rates) - top, rates[top], base, rates[top] / base)
    return None


class _Signal:
    """One signal's recent values: the median window and the tail, and the logged values
    still to ignore (``warmup``)."""

    __slots__ = ("name", "values", "tail", "seen")

    def __init__(self, name: str, window: int) -> None:
        self.name = name
        self.values: deque[float] = deque(maxlen=window)
        self.tail = Tail()
        self.seen = 0

    def spike(self, step: int, value: float, factor: float, warmup: int) -> SpikeStart | None:
        """The spike ``value`` would be at ``step`` now, or None (no state changed)."""
        if self.seen < warmup or len(self.values) < SPIKE_MIN_VALUES:
            return None
        base = statistics.median(self.values)
        if not jumps(value, base, self.tail, factor):
            return None
        return SpikeStart(step, self.name, value, base, value / base, len(self.values))

    def judge(self, step: int, value: float, factor: float, warmup: int) -> SpikeStart | None:
        """Take ``value`` in (a warm-up value only counts), and return the spike it is, or
        None."""
        if self.seen < warmup:
            self.seen += 1
            return None
        hit = self.spike(step, value, factor, warmup)
        self.values.append(value)
        self.tail.append(value)
        return hit


class _Events:
    """Spike events over judged steps: ``open`` (the running event's start), its ``length``,
    and ``ended``: ``(first step, steps it lasted)`` of the event that ended at the last
    step, or None."""

    def __init__(self) -> None:
        self.open: SpikeStart | None = None
        self.length = 0
        self.ended: tuple[int, int] | None = None

    def advance(self, hits: list[SpikeStart]) -> SpikeStart | None:
        """One judged step with these spikes; returns the event it starts, or None."""
        if hits and self.open is None:
            self.open = max(hits, key=lambda h: h.ratio)
            self.length = 1
            return self.open
        if hits:
            self.length += 1
        elif self.open is not None:
            self.ended = (self.open.step, self.length)
            self.open = None
        return None


class SpikeRule(_Events):
    """The spike state of one run across logged steps. ``update(st)`` returns the event
    ``st`` starts (or None); after it, ``ended`` is ``(first step, logged steps it lasted)``
    of the event that ended at ``st`` (or None) and ``open`` the event still running."""

    def __init__(self, factor: float, window: int, warmup: int) -> None:
        super().__init__()
        self.factor = factor
        self.warmup = warmup
        self.signals = {s: _Signal(s, window) for s in SIGNALS}

    def would_start(self, values: dict[str, float | None]) -> bool:
        """Whether a step with these figures would start a spike event (no state changed:
        the monitor asks before ``optimizer.step()``, to replay the micro-batch then)."""
        if self.open is not None:
            return False
        return any(value is not None and math.isfinite(value)
                   and self.signals[signal].spike(0, value, self.factor, self.warmup)
                   is not None
                   for signal, value in values.items())

    def update(self, st: Any) -> SpikeStart | None:
        self.ended = None
        if st.skipped or not math.isfinite(st.total_norm):
            return None
        hits = [hit for signal, value in signals(st).items()
                if (hit := self.signals[signal].judge(st.step, value, self.factor,
                                                      self.warmup)) is not None]
        return self.advance(hits)


def update_level(st: Any, numels: dict[str, int]) -> float | None:
    """The step's update-to-weight ratios as one figure: their mean weighted by element count,
    each ratio capped at 1, ``sum(n_i min(r_i, 1)) / sum(n_i)``. Unweighted, or as a root mean
    square, a one-element bias crossing zero decides it: AdamW moves it by about the learning
    rate whatever its size, and its ratio reaches 30 (3 false update spikes in 3,000 steps of a
    healthy regression with full statistics on every step; none so). None when the step has
    none."""
    num = den = 0.0
    for name, ps in st.params.items():
        r = ps.update_ratio
        if r is not None and math.isfinite(r):
            n = numels.get(name, 1)
            num += n * min(r, 1.0)
            den += n
    return num / den if den > 0 else None


class UpdateSpikes(_Events):
    """The spike state of the update signal (see the module docstring), as ``SpikeRule``'s
    for the others: ``update(st, numels)`` when the step's ratios are known returns the event
    it starts (or None); ``ended`` is then ``(first step, full steps it lasted)`` of the event
    that ended at ``st``, or None."""

    def __init__(self, factor: float, window: int, warmup: int) -> None:
        super().__init__()
        self.factor = factor
        self.warmup = warmup
        self.signal = _Signal("update", window)

    def update(self, st: Any, numels: dict[str, int]) -> SpikeStart | None:
        self.ended = None
        value = None if st.skipped or not st.full else update_level(st, numels)
        if value is None:
            return None  # a step without ratios neither starts nor ends an event
        hit = self.signal.judge(st.step, value, self.factor, self.warmup)
        return self.advance([] if hit is None else [hit])
