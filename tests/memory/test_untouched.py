"""Every memory tool that runs the user's forward or step leaves training exactly as it was
(issue 47's adversarial pass): the scenario matrix. One model has every kind of side effect a
forward can have -- a buffer it reassigns (``self.ema = 0.9 * self.ema + ...``), a counter
buffer and a plain counter attribute it reassigns, a ``torch.Generator`` it owns, dropout
drawing from torch's global RNG, Python's and NumPy's RNG -- with an optimizer that has
stepped once (state) and has step hooks (its own and a global one: an EMA or a monitor on it
would count steps that never happened), and an input that requires grad and holds a ``.grad``.
Each tool is called, and everything is compared bitwise (``torch.equal``, version counters
through ``torchcompat.tensor_version``, object identity) with what it was before: in a forked
child (the default) nothing may change; in process (``GRADSCOPE_FORK=0``: what CUDA or
torch.distributed force) only what the module's docstring says cannot be undone."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gradscope as gs
from gradscope._torch.torchcompat import tensor_version


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 64)
        self.b = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.tanh(self.a(x)))


class Scenario(nn.Module):
    """A forward with side effects of every kind the tools must not leave behind."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*[Block() for _ in range(3)])
        self.drop = nn.Dropout(0.5)  # torch's global RNG
        self.head = nn.Linear(16, 4)
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("ema", torch.zeros(4))
        self.gen = torch.Generator().manual_seed(3)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.head(self.drop(self.blocks(x)))
        self.count = self.count + 1  # reassigned, not changed in place
        self.calls = self.calls + 1  # a plain attribute, reassigned
        self.ema = 0.9 * self.ema + 0.1 * y.detach().mean(0)
        random.random()
        np.random.rand()
        return y + torch.randn(y.shape, generator=self.gen) * 0.01


def _loss(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out, target)


def _state(model: Scenario, opt: torch.optim.Optimizer, x: torch.Tensor,
           hooks: list[str]) -> dict[str, object]:
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "versions": [tensor_version(p) for p in model.parameters()],
        "grads": [(id(p.grad), p.grad.clone()) for p in model.parameters()],
        "buffers": {n: (id(b), b.clone(), tensor_version(b)) for n, b in model.named_buffers()},
        "attributes": (model.calls, sorted(vars(model))),
        "generator": model.gen.get_state(),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
        "numpy_rng": _numpy_state(),
        "optimizer": ([{n: (v.clone(), tensor_version(v)) if isinstance(v, torch.Tensor) else v
                        for n, v in st.items()} for st in opt.state.values()],
                      [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]),
        "hooks": list(hooks),
        "input_grad": (id(x.grad), x.grad.clone(), tensor_version(x)),
    }


def _numpy_state() -> tuple[object, ...]:
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    return keys.copy(), pos, has_gauss, gauss


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k])
                                                                    for k in a)
    if isinstance(a, (list, tuple)):
        return (isinstance(b, (list, tuple)) and len(a) == len(b)
                and all(_same(u, v) for u, v in zip(a, b)))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def _target(batch: int) -> torch.Tensor:
    return torch.randint(0, 4, (batch,))


BATCH = 256
TARGET = torch.arange(BATCH) % 4


TOOLS = {
    "activation_report": lambda m, o, x: gs.activation_report(m, x, batch_scale=2.0),
    "plan_checkpoints": lambda m, o, x: gs.plan_checkpoints(m, x, budget="60%"),
    "plan_checkpoints_peak": lambda m, o, x: gs.plan_checkpoints(
        m, x, budget="85%", target="peak", optimizer=o),
    "verify": lambda m, o, x: gs.plan_checkpoints(
        m, x, report=gs.activation_report(m, x), budget="60%").verify(m, x),
    "measure_forward": lambda m, o, x: gs.measure_forward(m, x),
    "step_memory": lambda m, o, x: gs.step_memory(m, x, optimizer=o, loss_fn=_loss,
                                                  target=TARGET),
    "measure_step": lambda m, o, x: gs.measure_step(m, x, optimizer=o),
    "max_batch": lambda m, o, x: gs.max_batch(lambda b: torch.randn(b, 16), m, "64KiB",
                                              optimizer=o, loss_fn=_loss,
                                              build_target=_target, limit=8),
}

#: what the in-process run cannot undo: the optimizer's step changes the parameters in place,
#: and copying their values back moves their version counters (a loss computed before the
#: call then fails on backward()); everything else is put back
IN_PROCESS_LEFT = {"plan_checkpoints_peak": {"versions"}, "step_memory": {"versions"},
                   "measure_step": {"versions"}, "max_batch": {"versions"}}


