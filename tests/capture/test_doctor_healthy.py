"""No false alarms: the doctor on healthy models (the bundled samples, outside models from
tests/outside/models/) finds nothing, and the step's outputs and gradients with the doctor are
bitwise those without it (same RNG state, a deep copy of the model)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from conftest import ROOT, SAMPLES

import gradscope as gs

#: model files of samples/ whose entry point is a module to run (the rest give outputs, or are
#: Function collections); compiled.py and deep_encoder.py take 13-17 s under the doctor here
#: (compilation; a 64-layer encoder), over the per-test budget: `gradscope doctor` on them was
#: run by hand (no findings).
HEALTHY = ["checkpointing", "cnn", "custom_function", "exploding", "inf_backward",
           "leaky_training", "memory_blocks", "mlp", "nan_backward", "nan_forward",
           "nan_training", "transformer", "vanishing", "doctor/healthy"]
OUTSIDE = ROOT / "tests" / "outside" / "models"


def _loss(mf: gs.ModelFile, out):
    loss = mf.loss(out) if callable(mf.get("loss_fn")) else out
    if not isinstance(loss, torch.Tensor):
        loss = sum(t.sum() for _, t in gs.iter_tensors(loss))
    return loss.sum() if loss.numel() != 1 else loss


def _step(mf: gs.ModelFile, module, inputs):
    torch.manual_seed(1234)
    with torch.enable_grad():
        out = mf.run_model(module, inputs)
        _loss(mf, out).backward()
    return out


def check_healthy(path: Path) -> None:
    mf = gs.load_model_file(path)
    module, inputs, _ = mf.build()
    assert module is not None
    twin = copy.deepcopy(module)
    plain = _step(mf, twin, inputs)
    with gs.doctor(module) as doc:
        out = _step(mf, module, inputs)
    assert doc.findings == [], [str(f) for f in doc.findings]
    for (_, a), (_, b) in zip(gs.iter_tensors(out), gs.iter_tensors(plain)):
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
    for (name, p), q in zip(module.named_parameters(), twin.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            assert torch.equal(p.grad.nan_to_num(), q.grad.nan_to_num()), name


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_samples_have_no_findings_and_equal_gradients(name):
    check_healthy(SAMPLES / f"{name}.py")


@pytest.fixture(scope="module")
def transformers():
    found = pytest.importorskip("transformers")  # imported once (seconds), not in a test's call
    from transformers import LlamaForCausalLM, T5ForConditionalGeneration  # noqa: F401

    return found


@pytest.mark.parametrize("name", ["hf_t5", "hf_llama"])
def test_outside_models_have_no_findings(name, transformers):
    check_healthy(OUTSIDE / f"{name}.py")


def test_a_training_loop_on_a_healthy_file_has_no_findings():
    mf = gs.load_model_file(SAMPLES / "mlp.py")
    training = mf.training()
    with gs.doctor(training.model, optimizer=training.optimizer) as doc:
        for _ in range(3):
            training.step(training.next_batch())
    assert doc.findings == [] and doc.steps == 3 and doc.backwards == 3
