"""One device-to-host transfer per logged step, none on the others, in every set-up: with and
without ``optimizer=``, the replay on (its decision comes from the same transfer), alerts and
an incident, JSON Lines streaming, a GradScaler, full statistics on every step (the update
rows of a step whose transfer came before ``optimizer.step()`` ride with the next one).
DDP over gloo is counted in ``test_monitor_dist.py`` (its worker processes).

Every way a tensor's value reaches Python is counted (``item``, ``tolist``, ``cpu``,
``numpy``, ``__bool__``, ``__float__``, ``__int__``, ``__index__``, and ``copy_``/``to`` onto
the CPU are not used by the monitor on CPU tensors); the count of the same loop without a
monitor (torch's own reads, e.g. the GradScaler's) is subtracted.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_monitor import Transfers
from torch import nn

import gradscope as gs

STEPS = 7
EVERY = 3
LOGGED = [1 if i % EVERY == 0 else 0 for i in range(STEPS)]


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 12), nn.Tanh(),
                         nn.Linear(12, 3))


def _batches() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(8, 6, generator=g) for _ in range(STEPS)]


def _per_step(monkeypatch, setup: str, tmp_path, monitor: bool) -> tuple[list[int], object]:
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu") if setup == "scaler" else None
    options: dict = {"every": EVERY}
    if setup != "no_optimizer":
        options["optimizer"] = opt
    if setup == "no_replay":
        options["replay"] = False
    if setup == "full_every_step":
        options["full_every"] = 1
    if setup == "alerts":  # every step's norm is "exploding": alerts and an incident
        options.update(explode=1e-9, modules=True, activations=True)
    if setup == "jsonl":
        options["jsonl"] = tmp_path / "stream.jsonl"
    if scaler is not None:
        options["scaler"] = scaler
    mon = gs.GradMonitor(model, **options) if monitor else None
    counter = Transfers(monkeypatch)
    seen = []
    for x in _batches():
        before = counter.count
        opt.zero_grad()
        loss = model(x).square().mean()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            if setup != "no_optimizer":
                opt.step()
        seen.append(counter.count - before)
    monkeypatch.undo()
    if mon is not None:
        mon.remove()
    return seen, mon


SETUPS = ["no_optimizer", "no_replay", "replay", "full_every_step", "alerts", "jsonl", "scaler"]


@pytest.mark.parametrize("setup", SETUPS)
def test_one_transfer_per_logged_step(monkeypatch, tmp_path, setup: str) -> None:
    plain, _ = _per_step(monkeypatch, setup, tmp_path, monitor=False)
    watched, mon = _per_step(monkeypatch, setup, tmp_path, monitor=True)
    assert [w - p for w, p in zip(watched, plain, strict=True)] == LOGGED
    assert [st.step for st in mon.history] == [0, 3, 6]
    if setup == "alerts":
        assert any(a.kind == "exploding" for a in mon.alerts)
    if setup == "full_every_step":  # the deferred update ratios all arrived
        assert all(ps.update_ratio is not None and math.isfinite(ps.update_ratio)
                   for st in mon.history for ps in st.params.values())
    if setup == "jsonl":
        lines = (tmp_path / "stream.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in lines] == [0, 3, 6]


def test_deferred_update_ratios_equal_the_weight_change(monkeypatch) -> None:
    """With the replay on, a full step's update rows are moved with the next transfer (or at
    remove()): the ratios are still those of that step's own update, exactly."""
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    want = []
    mon = gs.GradMonitor(model, optimizer=opt, full_every=1)
    for x in _batches()[:3]:
        opt.zero_grad()
        model(x).square().mean().backward()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        want.append({n: ((p.detach() - before[n]).norm() / before[n].norm()).item()
                     for n, p in model.named_parameters()})
    assert mon.history[-1].params["0.weight"].update_ratio is None  # still on the device
    log = mon.log  # reading the log moves it
    assert log.steps[-1].params["0.weight"].update_ratio is not None
    mon.remove()
    for st, truth in zip(mon.history, want, strict=True):
        for name, ps in st.params.items():
            assert ps.update_ratio == pytest.approx(truth[name], rel=1e-5), (st.step, name)


def test_one_transfer_per_logged_step_with_spikes_and_the_loss(monkeypatch) -> None:
    """``observe_loss`` and spike detection ride in the same transfer; a detected spike (the
    loss of one step scaled x1000) costs one more, on that step only, when the per-sample
    replay runs in this process (its one read of the norms; none in a forked child)."""
    from gradscope.monitor.replay_isolated import fork_refused

    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    data = [torch.randn(8, 6, generator=g) for _ in range(12)]
    counts = {}
    for monitor in (False, True):
        model = _mlp()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        mon = (gs.GradMonitor(model, optimizer=opt, spike_warmup=0, full_every=1)
               if monitor else None)
        counter = Transfers(monkeypatch)
        seen = []
        for step, x in enumerate(data):
            before = counter.count
            opt.zero_grad()
            loss = model(x).square().mean() * (1000 if step == 9 else 1)
            if mon is not None:
                mon.observe_loss(loss)
            loss.backward()
            opt.step()
            seen.append(counter.count - before)
        monkeypatch.undo()
        counts[monitor] = seen
        if mon is not None:
            mon.remove()
            spikes = [(i.kind, i.step) for i in mon.incidents if i.kind == "spike"]
            assert spikes == [("spike", 9)]
            assert all(st.loss is not None for st in mon.history)
    extra = 0 if fork_refused() is None else 1
    want = [1 + extra if step == 9 else 1 for step in range(12)]
    assert [w - p for w, p in zip(counts[True], counts[False], strict=True)] == want
