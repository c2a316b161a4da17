"""Capture never changes what Dynamo compiles: under every capture context a compiled model
compiles one graph, with no graph break, no recompile (entering or leaving the context) and no
warning, and its gradients are bitwise those of the same compiled model run without gradscope.
Ground truth: ``torch._dynamo.utils.counters`` and torch's own ``.grad``."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

import gradscope as gs

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def breaks_and_graphs() -> tuple[int, int]:
    return sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters()}


CONTEXTS = {
    "scopes": lambda m: gs.scopes(m),
    "record_forward": lambda m: gs.record_forward(),
    "record_forward(check_finite)": lambda m: gs.record_forward(check_finite=True),
    "saved_memory": lambda m: gs.saved_memory(m),
    "GradMonitor": lambda m: gs.GradMonitor(m),
    "GradMonitor(modules, activations)": lambda m: gs.GradMonitor(m, modules=True,
                                                                  activations=True),
    "leak_check": lambda m: gs.leak_check(),
}


@pytest.mark.parametrize("name", sorted(CONTEXTS))
@pytest.mark.parametrize("warm", [False, True], ids=["compiled-inside", "compiled-before"])
def test_capture_adds_no_graph_break_recompile_or_warning(name, warm):
    model = Net()
    opt = torch.compile(model, backend="aot_eager")
    x = torch.randn(8, 6)

    def step() -> dict[str, torch.Tensor]:
        model.zero_grad()
        opt(x).square().mean().backward()
        return grads(model)

    if warm:
        reference = step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a Dynamo or OptimizedModule warning fails the test
        with CONTEXTS[name](model):
            inside = step()
            step()
        after = step()
    if not warm:
        reference = after
    assert breaks_and_graphs() == (0, 1)
    for key in reference:
        assert torch.equal(inside[key], reference[key]), key


def test_record_backward_on_a_compiled_model_adds_nothing():
    model = Net()
    opt = torch.compile(model, backend="aot_eager")
    x = torch.randn(8, 6)
    loss = opt(x).square().mean()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with gs.record_backward(loss, model=model) as rec:
            loss.backward()
    inside = grads(model)
    model.zero_grad()
    opt(x).square().mean().backward()
    assert breaks_and_graphs() == (0, 1)
    assert all(torch.equal(inside[k], v) for k, v in grads(model).items())
    assert "CompiledFunctionBackward" in [s.name for s in rec.steps]


def test_a_sequential_compiled_inside_scopes():
    """``nn.Sequential`` is compiled through Dynamo's inline wrapper, which traces the module's
    own ``__call__`` and with it any global hook: none may be seen."""
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.compile(model, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with gs.scopes(model), gs.record_forward():
            out = opt(torch.randn(4, 6))
        opt(torch.randn(4, 6))
    assert breaks_and_graphs() == (0, 1)
    assert type(out.grad_fn).__name__ == "CompiledFunctionBackward"


def test_scopes_name_the_compiled_module_not_its_wrapper():
    model = Net()
    opt = torch.compile(model, backend="aot_eager")
    with gs.scopes(opt):
        out = opt(torch.randn(4, 6))
    fn = out.grad_fn
    assert fn.metadata["gradscope.module"] == ""  # the model itself, as for an eager forward
    leaves = {n.name for n in gs.trace(out, model=opt).nodes if n.kind == "leaf"}
    assert leaves == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}


def test_a_compiled_submodule_is_a_scope_of_its_parent():
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Linear(6, 6)
            self.body = torch.compile(Net(), backend="aot_eager")

        def forward(self, x):
            return self.body(torch.tanh(self.embed(x)))

    model = Outer()
    with gs.scopes(model):
        out = model(torch.randn(4, 6))
    assert out.grad_fn.metadata["gradscope.module"] == "body"
    assert breaks_and_graphs() == (0, 1)


def test_record_forward_stamps_the_region_with_the_calling_line():
    model = Net()
    opt = torch.compile(model, backend="aot_eager")
    with gs.record_forward():
        out = opt(torch.randn(4, 6))  # the calling line
        loss = out.sum()
    filename, line = out.grad_fn.metadata["gradscope.created_at"]
    assert filename == __file__
    with open(__file__) as f:
        assert "the calling line" in f.read().splitlines()[line - 1]
    assert loss.grad_fn.metadata["gradscope.created_at"][1] == line + 1


def test_check_finite_reports_a_nan_made_inside_a_compiled_module():
    class LogNet(Net):
        def forward(self, x):
            return self.fc2(torch.log(self.fc1(x)))  # log of negatives: NaN

    model = LogNet()
    opt = torch.compile(model, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with gs.scopes(opt), gs.record_forward(check_finite=True) as fw:
            out = opt(torch.randn(8, 6))  # the compiled call
            out.sum()
    assert breaks_and_graphs() == (0, 1)
    bad = fw.first_nonfinite
    assert bad is not None and bad.kind == "nan"
    assert bad.op == "torch.compile region" and bad.node == "CompiledFunctionBackward"
    assert bad.where.endswith("out = opt(torch.randn(8, 6))  # the compiled call")


# ------------------------------------------------------------------ memory on a compiled model
class Deep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.Tanh())
                                      for _ in range(4)])
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(x))


def _loss(out: torch.Tensor) -> torch.Tensor:
    return out.square().mean()


def test_memory_of_a_compiled_model_is_that_of_its_module_under_the_same_names():
    """activation_report and plan_checkpoints on torch.compile(model): the figures of the
    plain model, under its own module names (no ``_orig_mod`` level, no row for the wrapper),
    and no OptimizedModule warning about gradscope's hooks."""
    torch.manual_seed(0)
    model, x = Deep(), torch.randn(16, 32)
    plain = gs.activation_report(model, x, loss_fn=_loss)
    compiled = torch.compile(model, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = gs.activation_report(compiled, x, loss_fn=_loss)
        plan = gs.plan_checkpoints(compiled, x, budget=plain.total * 7 // 10, loss_fn=_loss)

    def rows(r):
        return [(w.path, w.activation_bytes, w.checkpoint_saves, w.recompute_flops)
                for w in r.rows]

    assert rows(report) == rows(plain) and report.total == plain.total
    assert not any("_orig_mod" in w.path for w in report.rows)
    assert plan.modules == gs.plan_checkpoints(model, x, budget=plain.total * 7 // 10,
                                               loss_fn=_loss).modules
    assert plan.modules and not any("_orig_mod" in m for m in plan.modules)


@pytest.mark.parametrize("order", ["compile-then-apply", "apply-then-compile"])
def test_a_plan_applied_to_a_compiled_model_keeps_its_gradients(order):
    """The checkpointed calls run as plain Python between compiled pieces (Dynamo cannot trace
    a checkpoint with a context_fn): the gradients are torch's own, bitwise, and removing the
    plan restores the model."""
    torch.manual_seed(0)
    model, x = Deep(), torch.randn(16, 32)
    plan = gs.plan_checkpoints(model, x, budget=gs.activation_report(
        model, x, loss_fn=_loss).total * 7 // 10, loss_fn=_loss)
    assert plan.modules
    compiled = torch.compile(model, backend="aot_eager")
    _loss(compiled(x)).backward()
    want = grads(model)
    model.zero_grad()
    if order == "compile-then-apply":
        handle = plan.apply(compiled)
    else:
        handle = plan.apply(model)
        compiled = torch.compile(model, backend="aot_eager")
    with handle:
        _loss(compiled(x)).backward()
    got = grads(model)
    assert all(torch.equal(want[n], got[n]) for n in want)
    assert type(model.blocks[0]) is nn.Sequential and "forward" not in vars(model.head)
