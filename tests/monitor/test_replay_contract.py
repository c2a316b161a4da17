"""The replay's contract (gradscope/monitor/replay_isolated.py): training with ``replay=True``
ends bitwise where it ends with no monitor and with ``replay=False``, whatever the forward
touches besides tensors, and a replay that cannot be isolated says so in its incident.

One model carries every case issue 29 found the in-process replay changing: a buffer
reassigned out of place, a ``torch.Generator`` the module owns, Python ``random`` and NumPy's
RNG drawn in the forward (LayerDrop), an iterator the forward pulls from, a ``.data`` write to
a parameter, a Python counter, a user forward hook and a user tensor hook. Step ``BAD`` has a
NaN in its batch, so the monitor replays it. Compared after training: parameters, buffers,
optimizer state, torch's CPU RNG, the module's generator, Python's and NumPy's RNG, the
iterator's next value, the counters.
"""

from __future__ import annotations

import itertools
import os
import random

import numpy as np
import pytest
import torch
from torch import nn

import gradscope as gs

STEPS, BAD = 6, 3

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the isolated replay forks")


class Tricky(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.out = nn.Linear(3, 1)
        self.register_buffer("count", torch.zeros(()))
        self.gen = torch.Generator().manual_seed(1)
        self.noise = itertools.count()  # an iterator the forward pulls from
        self.calls = 0
        self.hook_calls = 0
        self.tensor_hook_calls = 0
        self.lin.register_forward_hook(self._hook)

    def _hook(self, module, args, output) -> None:
        self.hook_calls += 1

    def _tensor_hook(self, grad: torch.Tensor) -> None:
        self.tensor_hook_calls += 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.count = self.count + 1  # a buffer reassigned out of place
        k = next(self.noise)
        keep = random.random() < 0.7  # LayerDrop: Python's RNG
        scale = 1.0 + 0.1 * float(np.random.rand())  # NumPy's RNG
        noise = torch.rand(x.shape, generator=self.gen)  # the module's own generator
        h = torch.relu(self.lin(x + 0.01 * noise)) * (1.0 + 0.001 * k)
        if keep:
            h = h * scale
        self.out.bias.data.mul_(0.999)  # a .data write to a parameter in the forward
        h.register_hook(self._tensor_hook)
        return self.out(h)


def _run(monitor: dict | None) -> tuple[dict, list]:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    model = Tricky()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    mon = gs.GradMonitor(model, optimizer=opt, **monitor) if monitor is not None else None
    data = torch.Generator().manual_seed(2)
    for step in range(STEPS):
        x = torch.randn(8, 4, generator=data)
        if step == BAD:
            x[2, 1] = float("nan")
        y = torch.randn(8, 1, generator=data)
        loss = nn.functional.mse_loss(model(x), y)
        if mon is not None:
            mon.target(y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    incidents = list(mon.incidents) if mon is not None else []
    if mon is not None:
        mon.remove()

    def bits(t: torch.Tensor) -> bytes:
        return t.detach().contiguous().numpy().tobytes()

    state = {
        "params": [bits(p) for p in model.parameters()],
        "buffers": [bits(b) for b in model.buffers()],
        "optimizer": [bits(v) for s in opt.state.values() for v in s.values()
                      if isinstance(v, torch.Tensor)],
        "torch_rng": bits(torch.get_rng_state()),
        "generator": bits(model.gen.get_state()),
        "python_rng": random.getstate(),
        "numpy_rng": bits(torch.from_numpy(np.random.get_state()[1].copy())),
        "iterator": next(model.noise),
        "counters": (model.calls, model.hook_calls, model.tensor_hook_calls),
    }
    return state, incidents


@pytest.fixture(scope="module")
def plain() -> dict:
    return _run(None)[0]


def _differences(a: dict, b: dict) -> list[str]:
    return [k for k in a if a[k] != b[k]]


@pytest.mark.parametrize("replay", [False, True], ids=["replay=False", "replay=True"])
def test_training_ends_bitwise_as_without_the_monitor(plain, replay: bool) -> None:
    state, incidents = _run({"replay": replay})
    assert _differences(plain, state) == []
    assert incidents and incidents[0].step == BAD
    if replay:  # and the replay did its work: it found the batch's NaN
        assert incidents[0].replayed, incidents[0].note
        assert incidents[0].phase == "forward", incidents[0]


def test_a_replay_that_cannot_be_isolated_says_so(plain, monkeypatch) -> None:
    """In the process (CUDA initialised, torch.distributed, no fork: simulated here) the
    forward's own Python state runs twice: the incident's note says so, never silently."""
    monkeypatch.setenv("GRADSCOPE_REPLAY_FORK", "0")
    state, incidents = _run({"replay": True})
    assert incidents[0].replayed
    assert "replayed in this process (GRADSCOPE_REPLAY_FORK=0)" in (incidents[0].note or "")
    # the model does exercise the hazard, and what changed is what the note names
    changed = set(_differences(plain, state))
    assert changed and changed <= {
        "params", "buffers", "optimizer", "generator", "python_rng", "numpy_rng", "iterator",
        "counters",
    }


def test_a_replay_child_that_hangs_is_ended() -> None:
    import time

    from gradscope.monitor.replay import ReplayResult
    from gradscope.monitor.replay_isolated import replay_isolated

    def hangs() -> ReplayResult:
        time.sleep(60)
        return ReplayResult()

    start = time.monotonic()
    res = replay_isolated(hangs, timeout=1.0)
    assert time.monotonic() - start < 10
    assert "did not finish within 1 s" in (res.note or "") and not res.replayed


def test_a_replay_child_that_raises_is_a_note() -> None:
    from gradscope.monitor.replay_isolated import replay_isolated

    def raises():
        raise ValueError("boom")

    res = replay_isolated(raises)
    assert res.note == "the replay failed: ValueError: boom"
