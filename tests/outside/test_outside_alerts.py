"""The monitor on healthy training of outside models gives no alarm. A timm ConvNeXt scales
each block's branch by a layer scale that starts at 1e-6: the branch's gradients start a
million times below the rest and grow with it, and a jump of one of them over its own median
(a bias 11x, at a per-element size 1e-3 of the model's) once gave an 'exploding' alert within
12 steps, under AdamW and under SGD. Exploding now needs a gradient at least
``SPIKE_SIGNIFICANT`` x the model's per-element RMS.

Ground truth: the same logs judged without that gate (the rule before) alert. Runs on the leg
with timm (scripts/test.sh installs it on the torch 2.14 leg)."""

from __future__ import annotations

import pytest
import torch

timm = pytest.importorskip("timm", reason="needs timm (the torch 2.14 leg installs it)")

import gradscope as gs  # noqa: E402
from gradscope.model.alerts import alerts  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _train(optimizer: str, steps: int = 12) -> gs.GradMonitor:
    torch.manual_seed(0)
    model = timm.create_model("convnext_atto", pretrained=False, num_classes=10)
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-3) if optimizer == "adamw" else
           torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9))
    with gs.GradMonitor(model, optimizer=opt) as mon:
        for _ in range(steps):
            x, y = torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            mon.observe_loss(loss)
            loss.backward()
            opt.step()
    return mon


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_a_convnext_branch_waking_up_is_not_exploding(optimizer, monkeypatch):
    mon = _train(optimizer)
    assert [a for a in mon.alerts if a.kind == "exploding"] == []
    monkeypatch.setattr("gradscope.model.alerts.SPIKE_SIGNIFICANT", 0.0)
    before = [a for a in alerts(mon.log) if a.kind == "exploding"]
    assert before and all(".blocks." in n for a in before for n in a.names), before
