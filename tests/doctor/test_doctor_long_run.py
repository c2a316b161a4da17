"""The doctor over a long loop: what it records stays as large as the program's distinct sites
(cut events, backward lines), not the number of steps, and a second backward through a freed
graph many steps later is still explained with the line of the backward that freed it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradscope as gs


def _loop(doc: object, net: nn.Module, opt: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        loss = net(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()  # reads every p.grad under the doctor's mode: a cut site, once
        loss.backward()
        opt.step()


def test_records_do_not_grow_with_the_steps() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    with gs.doctor(net, optimizer=opt) as doc:
        _loop(doc, net, opt, 5)
        mode = doc.mode
        assert mode is not None
        events, runs = len(mode.events), len(doc.backward_lines.lines)
        _loop(doc, net, opt, 200)
        assert (len(mode.events), len(doc.backward_lines.lines)) == (events, runs)
        assert doc.backward_lines.count == 205
    assert doc.findings == []


def test_backward_twice_names_the_freeing_line_after_many_steps() -> None:
    torch.manual_seed(0)
    net = nn.Linear(4, 1)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    with pytest.raises(gs.AutogradError) as err:
        with gs.doctor(net, optimizer=opt) as doc:
            kept = net(torch.randn(2, 4)).sum()
            kept.backward()  # frees kept's graph: the line the finding names
            _loop(doc, net, opt, 50)
            kept.backward()
    finding = err.value.finding
    assert finding.kind == "backward_twice"
    assert "the backward at test_doctor_long_run.py:44" in finding.message, finding.message
