"""What a user can get wrong with the memory tools is one line of ``GradscopeError`` (exit 2
on the command line) that says what happened and the fix, never a raw torch or Python error
(issue 47's adversarial pass); what was a crash but is a valid setup is measured, and the
figure is checked against the same step in plain torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gradscope as gs


def _mlp(device: str = "cpu") -> nn.Module:
    torch.manual_seed(0)
    with torch.device(device):
        return nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 10))


def _one_line(excinfo: pytest.ExceptionInfo[BaseException], *words: str) -> str:
    message = str(excinfo.value)
    assert isinstance(excinfo.value, gs.GradscopeError), repr(excinfo.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message
    return message


class WarmAdam(torch.optim.Adam):
    """An optimizer subclass whose constructor takes an argument of its own."""

    def __init__(self, params, warmup: int, lr: float = 1e-3) -> None:
        super().__init__(params, lr=lr)
        self.warmup = warmup

    @torch.no_grad()
    def step(self, closure=None):  # reads its own attribute, as such subclasses do
        for group in self.param_groups:
            group["lr"] = group["lr"] * min(1.0, 1 / self.warmup)
        return super().step(closure)


def test_an_optimizer_subclass_with_its_own_argument_is_measured_on_meta():
    """Rebuilt as ``type(opt)(groups)`` it raised TypeError (missing 'warmup'): the copy keeps
    the class and its attributes. Its step is Adam's, so its figure is Adam's, and both equal
    the real model's measured peak."""
    meta = _mlp("meta")
    x = torch.randn(16, 32, device="meta")
    mine = gs.step_memory(meta, x, optimizer=WarmAdam(meta.parameters(), warmup=10))
    adam = gs.step_memory(meta, x, optimizer=torch.optim.Adam(meta.parameters()))
    assert (mine.first_step, mine.steady_state) == (adam.first_step, adam.steady_state)
    assert mine.optimizer == "WarmAdam"
    real = _mlp()
    on_cpu = gs.step_memory(real, torch.randn(16, 32),
                            optimizer=WarmAdam(real.parameters(), warmup=10))
    assert (mine.first_step, mine.steady_state) == (on_cpu.first_step, on_cpu.steady_state)
    found = gs.max_batch(lambda b: torch.randn(b, 32, device="meta"), meta, "1MiB",
                         optimizer=WarmAdam(meta.parameters(), warmup=10), limit=16)
    assert found.batch == 16


@pytest.mark.parametrize("tool", ["step_memory", "measure_step", "max_batch"])
def test_lbfgs_is_one_line(tool):
    model = _mlp()
    opt = torch.optim.LBFGS(model.parameters())
    call = {
        "step_memory": lambda: gs.step_memory(model, torch.randn(4, 32), optimizer=opt),
        "measure_step": lambda: gs.measure_step(model, torch.randn(4, 32), optimizer=opt),
        "max_batch": lambda: gs.max_batch(lambda b: torch.randn(b, 32), model, "1MiB",
                                          optimizer=opt),
    }[tool]
    with pytest.raises(gs.GradscopeError) as excinfo:
        call()
    _one_line(excinfo, "LBFGS", "closure", "SGD or AdamW")


FROZEN_TOOLS = {
    "step_memory": lambda m, x: gs.step_memory(m, x),
    "step_memory_sgd": lambda m, x: gs.step_memory(
        m, x, optimizer=torch.optim.SGD(m.parameters(), lr=0.1)),
    "measure_step": lambda m, x: gs.measure_step(m, x),
    "max_batch": lambda m, x: gs.max_batch(lambda b: torch.randn(b, 32), m, "1MiB", limit=4),
    "step_memory_loss_fn": lambda m, x: gs.step_memory(m, x, loss_fn=lambda o: o.sum()),
    "activation_report": lambda m, x: gs.activation_report(m, x),
    "plan_checkpoints": lambda m, x: gs.plan_checkpoints(m, x, budget="50%"),
}


@pytest.mark.parametrize("tool", sorted(FROZEN_TOOLS))
def test_an_all_frozen_model_is_one_line(tool):
    """It raised torch's "element 0 of tensors does not require grad" from the backward."""
    model = _mlp().requires_grad_(False)
    with pytest.raises(gs.GradscopeError) as excinfo:
        FROZEN_TOOLS[tool](model, torch.randn(4, 32))
    _one_line(excinfo, "requires grad")


@pytest.mark.parametrize("plan", [5, "0", [0], 2.5, {"0": 1}])
@pytest.mark.parametrize("tool", ["step_memory", "measure_step", "max_batch"])
def test_a_plan_of_the_wrong_type_is_one_line(tool, plan):
    """``plan=5`` raised "'int' object is not iterable"."""
    model = _mlp()
    call = {
        "step_memory": lambda: gs.step_memory(model, torch.randn(4, 32), plan=plan),
        "measure_step": lambda: gs.measure_step(model, torch.randn(4, 32), plan=plan),
        "max_batch": lambda: gs.max_batch(lambda b: torch.randn(b, 32), model, "1MiB",
                                          plan=plan, limit=4),
    }[tool]
    with pytest.raises(gs.GradscopeError) as excinfo:
        call()
    _one_line(excinfo, f"plan={plan!r}", "CheckpointPlan")


