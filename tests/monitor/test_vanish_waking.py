"""A gradient that starts tiny and grows fast is waking up, not vanishing (issue 47).

A Hugging Face ConvNeXt (``ConvNextConfig``, layer scale 1e-6) under AdamW: the first block's
LayerNorm weight sits behind the layer scale, so its gradient starts a million times below the
rest and grows with the scale, 1.1e-10 -> 4.4e-9 -> 8.0e-9 -> 1.2e-8 per element in its first
four steps (the numbers below; AdamW's eps is 1e-8, the level). It was "vanishing" at step 2
and above the level at step 3: a false alarm on a healthy model. A gradient now vanishes only
when it did not grow ``VANISH_WAKE`` (4) x over its last ``VANISH_PATIENCE`` (3) low steps
(twice a step); one that stops growing below the level alerts then.
Ground truth for the planted side: the same rules without the guard (``VANISH_WAKE`` infinite)
alert on the ConvNeXt numbers, and tiny gradients that are flat, noisy or slowly rising alert
as before."""

from __future__ import annotations

import math

import pytest

from gradscope.monitor import alerts as rules
from gradscope.monitor.alerts import AlertRules
from gradscope.monitor.log import ParamStats, StepStats, Thresholds

#: the LayerNorm weight of stage 0 block 0 of the zoo's Hugging Face ConvNeXt (16 elements;
#: benchmarks/healthy_zoo.py convnext-hf), per element, steps 0-5
CONVNEXT_LN = [1.1e-10, 4.4e-9, 8.0e-9, 1.2e-8, 1.4e-8, 3.0e-8]


def _run(sizes: list[float], numel: int = 16, vanish: float = 1e-8) -> list[tuple[str, int]]:
    """The alerts on ``w`` (per-element sizes ``sizes``) beside a healthy ``v``."""
    numels = {"v": 64, "w": numel}
    judge = AlertRules(Thresholds(vanish=vanish, vanish_ratio=0.0), 2.0, numels)
    out = []
    for i, size in enumerate(sizes):
        norms = {"v": 1e-3 * 8, "w": size * math.sqrt(numel)}
        total = math.sqrt(sum(v * v for v in norms.values()))
        st = StepStats(i, total, {n: ParamStats(v, None, None, 0, 0, None)
                                  for n, v in norms.items()}, loss=2.3)
        out.extend((a.kind, a.step) for a in judge.update(st) if a.name == "w")
    return out


def test_a_branch_behind_a_layer_scale_waking_up_is_not_vanishing(monkeypatch):
    assert _run(CONVNEXT_LN) == []
    monkeypatch.setattr(rules, "VANISH_WAKE", math.inf)  # the rule before: alerts at step 2
    assert _run(CONVNEXT_LN) == [("vanishing", 2)]


@pytest.mark.parametrize("sizes, step", [
    ([2e-9] * 6, 2),                                   # flat
    ([2e-9, 6e-9, 1e-9, 3e-9, 2e-9, 4e-9], 2),          # noisy, no trend
    ([2e-9, 2.6e-9, 3.4e-9, 4.4e-9, 5.7e-9, 7.4e-9], 2),  # rising 1.3x a step: too slow
    ([1e-11, 1e-10, 1e-9, 1.2e-9, 1.3e-9, 1.3e-9, 1.3e-9, 1.3e-9], 4),  # woke, then stalled
])
def test_tiny_gradients_that_do_not_wake_up_are_still_vanishing(sizes, step):
    assert _run(sizes) == [("vanishing", step)]


def test_one_alert_per_low_run_and_a_new_one_after_recovering():
    sizes = [2e-9] * 5 + [2e-8] + [2e-9] * 4  # 2e-8: above the level (1e-8)
    assert _run(sizes) == [("vanishing", 2), ("vanishing", 8)]
