"""No false alarm on healthy outside models: the zoo of ``benchmarks/healthy_zoo.py`` (46 Hugging
Face architectures built from tiny configs, random weights, nothing downloaded: encoders,
decoders, mixtures of experts, encoder-decoders, vision, audio; and the torchvision/timm
models of the first zoo) trained 14 steps under ``gs.GradMonitor(model, optimizer=opt,
modules=True, activations=True)`` (AdamW or SGD, a linear warm-up over 10 steps, the loss
observed), then 2 steps under ``gs.doctor(model, optimizer=opt)``.

Ground truth is the claim itself: a healthy model gets no alert and no finding. The few the
zoo's models really earn (``healthy_zoo.EXPECTED``: a MobileBERT attention whose gradients are
below AdamW's eps, the 2e4 first gradient of DeiT's zeroed class token, Dinov2's mask token
that a classifier never uses, ConvNeXt's layer-scaled branches under SGD) are checked against
plain torch here, and must come when they should. Hugging Face models are skipped where
transformers is absent, the first zoo's where timm or torchvision is (the torch 2.14 leg of
scripts/test.sh has all three)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import healthy_zoo as zoo  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

#: monitored steps (the vanishing patience is 3 logged steps, the exploding window needs 5,
#: the warm-up lasts 10) and steps under the doctor
STEPS, DOCTOR_STEPS = 14, 2


def _needs(name: str) -> None:
    pytest.importorskip("transformers", reason="the zoo's Hugging Face models need transformers")
    if name in zoo.OTHERS:
        pytest.importorskip("timm", reason="the first zoo needs timm (the torch 2.14 leg)")
        pytest.importorskip("torchvision", reason="the first zoo needs torchvision")


def _said(found) -> str:
    return "\n".join(
        f"  alert {f.kind} at step {f.step}: {f.message}" if hasattr(f, "step") else
        f"  finding {f.kind}/{f.reason} ({f.param}): {f.message}" for f in found)


def test_the_zoo_covers_thirty_hugging_face_architectures_of_every_family():
    assert len({n for n in zoo.ZOO if n not in zoo.OTHERS}) >= 30
    assert {f for f, names in zoo.HF.items() if names} == {
        "encoder", "decoder", "moe", "seq2seq", "vision", "audio"}


@pytest.mark.parametrize("name", zoo.ZOO)
def test_a_healthy_model_gets_no_alert_and_no_finding(name):
    _needs(name)
    run = zoo.train(name, STEPS, DOCTOR_STEPS)
    assert all(math.isfinite(v) for v in run.losses), run.losses
    assert len(run.log.steps) == STEPS
    false_alerts = zoo.unexpected(name, run.alerts)
    assert false_alerts == [], f"false alarms on {name}:\n{_said(false_alerts)}"
    false_findings = zoo.unexpected(name, run.findings)
    assert false_findings == [], f"false findings on {name}:\n{_said(false_findings)}"
    # what the model really has comes when it should
    for e in zoo.EXPECTED.get(name, ()):
        if e.source == "alert" and e.step < STEPS:
            assert any(e.matches(a) for a in run.alerts), (e, _said(run.alerts))
        if e.source == "finding":
            assert any(e.matches(f) for f in run.findings), (e, _said(run.findings))


# ---------------------------------------------------------------------------- plain torch
def _plain(name: str, steps: int):
    """``name`` built as the zoo builds it and trained ``steps`` plain steps (no gradscope):
    the model, its optimizer, and per step the learning rate, each parameter's weight before
    the step, its gradient and its update (by name)."""
    torch.manual_seed(0)
    task, kind = zoo.build(name)
    model = task[0]
    model.train()
    opt, sched = zoo.optimizer(model, kind, name)
    params = dict(model.named_parameters())
    log = []
    for _ in range(steps):
        lr = opt.param_groups[0]["lr"]
        before = {n: p.detach().clone() for n, p in params.items()}
        zoo.step(task, opt, sched)  # zero_grad, forward, backward, step: .grad is this step's
        log.append((lr, before,
                    {n: None if p.grad is None else p.grad.detach().clone()
                     for n, p in params.items()},
                    {n: p.detach() - before[n] for n, p in params.items()}))
    return model, opt, log


def _rms(t: torch.Tensor) -> float:
    return (t.norm() / t.numel() ** 0.5).item()


def test_deits_zeroed_class_tokens_really_get_a_huge_first_gradient():
    _needs("deit")
    _, _, [(_, before, grad, _)] = _plain("deit", 1)
    for token in ("cls_token", "distillation_token"):
        assert before[f"deit.embeddings.{token}"].count_nonzero() == 0  # the library's init
        assert grad[f"deit.embeddings.{token}"].norm().item() > 1e3
    assert grad["deit.embeddings.patch_embeddings.projection.weight"].norm().item() < 100


def test_mobilebert_attention_gradients_are_below_adamws_eps_and_decay_moves_them():
    """The query weights' gradients are ~3e-12 per element (AdamW's eps: 1e-8): what AdamW
    moves them by besides its weight decay (lr x wd x w) is below 0.1% of its learning rate,
    where a full step is the learning rate per element."""
    _needs("mobilebert")
    _, opt, log = _plain("mobilebert", 3)
    eps, wd = opt.param_groups[0]["eps"], opt.param_groups[0]["weight_decay"]
    for layer in (0, 1):
        name = f"mobilebert.encoder.layer.{layer}.attention.self.query.weight"
        for lr, before, grad, move in log:
            assert _rms(grad[name]) < 1e-3 * eps
            by_gradient = move[name] + lr * wd * before[name]
            assert _rms(by_gradient) < 1e-3 * lr, (_rms(by_gradient), lr)
            assert _rms(move[name]) > 0.5 * lr * wd * _rms(before[name])  # decay does move it


def test_dinov2s_mask_token_really_gets_no_gradient():
    _needs("dinov2")
    _, _, [(_, _, grad, _)] = _plain("dinov2", 1)
    assert [n for n, g in grad.items() if g is None] == ["dinov2.embeddings.mask_token"]


def test_sgd_cannot_move_convnexts_layer_scaled_branches():
    """Behind a layer scale of 1e-6 the branch's gradients are ~2e-9 per element: SGD's step
    from them (lr x g, momentum adds earlier ones) is ~1e-11 of the weights' size (their weight
    decay moves them more), the head's is over a thousand times as much."""
    _needs("convnext-sgd")
    _, _, log = _plain("convnext-sgd", 3)
    branch, head = "stages.0.blocks.0.conv_dw.weight", "head.fc.weight"
    for lr, before, grad, _ in log:
        assert _rms(grad[branch]) < 1e-8
        moved = lr * _rms(grad[branch]) / _rms(before[branch])
        assert moved < 1e-9
        assert lr * _rms(grad[head]) / _rms(before[head]) > 1e3 * moved
