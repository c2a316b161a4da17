"""Spikes: a logged step whose gradient norm, loss or update ratio jumps far above its median
(``gradscope.monitor.spikes``) gives one alert and one ``Incident(kind="spike")`` per event.

Ground truth: the planted spike's step (one example of one batch scaled x1000), a healthy run
with warm-up and a cosine schedule that raises nothing, and training that stays bitwise the
same as without a monitor. The transfer count is in ``test_transfers.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import gradscope as gs

K = 40  # the spiking step
B = 16


pytestmark = pytest.mark.usefixtures("one_thread")


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, 1))


def _data(steps: int, plant: int | None = None, row: int = 5):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 1, generator=g)
    out = []
    for step in range(steps):
        x = torch.randn(B, 8, generator=g)
        y = x @ w + 0.1 * torch.randn(B, 1, generator=g)
        if step == plant:
            x[row] *= 1000
        out.append((x, y))
    return out


def _train(model, data, *, mon_options: dict | None = None, loss_shift: dict | None = None,
           schedule: bool = False):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = None
    if schedule:  # linear warm-up, then cosine
        steps = len(data)

        def lr(i: int) -> float:
            return (i + 1) / 20 if i < 20 else 0.5 * (1 + math.cos(math.pi * (i - 20) / steps))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr)
    mon = gs.GradMonitor(model, optimizer=opt, **mon_options) if mon_options is not None else None
    for step, (x, y) in enumerate(data):
        opt.zero_grad()
        loss = (model(x) - y).square().mean()
        if loss_shift and step in loss_shift:  # a loss spike without a gradient spike
            loss = loss + loss_shift[step]
        if mon is not None:
            mon.observe_loss(loss)
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
    if mon is not None:
        mon.remove()
    return mon


def test_planted_spike_is_detected_once_at_its_step(tmp_path) -> None:
    mon = _train(_model(), _data(60, plant=K), mon_options={"jsonl": tmp_path / "s.jsonl"})
    spikes = [a for a in mon.alerts if a.kind == "spike"]
    assert [(a.step, a.name) for a in spikes] == [(K, "grad_norm")]
    (inc,) = [i for i in mon.incidents if i.kind == "spike"]
    assert inc.step == K and inc.signal == "grad_norm"
    norms = [st.total_norm for st in mon.history]
    base = sorted(norms[K - 30 : K])  # the 30 logged values after the 10 warm-up ones
    assert inc.ratio == pytest.approx(norms[K] / ((base[14] + base[15]) / 2), rel=1e-9)
    assert inc.ratio > 100
    assert inc.steps is not None and inc.steps >= 1
    assert inc.changes and inc.changes[0].module in ("0", "2", "4")
    assert f"spike x{inc.ratio:.3g} at step {K}" in inc.summary()
    # the JSON Lines log, streamed and written after, round-trips the incident
    streamed = gs.read_jsonl(tmp_path / "s.jsonl")
    written = gs.read_jsonl(mon.to_jsonl(tmp_path / "w.jsonl"))
    for log in (streamed, written):
        (back,) = [i for i in log.incidents if i.kind == "spike"]
        assert back == inc
        assert [st.loss for st in log.steps] == [st.loss for st in mon.history]
    text = _render(mon.report())
    assert f"spike x{inc.ratio:.3g} at step {K}" in text


def _render(renderable) -> str:
    import io

    from rich.console import Console

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_loss_spike_from_observe_loss() -> None:
    # a constant added to the loss: no gradient change, only the loss jumps
    mon = _train(_model(), _data(40), mon_options={}, loss_shift={30: 1e4})
    assert [(a.step, a.name) for a in mon.alerts if a.kind == "spike"] == [(30, "loss")]
    (inc,) = [i for i in mon.incidents if i.kind == "spike"]
    assert inc.signal == "loss" and inc.steps == 1
    assert mon.history[30].loss == pytest.approx(1e4, rel=1e-3)


def test_no_false_alarm_on_a_healthy_run() -> None:
    mon = _train(_model(), _data(200), mon_options={"full_every": 4}, schedule=True)
    assert [a for a in mon.alerts if a.kind == "spike"] == []
    assert [i for i in mon.incidents if i.kind == "spike"] == []
    assert all(st.loss is not None for st in mon.history)


def test_training_is_bitwise_identical_with_spike_detection() -> None:
    data = _data(50, plant=K)
    plain, watched = _model(), _model()
    _train(plain, data)
    mon = _train(watched, data, mon_options={})
    assert any(i.kind == "spike" for i in mon.incidents)
    for (n, a), b in zip(plain.state_dict().items(), watched.state_dict().values(), strict=True):
        assert torch.equal(a, b), n


def test_spike_none_turns_detection_off(tmp_path, monkeypatch) -> None:
    """``spike=None``: the planted spike raises no spike alert or incident and no per-sample
    replay runs; the loss is still read and logged, the JSON Lines log says so and reads
    back; training is bitwise the plain run's."""
    from gradscope.monitor import incidents

    replays = []  # the replay's own child process, counted (it would name the samples)
    monkeypatch.setattr(incidents, "replay_isolated",
                        lambda fn, **k: replays.append(fn) or incidents.SampleResult())
    data = _data(50, plant=K)
    plain, watched = _model(), _model()
    _train(plain, data)
    mon = _train(watched, data, mon_options={"spike": None, "jsonl": tmp_path / "s.jsonl"})
    assert mon.thresholds.spike is None and mon.log.rules.spikes is None
    assert [a for a in mon.alerts if a.kind == "spike"] == []
    assert [i for i in mon.incidents if i.kind == "spike"] == []
    assert replays == []
    assert mon.history[K].total_norm > 100 * mon.history[K - 1].total_norm  # it was there
    assert all(st.loss is not None for st in mon.history)
    back = gs.read_jsonl(tmp_path / "s.jsonl")
    assert back.thresholds.spike is None and len(back.steps) == 50
    from gradscope.monitor.views import plot_series

    series = plot_series(mon.log)
    assert series["baseline"] == series["limit"] == series["loss_limit"] == []
    for (n, a), b in zip(plain.state_dict().items(), watched.state_dict().values(), strict=True):
        assert torch.equal(a, b), n
    # the same run with detection on replays the spiking step (the patch above is seen)
    _train(_model(), data, mon_options={})
    assert len(replays) == 1


