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


# ------------------------------------------------- training loops people write on purpose
def _gan(zero_to_none: bool) -> gs.Doctor:
    """A DCGAN-style loop: the generator's backward goes through D and adds to D's gradients
    after D's step; D's next zero_grad() clears them before they are used."""
    torch.manual_seed(0)
    gen, disc = torch.nn.Linear(4, 8), torch.nn.Sequential(torch.nn.Linear(8, 1))
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.1)
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.1)
    model = torch.nn.ModuleDict({"gen": gen, "disc": disc})
    with gs.doctor(model, optimizer=opt_d) as doc:
        for _ in range(3):
            fake = gen(torch.randn(5, 4))
            opt_d.zero_grad(set_to_none=zero_to_none)
            (disc(torch.randn(5, 8)).mean() - disc(fake.detach()).mean()).backward()
            opt_d.step()
            opt_g.zero_grad(set_to_none=zero_to_none)
            disc(fake).mean().backward()
            opt_g.step()
    return doc


@pytest.mark.parametrize("zero_to_none", [True, False])
def test_a_gan_loop_has_no_findings(zero_to_none):
    assert _gan(zero_to_none).findings == []


def test_autograd_grad_and_frozen_layers_after_a_step_add_to_no_gradient():
    """Backward calls after a step that reach no stale .grad: torch.autograd.grad (a gradient
    penalty) and a loss through frozen layers only."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(net[1].parameters(), lr=0.1)
    net[0].requires_grad_(False)
    with gs.doctor(net, optimizer=opt) as doc:
        for _ in range(2):
            opt.zero_grad()
            net(torch.randn(4, 3)).pow(2).mean().backward()
            opt.step()
            x = torch.randn(4, 3, requires_grad=True)
            (g,) = torch.autograd.grad(net(x).sum(), x, create_graph=True)
            g.pow(2).sum().backward(inputs=[x])  # the penalty's gradient to the input only
    assert doc.findings == []


def test_frozen_submodules_in_eval_mode_are_intended():
    """A linear probe on a frozen backbone kept in eval() (its BatchNorm and Dropout), and a
    distillation teacher in eval(): neither is trained by the step."""
    torch.manual_seed(0)
    backbone = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8),
                                   torch.nn.Dropout(0.2))
    teacher = torch.nn.Sequential(torch.nn.Linear(6, 2), torch.nn.Dropout(0.2))
    model = torch.nn.ModuleDict({"backbone": backbone, "head": torch.nn.Linear(8, 2),
                                 "teacher": teacher})
    backbone.requires_grad_(False)
    teacher.requires_grad_(False)
    opt = torch.optim.SGD(model["head"].parameters(), lr=0.1)
    backbone.eval()
    teacher.eval()
    with gs.doctor(model, optimizer=opt) as doc:
        for _ in range(2):
            x = torch.randn(4, 6)
            opt.zero_grad()
            loss = (model["head"](backbone(x)) - teacher(x)).pow(2).mean()
            loss.backward()
            opt.step()
    assert doc.findings == []


def test_the_same_loops_with_the_slips_are_found():
    """Ground truth for the three above: no zero_grad at all (each step uses the sum), and
    the whole model left in eval() (dropout off inside the trained layers)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Dropout(0.5),
                              torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    net.eval()
    with gs.doctor(net, optimizer=opt) as doc:
        for _ in range(3):
            net(torch.randn(4, 3)).pow(2).mean().backward()
            opt.step()
    kinds = sorted(f.kind for f in doc.findings)
    assert kinds == ["eval_mode", "grads_accumulate"], [str(f) for f in doc.findings]
    (acc,) = [f for f in doc.findings if f.kind == "grads_accumulate"]
    assert "3 parameters" not in acc.message and "4 parameters" in acc.message