def test_a_plan_of_module_names_still_works():
    model = _mlp()
    x = torch.randn(64, 32)
    plan = gs.plan_checkpoints(model, x, budget="60%")
    assert plan.modules
    by_plan = gs.step_memory(model, x, plan=plan)
    assert gs.step_memory(model, x, plan=list(plan.modules)).peak == by_plan.peak
    assert by_plan.plan == plan.modules


def test_a_loss_closing_over_a_meta_target_on_a_meta_model_says_pass_the_target():
    """The meta model is measured on fake CPU tensors: a meta target the loss closes over
    raised FakeTensor's device mismatch from inside step_memory."""
    meta = _mlp("meta")
    ids = torch.zeros(16, dtype=torch.long, device="meta")
    with pytest.raises(gs.GradscopeError) as excinfo:
        gs.step_memory(meta, torch.randn(16, 32, device="meta"),
                       loss_fn=lambda out: F.cross_entropy(out, ids))
    _one_line(excinfo, "the loss function", "captured", "target=")


def test_a_real_target_captured_by_a_meta_models_report_says_pass_the_target():
    meta = _mlp("meta")
    ids = torch.zeros(16, dtype=torch.long)
    with pytest.raises(gs.GradscopeError) as excinfo:
        gs.activation_report(meta, torch.randn(16, 32, device="meta"),
                             loss_fn=lambda out: F.cross_entropy(out, ids))
    _one_line(excinfo, "the loss function", "meta device", "target")


def test_a_meta_target_captured_by_a_real_models_step_says_pass_the_target():
    ids = torch.zeros(16, dtype=torch.long, device="meta")
    with pytest.raises(gs.GradscopeError) as excinfo:
        gs.step_memory(_mlp(), torch.randn(16, 32),
                       loss_fn=lambda out: F.cross_entropy(out, ids))
    _one_line(excinfo, "the loss function", "runs on cpu", "target")


def test_a_forward_mixing_devices_is_named_too():
    class Mixing(nn.Linear):
        def forward(self, x):
            return super().forward(x) + torch.zeros(x.shape[0], 1, device="meta")

    with pytest.raises(gs.GradscopeError) as excinfo:
        gs.step_memory(Mixing(8, 2), torch.randn(4, 8))
    _one_line(excinfo, "the forward")


def test_the_target_passed_with_the_batch_is_measured_as_the_real_step():
    """``target=`` on a meta model (a meta target, or a CPU one) gives the figure the same step
    has on a real model with a real target (the target counted with the inputs), and that is
    what the profiler measures (within its few bytes of bookkeeping)."""
    x, ids = torch.randn(16, 32), torch.arange(16) % 10
    real = _mlp()
    opt = torch.optim.AdamW(real.parameters())
    on_cpu = gs.step_memory(real, x, optimizer=opt, loss_fn=F.cross_entropy, target=ids)
    assert on_cpu.at_peak["inputs"] == x.numel() * 4 + ids.numel() * 8
    first, steady, _ = gs.measure_step(real, x, optimizer=opt, loss_fn=F.cross_entropy,
                                       target=ids)
    assert abs(on_cpu.first_step - first) <= 64 and abs(on_cpu.steady_state - steady) <= 64
    meta = _mlp("meta")
    for target in (ids.to("meta"), ids):
        mem = gs.step_memory(meta, x.to("meta"), optimizer=torch.optim.AdamW(meta.parameters()),
                             loss_fn=F.cross_entropy, target=target)
        assert (mem.first_step, mem.steady_state) == (on_cpu.first_step, on_cpu.steady_state)
    with pytest.raises(gs.GradscopeError) as excinfo:
        gs.step_memory(real, x, target=ids)
    _one_line(excinfo, "loss_fn=")


ARGUMENTS = {
    "report=5": (lambda m, x: gs.plan_checkpoints(m, x, budget="50%", report=5), "report="),
    "batch_scale='x'": (lambda m, x: gs.activation_report(m, x, batch_scale="x"),
                        "batch_scale="),
    "measure_forward(function)": (lambda m, x: gs.measure_forward(lambda t: t, x),
                                  "nn.Module"),
    "build_inputs=None": (lambda m, x: gs.max_batch(None, m, "1MiB"), "build_inputs"),
    "build_target=3": (lambda m, x: gs.max_batch(lambda b: torch.randn(b, 32), m, "1MiB",
                                                 build_target=3), "build_target="),
    "limit='x'": (lambda m, x: gs.max_batch(lambda b: torch.randn(b, 32), m, "1MiB",
                                            limit="x"), "limit="),
    "max_batch(function)": (lambda m, x: gs.max_batch(lambda b: torch.randn(b, 32),
                                                      lambda t: t, "1MiB"), "nn.Module"),
}


@pytest.mark.parametrize("case", sorted(ARGUMENTS))
def test_an_argument_of_the_wrong_type_is_one_line(case):
    """Each raised a raw AttributeError, ValueError or TypeError from inside the tool."""
    call, word = ARGUMENTS[case]
    with pytest.raises(gs.GradscopeError) as excinfo:
        call(_mlp(), torch.randn(4, 32))
    _one_line(excinfo, word)