@pytest.mark.parametrize("bad", [1.0, 0, -3.0])
def test_a_spike_factor_of_one_or_less_is_refused(bad) -> None:
    with pytest.raises(gs.MonitorError, match="or None: no spike detection"):
        gs.GradMonitor(_model(), spike=bad)


def test_observe_loss_refuses_a_non_scalar() -> None:
    model = _model()
    with gs.GradMonitor(model) as mon, pytest.raises(gs.MonitorError, match="one-element"):
        mon.observe_loss(torch.zeros(3))


# ---------------------------------------------------------------------- which samples
def _truth(data, k: int) -> list[float]:
    """Each example's own gradient norm at step ``k`` (the batch loss is a mean: its part is
    the single example's loss / B), from torch's .grad, on a model trained to ``k`` without
    a monitor."""
    model = _model()
    _train(model, data[:k])
    x, y = data[k]
    out = []
    for i in range(B):
        model.zero_grad()
        ((model(x[i : i + 1]) - y[i : i + 1]).square().sum() / B).backward()
        out.append(math.sqrt(sum(float(p.grad.double().square().sum())
                                 for p in model.parameters())))
    return out


@pytest.mark.parametrize("path", ["vmap", "loop"])
def test_per_sample_norms_equal_single_example_backwards(monkeypatch, path: str) -> None:
    import gradscope.monitor.spike_samples as ss

    if path == "loop":  # the fallback: vmap refused
        def refuse(*args, **kwargs):
            raise RuntimeError("no batching rule")

        monkeypatch.setattr(ss, "_vmap", refuse)
    data = _data(K + 1, plant=K, row=11)
    mon = _train(_model(), data, mon_options={})
    (inc,) = [i for i in mon.incidents if i.kind == "spike"]
    truth = _truth(data, K)
    assert inc.replayed and inc.micro_batch == 0
    assert inc.samples[0].index == 11
    assert [s.index for s in inc.samples] == sorted(range(B), key=lambda i: -truth[i])[:5]
    for s in inc.samples:
        assert s.norm == pytest.approx(truth[s.index], rel=1e-4)
        assert s.share == pytest.approx(truth[s.index] ** 2 / sum(t * t for t in truth),
                                        rel=1e-4)
    assert inc.samples[0].share > 0.99
    assert inc.sample_modules and inc.sample_modules[0].module in ("0", "2", "4")
    assert sum(m.share for m in inc.sample_modules) == pytest.approx(1.0, rel=1e-6)
    assert "sample 11 of micro-batch 0 carries" in inc.summary()


