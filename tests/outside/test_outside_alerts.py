"""The monitor on healthy training of outside models gives no alarm.

A timm ConvNeXt scales
each block's branch by a layer scale that starts at 1e-6: the branch's gradients start a
million times below the rest and grow with it, and a jump of one of them over its own median
(a bias 11x, at a per-element size 1e-3 of the model's) once gave an 'exploding' alert within
12 steps, under AdamW and under SGD. Exploding now needs a gradient at least
``SPIKE_SIGNIFICANT`` x the model's per-element RMS.

A torchvision MobileNetV3 (a BatchNorm's shift before a convolution and another BatchNorm,
which ignores it) and a Hugging Face BERT (a key bias, which the softmax ignores) have biases
whose gradients cancel over the batch to 1e-9-1e-13 per element beside healthy weights: they
were "vanishing"; a bias now vanishes only with its weight.

Ground truth: the same logs judged by the rules before (no gate; each bias judged alone)
alert. Runs on the leg with timm and torchvision (scripts/test.sh: the torch 2.14 leg)."""

from __future__ import annotations

import pytest
import torch

timm = pytest.importorskip("timm", reason="needs timm (the torch 2.14 leg installs it)")
torchvision = pytest.importorskip("torchvision", reason="needs torchvision (the 2.14 leg)")

import gradscope as gs  # noqa: E402
from gradscope.monitor.alerts import alerts  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _before(monkeypatch) -> None:
    """The rules without three of this round's guards: no significance gate, each bias
    judged alone, and a window full after 5 steps whose median is then kept 5 steps (every
    window's median was, the first 25 steps included). The log keeps its vanishing level."""
    monkeypatch.setattr("gradscope.monitor.alerts.SPIKE_SIGNIFICANT", 0.0)
    monkeypatch.setattr("gradscope.monitor.alerts._weight_of", lambda name: name)
    monkeypatch.setattr("gradscope.monitor.alerts._SPIKE_WINDOW", 5)


def _classify(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int) -> gs.GradMonitor:
    """``steps`` healthy steps on random 64x64 images and labels, every one logged with its
    loss."""
    with gs.GradMonitor(model, optimizer=opt) as mon:
        for _ in range(steps):
            x, y = torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            mon.observe_loss(loss)
            loss.backward()
            opt.step()
    return mon


def _train(optimizer: str, steps: int = 12) -> gs.GradMonitor:
    torch.manual_seed(0)
    model = timm.create_model("convnext_atto", pretrained=False, num_classes=10)
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-3) if optimizer == "adamw" else
           torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9))
    return _classify(model, opt, steps)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_a_convnext_branch_waking_up_is_not_exploding(optimizer, monkeypatch):
    mon = _train(optimizer)
    assert [a for a in mon.alerts if a.kind == "exploding"] == []
    _before(monkeypatch)
    before = [a for a in alerts(mon.log) if a.kind == "exploding"]
    assert before and all(".blocks." in n for a in before for n in a.names), before


def test_a_bias_behind_a_normalisation_is_not_vanishing(monkeypatch):
    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(num_classes=10)
    mon = _classify(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), 6)
    assert [a for a in mon.alerts if a.kind == "vanishing"] == []
    _before(monkeypatch)
    before = [a for a in alerts(mon.log) if a.kind == "vanishing"]
    assert before and all(n.endswith(".bias") for a in before for n in a.names), before


def test_a_bert_key_bias_is_not_vanishing(monkeypatch):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.BertForMaskedLM(transformers.BertConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128,
        vocab_size=128))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    with gs.GradMonitor(model, optimizer=opt) as mon:
        for _ in range(4):
            ids = torch.randint(0, 128, (4, 16))
            opt.zero_grad()
            loss = model(input_ids=ids, labels=ids).loss
            mon.observe_loss(loss)
            loss.backward()
            opt.step()
    assert mon.alerts == []
    _before(monkeypatch)
    (before,) = [a for a in alerts(mon.log) if a.kind == "vanishing"]
    assert all(n.endswith("attention.self.key.bias") for n in before.names), before