def _trained(hooks: list[str]) -> tuple[Scenario, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    model = Scenario()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt.register_step_pre_hook(lambda *_: hooks.append("pre"))
    opt.register_step_post_hook(lambda *_: hooks.append("post"))
    x = torch.randn(BATCH, 16, requires_grad=True)
    model(x).sum().backward()  # one real step: .grad everywhere, optimizer state, hooks fired
    opt.step()
    model(x).sum().backward()  # the next step's gradients, not yet applied
    return model, opt, x


@pytest.fixture
def global_hook():
    """A global optimizer step hook (``register_optimizer_step_post_hook``), removed after the
    test."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    fired: list[str] = []
    handle = register_optimizer_step_post_hook(
        lambda *_: fired.append("global"))
    yield fired
    handle.remove()


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_the_tool_leaves_training_exactly_as_it_was(tool, global_hook):
    hooks: list[str] = []
    model, opt, x = _trained(hooks)
    pending = model(x).square().mean()  # computed before the call, backpropagated after
    before = _state(model, opt, x, hooks + global_hook)
    TOOLS[tool](model, opt, x)
    after = _state(model, opt, x, hooks + global_hook)
    changed = [k for k in before if not _same(before[k], after[k])]
    assert not changed, f"{tool} changed {changed}"
    pending.backward()  # the version counters are as they were: no "modified in place"


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_in_process_the_tool_puts_back_all_it_can_reach(tool, monkeypatch, global_hook):
    monkeypatch.setenv("GRADSCOPE_FORK", "0")
    hooks: list[str] = []
    model, opt, x = _trained(hooks)
    before = _state(model, opt, x, hooks + global_hook)
    TOOLS[tool](model, opt, x)
    after = _state(model, opt, x, hooks + global_hook)
    changed = {k for k in before if not _same(before[k], after[k])}
    assert changed == IN_PROCESS_LEFT.get(tool, set())


def test_the_scenario_does_change_everything_the_matrix_compares(global_hook):
    """The matrix can fail: one plain training step changes each thing it compares."""
    hooks: list[str] = []
    model, opt, x = _trained(hooks)
    before = _state(model, opt, x, hooks + global_hook)
    _loss(model(x), _target(len(x))).backward()
    opt.step()
    after = _state(model, opt, x, hooks + global_hook)
    assert {k for k in before if _same(before[k], after[k])} == set()


def test_in_process_attributes_the_forward_adds_are_removed(monkeypatch):
    """An attribute the forward creates (a cache) is gone again, one it reassigns is the very
    object it was, and a plain tensor attribute changed in place has its values back."""
    monkeypatch.setenv("GRADSCOPE_FORK", "0")

    class Caching(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.cache = x.detach()
            self.stats.add_(1)
            self.tag = ("seen",)
            return super().forward(x)

    model = Caching(4, 2)
    model.stats = torch.zeros(3)
    model.tag = ("new",)
    tag, stats = model.tag, model.stats
    gs.step_memory(model, torch.randn(5, 4))
    assert not hasattr(model, "cache")
    assert model.tag is tag and model.stats is stats and torch.equal(stats, torch.zeros(3))


class Appending(nn.Linear):
    """A forward that appends to a list attribute, fills a dict, registers a buffer the first
    time it runs, and scales its second input in place."""

    def __init__(self) -> None:
        super().__init__(4, 2)
        self.history: list[float] = [1.0]
        self.seen: dict[str, int] = {}

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        self.history.append(float(x.sum()))
        self.seen["calls"] = self.seen.get("calls", 0) + 1
        if not hasattr(self, "lazy"):
            self.register_buffer("lazy", torch.ones(2))
        scale.mul_(2)
        return super().forward(x) * scale


@pytest.mark.parametrize("fork", ["1", "0"])
@pytest.mark.parametrize("tool", ["step_memory", "activation_report", "measure_forward"])
def test_containers_new_buffers_and_inputs_changed_in_place_are_put_back(tool, fork,
                                                                         monkeypatch):
    monkeypatch.setenv("GRADSCOPE_FORK", fork)
    model = Appending()
    x, scale = torch.randn(3, 4), torch.full((2,), 3.0)
    history, seen = model.history, model.seen
    {"step_memory": gs.step_memory, "activation_report": gs.activation_report,
     "measure_forward": gs.measure_forward}[tool](model, x, scale)
    assert model.history is history and history == [1.0]
    assert model.seen is seen and seen == {}
    assert not hasattr(model, "lazy") and [n for n, _ in model.named_buffers()] == []
    assert torch.equal(scale, torch.full((2,), 3.0))