def test_batch_norm_in_train_mode_says_samples_are_coupled() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 1))
    data = _data(K + 1)
    x, y = data[K]
    data[K] = (x, y * 1000)  # a spike whose cause is the targets
    mon = _train(model, data, mon_options={})
    (inc,) = [i for i in mon.incidents if i.kind == "spike"]
    assert inc.samples == [] and not inc.replayed
    assert inc.note is not None and "coupled" in inc.note and "BatchNorm 1" in inc.note


def test_samples_named_by_the_data_ids() -> None:
    data = _data(K + 1, plant=K, row=3)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with gs.GradMonitor(model, optimizer=opt) as mon:
        for step, (x, y) in enumerate(data):
            opt.zero_grad()
            mon.observe_batch_ids([f"row-{step}-{i}" for i in range(B)])
            (model(x) - y).square().mean().backward()
            opt.step()
    (inc,) = [i for i in mon.incidents if i.kind == "spike"]
    assert (inc.samples[0].index, inc.samples[0].id) == (3, f"row-{K}-3")
    assert f"sample row-{K}-3 of micro-batch 0" in inc.summary()


@pytest.mark.parametrize("planted_in", [0, 1, 2])
@pytest.mark.parametrize("when", ["before", "after"])
def test_each_accumulated_micro_batch_keeps_its_own_ids(planted_in: int, when: str) -> None:
    """Three micro-batches per optimizer step, each given its ids before its forward (a loop)
    or after it (a framework that reads the batch it just ran): the replayed micro-batch's
    top sample is named by its own id, whichever of the three carries the planted row."""
    data = _data(3 * (K + 1))
    x, _ = data[3 * K + planted_in]
    x[3] *= 1000
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with gs.GradMonitor(model, optimizer=opt) as mon:
        for step in range(K + 1):
            opt.zero_grad()
            for j in range(3):
                x, y = data[3 * step + j]
                ids = [f"row-{step}-{j}-{i}" for i in range(B)]
                if when == "before":
                    mon.observe_batch_ids(ids)
                out = model(x)
                if when == "after":
                    mon.observe_batch_ids(ids)
                ((out - y).square().mean() / 3).backward()
            opt.step()
    (inc,) = [i for i in mon.incidents if i.kind == "spike"]
    assert inc.micro_batch == planted_in
    assert (inc.samples[0].index, inc.samples[0].id) == (3, f"row-{K}-{planted_in}-3")


def test_without_optimizer_the_spike_is_detected_and_not_replayed() -> None:
    data = _data(K + 1, plant=K)
    model = _model()
    with gs.GradMonitor(model) as mon:
        for x, y in data:
            model.zero_grad()
            (model(x) - y).square().mean().backward()
    (inc,) = [i for i in mon.incidents if i.kind == "spike"]
    assert inc.step == K and inc.samples == [] and not inc.replayed
    assert inc.note is not None and inc.note.startswith("no per-sample norms: without optimizer=")


def test_a_spike_of_the_whole_batch_has_no_dominant_sample() -> None:
    data = _data(K + 1)
    x, y = data[K]
    data[K] = (x * 1000, y)  # every example: the cause is not one of them
    mon = _train(_model(), data, mon_options={})
    (inc,) = [i for i in mon.incidents if i.kind == "spike"]
    assert inc.replayed and inc.samples[0].share < 0.5
    assert inc.note is not None and inc.note.startswith("no single example carries the spike")


def test_a_spike_of_a_sharded_model_says_why_it_has_no_per_sample_norms() -> None:
    """Sharded (DTensor) parameters are replayed by every rank together for a NaN; per-sample
    gradients are not computed for them, and the note says so (not the NaN replay's line)."""
    from gradscope.monitor.spike_samples import replay_samples

    class Sharded:  # what replay_samples reads of a Replayer on one rank of an FSDP2 job
        def together(self) -> bool:
            return True

        def why_not_alone(self) -> str:
            return "not replayed: a model with sharded (DTensor) parameters gathers ..."

        def why_not(self) -> None:
            return None

    res = replay_samples(Sharded())
    assert res.samples == [] and res.note == (
        "no per-sample norms: per-sample gradients of sharded (DTensor) parameters are not "
        "computed (the forward gathers them from the other ranks)")
