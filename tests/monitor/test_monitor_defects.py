"""Monitor defects of issue 29's adversarial pass, each reproduced: a refused monitor leaves an
existing log alone (2), float64 norms exact from 1e-300 to 1e300 (10), a removed monitor that
shared a GradScaler records nothing more (11), a gradient that flaps is one event (19), a
monitor entered twice ends at the outer exit (27)."""

from __future__ import annotations

import math
import tracemalloc

import pytest
import torch
from torch import nn

import gradscope as gs


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))


# ---------------------------------------------------------------- 2: jsonl= and refusals
@pytest.mark.parametrize(
    "bad", [{"modules": ["nowhere"]}, {"loss_fn": 3}, {"every": 0}, {"params": "nothing*"}]
)
def test_a_refused_monitor_leaves_an_existing_log_as_it_was(tmp_path, bad) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text('{"step": 0}\n')
    with pytest.raises(gs.MonitorError):
        gs.GradMonitor(_mlp(), jsonl=log, **bad)
    assert log.read_text() == '{"step": 0}\n'


def test_an_accepted_monitor_replaces_the_log(tmp_path) -> None:
    log = tmp_path / "run.jsonl"
    log.write_text("old\n")
    model = _mlp()
    with gs.GradMonitor(model, jsonl=log) as mon:
        model(torch.randn(3, 4)).sum().backward()
    assert [st.step for st in gs.read_jsonl(log).steps] == [0] == [st.step for st in mon.history]


# ---------------------------------------------------------------- 10: float64 extremes
@pytest.mark.parametrize("scale", [1e300, 1e200, 1e-200, 1e-300])
def test_float64_norms_are_exact_at_the_extremes(scale: float) -> None:
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(64, dtype=torch.float64))
    b = nn.Parameter(torch.randn(3, dtype=torch.float64))
    model = nn.Module()
    model.w, model.b = w, b
    gw = torch.randn(64, dtype=torch.float64)
    gb = torch.randn(3, dtype=torch.float64)
    with gs.GradMonitor(model, full_every=1) as mon:
        ((w * gw).sum() * scale + (b * gb).sum() * scale).backward()
    (st,) = mon.history
    truth = {"w": gw.norm().item() * scale, "b": gb.norm().item() * scale}
    for name, want in truth.items():
        assert st.params[name].norm == pytest.approx(want, rel=1e-12), name
        assert st.params[name].nan == st.params[name].inf == 0
    total = math.hypot(truth["w"], truth["b"])
    assert st.total_norm == pytest.approx(total, rel=1e-12)
    assert not mon.alerts or all(a.kind not in ("nan", "inf") for a in mon.alerts)
    assert not any(i.kind == "nonfinite" for i in mon.incidents)


# ---------------------------------------------------------------- 11: a shared GradScaler
def test_a_removed_monitor_sharing_a_scaler_records_nothing_more() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**70)  # the first steps overflow

    def step() -> None:
        opt.zero_grad()
        scaler.scale(model(torch.randn(3, 4)).square().sum()).backward()
        scaler.step(opt)
        scaler.update()

    first = gs.GradMonitor(model, optimizer=opt, scaler=scaler)
    second = gs.GradMonitor(model, optimizer=opt, scaler=scaler)
    step()
    first.remove()
    for _ in range(3):
        step()
    second.remove()
    assert [st.step for st in first.history] == [0]
    assert [st.step for st in second.history] == [0, 1, 2, 3]
    assert "update" not in scaler.__dict__  # both unwrapped
    step()  # and nothing records after both are gone
    assert len(second.history) == 4


# ---------------------------------------------------------------- 19: a flapping gradient
def _flap(steps: int, **options) -> tuple[gs.GradMonitor, int]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    keep = [p.detach().clone() for p in model.parameters()]
    mon = gs.GradMonitor(model, optimizer=opt, history=8, **options)
    tracemalloc.start()
    peak_after = 0
    for i in range(steps):
        opt.zero_grad()
        x = torch.randn(3, 4)
        if i % 2:  # every other batch holds a NaN
            x[0, 0] = math.nan
        model(x).sum().backward()
        opt.step()
        with torch.no_grad():  # the weights put back (as a loop that skips bad steps would)
            for p, k in zip(model.parameters(), keep, strict=True):
                p.copy_(k)
        if i == steps // 4:
            tracemalloc.reset_peak()
    peak_after = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    mon.remove()
    return mon, peak_after


def test_a_nan_every_other_step_is_one_event_with_a_count() -> None:
    mon, _ = _flap(400)
    assert [a.kind for a in mon.alerts if a.kind in ("nan", "inf")] == ["nan"]
    (inc,) = mon.incidents
    assert inc.kind == "nonfinite" and inc.step == 1
    assert inc.repeats == 199 and inc.last_step == 399
    assert "and 199 more non-finite steps up to step 399" in inc.summary()


