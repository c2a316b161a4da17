"""Every tool that runs the user's step leaves training exactly as it was (issue 47's
adversarial pass): a buffer the forward reassigns (``self.count = self.count + 1``), a
``torch.Generator`` the module owns, Python's and NumPy's RNG, torch's RNG, the optimizer's
state and its hooks (an EMA averaging steps that never happened), parameters and their version
counters (a loss computed before the call still backpropagates), gradients, and an input's
``.grad`` -- compared bitwise with what they were before the call, tool by tool."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from torch import nn

import gradscope as gs


class Counting(nn.Module):
    """A forward with side effects of every kind the tools must not leave behind."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.register_buffer("count", torch.zeros(()))
        self.register_buffer("ema", torch.zeros(4))
        self.gen = torch.Generator().manual_seed(3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        self.count = self.count + 1  # reassigned, not changed in place
        self.ema = 0.9 * self.ema + 0.1 * y.detach().mean(0)
        noise = torch.randn(y.shape, generator=self.gen) * 0.01
        random.random()
        np.random.rand()
        return y + noise + torch.rand(()) * 0


def _state(model, opt, x, hooks):
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "versions": [p._version for p in model.parameters()],
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "buffers": {n: (id(b), b.clone()) for n, b in model.named_buffers()},
        "gen": model.gen.get_state(),
        "torch_rng": torch.get_rng_state(),
        "py_rng": random.getstate(),
        "np_rng": np.random.get_state()[1].copy(),
        "opt_state": {k: {n: (v.clone() if isinstance(v, torch.Tensor) else v)
                          for n, v in st.items()} for k, st in opt.state.items()},
        "hooks": list(hooks),
        "x_grad": None if x.grad is None else x.grad.clone(),
    }


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(u, v) for u, v in zip(a, b))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return a == b


TOOLS = {
    "activation_report": lambda m, o, x: gs.activation_report(m, x),
    "step_memory": lambda m, o, x: gs.step_memory(m, x, optimizer=o),
    "measure_step": lambda m, o, x: gs.measure_step(m, x, optimizer=o),
    "max_batch": lambda m, o, x: gs.max_batch(lambda b: torch.randn(b, 6), m, "64KiB",
                                              optimizer=o, limit=8),
}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_the_tool_leaves_training_exactly_as_it_was(tool):
    torch.manual_seed(0)
    model = Counting()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    hooks: list[str] = []
    opt.register_step_post_hook(lambda *_: hooks.append("step"))
    x = torch.randn(5, 6, requires_grad=True)
    model(x).sum().backward()  # one real step: a .grad, optimizer state, hooks fired
    opt.step()
    pending = model(x).square().mean()  # computed before the call, backpropagated after
    before = _state(model, opt, x, hooks)
    TOOLS[tool](model, opt, x)
    after = _state(model, opt, x, hooks)
    changed = [k for k in before if not _same(before[k], after[k])]
    assert not changed, f"{tool} changed {changed}"
    pending.backward()  # the version counters are as they were: no "modified in place"


#: what the in-process fallback (no fork: CUDA initialised, torch.distributed, Windows, or
#: GRADSCOPE_FORK=0) cannot undo: the optimizer's hooks ran and the version counters of the
#: parameters it stepped moved; max_batch's build_inputs drew from torch's RNG here
IN_PROCESS_LEFT = {"activation_report": set(),
                   "step_memory": {"versions", "hooks"}, "measure_step": {"versions", "hooks"},
                   "max_batch": {"versions", "hooks", "torch_rng"}}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_in_process_the_tool_puts_back_all_it_can_reach(tool, monkeypatch):
    monkeypatch.setenv("GRADSCOPE_FORK", "0")
    torch.manual_seed(0)
    model = Counting()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    hooks: list[str] = []
    opt.register_step_post_hook(lambda *_: hooks.append("step"))
    x = torch.randn(5, 6, requires_grad=True)
    model(x).sum().backward()
    opt.step()
    before = _state(model, opt, x, hooks)
    TOOLS[tool](model, opt, x)
    after = _state(model, opt, x, hooks)
    changed = {k for k in before if not _same(before[k], after[k])}
    assert changed == IN_PROCESS_LEFT[tool]
