"""The alert rules on plain step records (no torch): what a healthy run's gradients look like
in the first logged steps, and a bias judged with its weight. Ground truth for the numbers:
the runs they were read from (a timm DeiT-III under AdamW and a warm-up; a BatchNorm shift
before a convolution), recorded in the README."""

from __future__ import annotations

from gradscope.monitor import alerts as rules
from gradscope.monitor.alerts import AlertRules, _weight_of
from gradscope.monitor.log import ParamStats, StepStats, Thresholds


def _stats(norm: float) -> ParamStats:
    return ParamStats(norm, None, None, 0, 0, None)


def _run(norms: list[dict[str, float]], numels: dict[str, int], loss: float = 2.3):
    judge = AlertRules(Thresholds(), 2.0, numels)
    found = []
    for i, step in enumerate(norms):
        total = sum(v * v for v in step.values()) ** 0.5
        st = StepStats(i, total, {n: _stats(v) for n, v in step.items()}, loss=loss)
        found.extend(judge.update(st))
    return found


#: patch_embed.proj.bias of a timm DeiT-III (layer scale) in its first 10 steps under AdamW
#: and a linear warm-up: it climbs as the layer scales grow, and step 9's batch lifted every
#: gradient 1.6x. Against a median five steps old it looked 15x; against the window's, 4.8x.
CLIMB = [5e-6, 2.7e-4, 5.4e-4, 9.2e-4, 1.7e-3, 2.3e-3, 2.8e-3, 3.2e-3, 3.9e-3, 8.2e-3]


def test_a_climb_with_a_noisy_batch_in_the_first_steps_is_not_exploding(monkeypatch):
    steps = [{"w": v} for v in CLIMB]
    assert _run(steps, {"w": 1}) == []
    # a window full after 5 steps: its median then kept for 5 steps, as every window was before
    monkeypatch.setattr(rules, "_SPIKE_WINDOW", 5)
    assert [(a.kind, a.step) for a in _run(steps, {"w": 1})] == [("exploding", 9)]


def test_a_jump_after_a_steady_start_is_exploding():
    steps = [{"w": 1.0 + 0.01 * i} for i in range(12)] + [{"w": 30.0}]
    assert [(a.kind, a.step) for a in _run(steps, {"w": 1})] == [("exploding", 12)]


def test_a_bias_is_vanishing_only_with_its_weight():
    """A bias whose gradient cancels over the batch (what follows ignores a shift) beside a
    healthy weight: no alert; the same bias with its weight tiny too: both vanish."""
    numels = {"conv.weight": 64, "bn.weight": 8, "bn.bias": 8, "head.weight": 16}
    healthy = {"conv.weight": 0.1, "bn.weight": 0.05, "bn.bias": 3e-9, "head.weight": 0.2}
    assert _run([healthy] * 4, numels) == []
    dying = {**healthy, "bn.weight": 2e-9}
    (alert,) = _run([dying] * 4, numels)
    assert (alert.kind, alert.step, alert.names) == ("vanishing", 2, ("bn.weight", "bn.bias"))


def test_the_weight_of_a_bias_by_pytorch_names():
    assert _weight_of("encoder.layer.0.attention.self.key.bias") == (
        "encoder.layer.0.attention.self.key.weight")
    assert _weight_of("lstm.bias_hh_l1_reverse") == "lstm.weight_hh_l1_reverse"
    assert _weight_of("attn.in_proj_bias") == "attn.in_proj_weight"
    assert _weight_of("bias") == "weight"
    assert _weight_of("bias_net.weight") == "bias_net.weight"  # only the last component
    assert _weight_of("blocks.0.ls1.gamma") == "blocks.0.ls1.gamma"