def test_a_streamed_log_reads_back_the_event_and_its_count(tmp_path) -> None:
    mon, _ = _flap(40, jsonl=tmp_path / "run.jsonl")
    log = gs.read_jsonl(tmp_path / "run.jsonl")
    assert log.incidents == mon.incidents and log.incidents[0].repeats == 19
    assert [a.kind for a in log.alerts] == [a.kind for a in mon.alerts]


def test_a_flapping_gradient_keeps_memory_bounded() -> None:
    _, short = _flap(200)
    _, long = _flap(800)
    assert long < short + 64 * 1024  # the alerts, incidents and history do not grow


def test_a_nan_after_a_quiet_stretch_is_a_new_event() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    keep = [p.detach().clone() for p in model.parameters()]
    mon = gs.GradMonitor(model, optimizer=opt, replay=False)
    bad = {2, 30}
    for i in range(40):
        opt.zero_grad()
        out = model(torch.randn(3, 4))
        (out * (math.nan if i in bad else 1.0)).sum().backward()
        opt.step()
        with torch.no_grad():
            for p, k in zip(model.parameters(), keep, strict=True):
                p.copy_(k)
    mon.remove()
    assert [a.step for a in mon.alerts if a.kind == "nan"] == [2, 30]
    assert [(i.step, i.repeats) for i in mon.incidents] == [(2, 0), (30, 0)]


# ---------------------------------------------------------------- 27: entered twice
def test_a_monitor_entered_twice_ends_at_the_outer_exit() -> None:
    model = _mlp()
    mon = gs.GradMonitor(model)
    with mon:
        with mon:  # a helper that enters the monitor it was given
            model(torch.randn(3, 4)).sum().backward()
        for i in range(5):
            x = torch.full((3, 4), math.nan) if i == 4 else torch.randn(3, 4)
            model(x).sum().backward()
    assert [st.step for st in mon.history] == list(range(6))
    assert any(a.kind == "nan" and a.step == 5 for a in mon.alerts)
    model(torch.randn(3, 4)).sum().backward()  # removed at the outer exit
    assert len(mon.history) == 6


def test_thresholds_group_the_six_keywords():
    """``thresholds=Thresholds(...)`` is the six keywords in one value: the same thresholds,
    the optimizer's eps still lowering ``vanish`` when it is left to it; both at once refused."""
    import pytest
    import torch

    import gradscope as gs

    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    with gs.GradMonitor(model, optimizer=opt, explode=50.0, spike=None) as by_keywords:
        pass
    grouped = gs.Thresholds(explode=50.0, spike=None)
    with gs.GradMonitor(model, optimizer=opt, thresholds=grouped) as by_value:
        pass
    assert by_value.thresholds == by_keywords.thresholds
    assert by_value.thresholds.vanish == 1e-8  # AdamW's eps, as with the keywords
    with pytest.raises(gs.MonitorError, match="thresholds= and explode=50.0"):
        gs.GradMonitor(model, thresholds=grouped, explode=50.0)
    with pytest.raises(gs.MonitorError, match="give a gradscope.Thresholds"):
        gs.GradMonitor(model, thresholds={"explode": 50.0})


@pytest.mark.parametrize("kwargs", [{"spike": "10"}, {"spike_window": "5"}, {"spike": True}])
def test_a_threshold_of_the_wrong_type_is_a_monitor_error(kwargs):
    """``GradMonitor(spike="10")`` raised Python's own TypeError from a comparison."""
    import torch

    import gradscope as gs

    with pytest.raises(gs.MonitorError, match="give a factor above 1"):
        gs.GradMonitor(torch.nn.Linear(2, 2), **kwargs)


def test_a_float64_loss_beyond_float32_is_logged_as_it_is():
    """A float64 loss of 1e39 was cast to float32 on its way to the host: logged as inf."""
    import torch

    import gradscope as gs

    model = torch.nn.Linear(2, 1).double()
    with gs.GradMonitor(model) as mon:
        loss = model(torch.ones(3, 2, dtype=torch.float64)).sum() * 0 + 1e39
        mon.observe_loss(loss)
        loss.backward()
    assert mon.history[0].loss == pytest.approx(1e39)


def test_parameter_names_are_text_in_the_csv(tmp_path):
    """A parameter named like a spreadsheet formula is written as text ('=...), and a lone
    surrogate in a name does not stop the write (exit 3 before)."""
    import csv

    import torch

    import gradscope as gs

    model = torch.nn.Module()
    model.register_parameter("w", torch.nn.Parameter(torch.ones(2)))
    with gs.GradMonitor(model) as mon:
        (model.w * 2).sum().backward()
    log = mon.log
    st = log.steps[0]
    ps = st.params.pop("w")
    st.params["=cmd|' /C calc'!A0"] = ps
    st.params["bad\udcffname"] = ps
    path = mon.log.to_csv(tmp_path / "g.csv")
    with path.open(encoding="utf-8") as f:
        names = [row["param"] for row in csv.DictReader(f)]
    assert names == ["'=cmd|' /C calc'!A0", "bad\\udcffname"]
