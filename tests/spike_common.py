"""What the spike tests of both callbacks share (``tests/integrations/test_spike_*.py``):
spikes under the callbacks, on real (tiny) Trainer runs on the CPU, offline: one example of
one batch has a label 300 away from the others', so its step's loss and gradient norm jump.

Ground truth: the planted example is known by its id (the data's own, not its position); the
loss the monitor read equals the loss the framework itself logged (HF: ``log_history``;
Lightning: the ``training_step`` output, read by the module); the parameters after training
equal those of the same run without the callback (``torch.equal``); the device-to-host reads
of the run with the callback, minus those of the run without it, are one per logged step
(``tests/monitor/test_monitor.py``'s counter; the per-sample replay runs in a forked child).
"""

from __future__ import annotations

import statistics

import pytest
import torch
from torch import nn

import gradscope as gs

STEPS = 14
BATCH = 4
PLANTED_STEP = 11
PLANTED = PLANTED_STEP * BATCH + 1  # its position in the data
ID0 = 1000  # ids are ID0 + position, so an id is never a position
OPTIONS = {"spike_warmup": 2}

def _items() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(STEPS * BATCH, 6, generator=g)
    y = x[:, :1] * 2.0 + 0.1 * torch.randn(STEPS * BATCH, 1, generator=g)
    y[PLANTED] += 300.0
    return [{"x": x[i], "labels": y[i], "idx": torch.tensor(ID0 + i)} for i in range(len(x))]


class _InOrder(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(_items())


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))


def check_spike(mon: gs.GradMonitor, losses: list[float], rel: float = 1e-4) -> None:
    spikes = [inc for inc in mon.incidents if inc.kind == "spike"]
    assert len(spikes) == 1, [inc.summary() for inc in mon.incidents]
    inc = spikes[0]
    assert inc.step == PLANTED_STEP
    assert inc.samples[0].id == str(ID0 + PLANTED)
    assert inc.samples[0].share > 0.9
    assert [a.kind for a in mon.alerts].count("spike") == 1
    # the monitor's loss is the framework's own, every step; the planted step's loss spikes
    seen = [st.loss for st in mon.history]
    assert seen == pytest.approx(losses, rel=rel)
    base = statistics.median(seen[2:PLANTED_STEP])
    assert seen[PLANTED_STEP] > mon.thresholds.spike * base




def brute_force(net: nn.Module, batch: list[dict[str, torch.Tensor]]) -> dict[str, float]:
    """Each example's own loss alone / B (the batch loss is a mean), backward, the norm of
    ``.grad``: by id."""
    truth = {}
    for b in batch:
        net.zero_grad()
        (nn.functional.mse_loss(net(b["x"][None]), b["labels"][None]) / BATCH).backward()
        truth[str(b["idx"].item())] = torch.nn.utils.get_total_norm(
            [p.grad for p in net.parameters()]).item()
    return truth


def planted_batch() -> list[dict[str, torch.Tensor]]:
    return _items()[PLANTED_STEP * BATCH:(PLANTED_STEP + 1) * BATCH]
