"""The monitor's log as plain data: alert rules replayed over a saved log, bounded history,
streaming to JSON Lines, memory over 100k steps."""

from __future__ import annotations

import gc
import json
import math
import os

import pytest
import torch
from torch import nn

import gradscope as gs
from gradscope.monitor.alerts import AlertRules, alerts
from gradscope.monitor.log import (
    MonitorLog,
    ParamStats,
    StepStats,
    Thresholds,
    read_jsonl,
)


class Toy(nn.Module):
    """loss = sum(a * ga) + sum(b * gb) + sum(c * gc): each parameter's gradient is exactly
    what the step gives it; ``probe`` sees a side tensor (its output is not used)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.zeros(8))
        self.b = nn.Parameter(torch.zeros(16))
        self.c = nn.Parameter(torch.zeros(4))
        self.probe = nn.Identity()

    def forward(self, ga, gb, gc, side):  # noqa: ANN001, ANN201
        self.probe(side)
        return (self.a * ga).sum() + (self.b * gb).sum() + (self.c * gc).sum()


def _alerting_run(tmp_path, **kwargs) -> gs.GradMonitor:
    """14 steps that raise every gradient alert kind: b vanishes (1e-9 per element), c is dead
    (exact zeros), a explodes at step 8, a NaN in a at 10, an infinity in b at 12, and a
    non-finite module output (not in the loss) at step 6."""
    torch.manual_seed(0)
    model = Toy()
    mon = gs.GradMonitor(model, activations=True, full_every=2, **kwargs)
    for step in range(14):
        ga = torch.randn(8)
        if step == 8:
            ga = ga * 1e5
        if step == 10:
            ga[3] = math.nan
        gb = torch.randn(16) * 1e-9
        if step == 12:
            gb[0] = math.inf
        side = torch.full((2,), math.nan if step == 6 else 1.0)
        model(ga, gb, torch.zeros(4), side).backward()
        for p in model.parameters():
            p.grad = None
    mon.remove()
    return mon


def _live(mon: gs.GradMonitor) -> list[gs.Alert]:
    return [a for a in mon.alerts if a.kind != "leak"]


def test_alerts_replayed_from_a_saved_log_are_the_live_runs(tmp_path) -> None:
    mon = _alerting_run(tmp_path, jsonl=tmp_path / "stream.jsonl")
    live = _live(mon)
    kinds = {a.kind for a in live}
    assert kinds == {"vanishing", "dead", "exploding", "nan", "inf", "forward_nonfinite"}
    # over the live log, over the file to_jsonl wrote, over the file streamed as it ran
    assert alerts(mon.log, mon.thresholds) == live
    saved = read_jsonl(mon.to_jsonl(tmp_path / "saved.jsonl"))
    assert saved.numels == {"a": 8, "b": 16, "c": 4}
    assert alerts(saved, Thresholds(1e-7, 1e-4, 1e3)) == live
    assert alerts(saved) == live  # the log's own thresholds by default
    streamed = read_jsonl(tmp_path / "stream.jsonl")
    assert len(streamed.steps) == 14
    assert alerts(streamed) == live
    assert streamed.alerts == live  # and the alerts the run wrote, read back as they were
    assert [st.params["a"].norm for st in streamed.steps[:8]] == [
        st.params["a"].norm for st in mon.history[:8]
    ]


def test_other_thresholds_give_other_alerts_from_the_same_log(tmp_path) -> None:
    mon = _alerting_run(tmp_path)
    log = read_jsonl(mon.to_jsonl(tmp_path / "g.jsonl"))
    loose = alerts(log, Thresholds(vanish=1e-12, vanish_ratio=1e-12, explode=1e9))
    kinds = {a.kind for a in loose}
    assert "vanishing" not in kinds and "dead" in kinds and "nan" in kinds
    # the spike rule still fires (10x the running median), the absolute level does not
    assert all("above 1e+09" not in a.message for a in loose)


def test_rules_over_hand_made_records_need_no_monitor() -> None:
    def ps(norm: float, nan: int = 0) -> ParamStats:
        return ParamStats(norm, None, None, nan, 0, None)

    steps = [StepStats(i, 1.0, {"w": ps(1.0), "v": ps(1.0)}) for i in range(6)]
    steps.append(StepStats(6, math.nan, {"w": ps(math.nan, nan=2), "v": ps(1.0)}))
    steps.append(StepStats(7, math.nan, {"w": ps(math.nan, nan=2), "v": ps(math.nan, nan=1)}))
    log = MonitorLog(["w", "v"], 1, 1, 2.0, steps, [], numels={"w": 1, "v": 1})
    out = alerts(log)
    # NaN alerts once for the whole model, when it starts
    assert [(a.kind, a.step, a.names) for a in out] == [("nan", 6, ("w",))]
    rules = AlertRules(Thresholds(), 2.0, {"w": 1, "v": 1})
    assert [a for st in steps for a in rules.update(st)] == out


def test_a_log_without_element_counts_is_refused() -> None:
    log = MonitorLog(["w"], 1, 1, 2.0, [], [])
    with pytest.raises(gs.MonitorError, match="no element count for w"):
        alerts(log)


def test_read_jsonl_names_the_bad_line(tmp_path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text('{"step": 0, "params": {}}\n{"nope": 1}\n')
    with pytest.raises(gs.MonitorError, match="line 2 is not a gradscope monitor record"):
        read_jsonl(path)


# ---------------------------------------------------------------- bounded history
class Noop(torch.optim.Optimizer):
    """An optimizer whose step does nothing: the step boundary without the arithmetic."""

    def __init__(self, params) -> None:  # noqa: ANN001
        super().__init__(params, {})

    def step(self, closure=None):  # noqa: ANN001, ANN201
        return None


def _many_tensors(n: int = 40) -> tuple[nn.Module, Noop]:
    model = nn.ParameterList([nn.Parameter(torch.zeros(3)) for _ in range(n)])
    for i, p in enumerate(model):
        p.grad = torch.full_like(p, float(i + 1))
    return model, Noop(model.parameters())


def test_history_keeps_the_last_n_and_sums_up_the_rest() -> None:
    model, opt = _many_tensors(3)
    mon = gs.GradMonitor(model, optimizer=opt, history=5, full_every=1)
    for i in range(12):
        if i == 2:
            model[1].grad[0] = math.nan
        if i == 3:
            model[1].grad[0] = 0.0
        opt.step()
    assert [st.step for st in mon.history] == list(range(7, 12))
    dropped = mon.log.dropped
    assert (dropped.steps, dropped.first_step, dropped.last_step) == (7, 0, 6)
    assert dropped.nan == {"1": 1} and dropped.nonfinite_steps == 1
    assert dropped.max_norm["2"] == pytest.approx(3 * math.sqrt(3))
    # the report still marks the parameter whose gradient was NaN in a dropped step
    assert any(r[0] == "1" and r[-1] == "nan" for r in _rows(mon.log))
    from gradscope.monitor.views import summary

    assert "5 logged steps" in summary(mon.log)
    assert "7 earlier logged steps not kept (steps 0-6" in summary(mon.log)
    assert "1 non-finite" in summary(mon.log)
    mon.remove()
    unbounded = gs.GradMonitor(model, optimizer=opt, history=None)
    for _ in range(1001):  # one more than the default cap
        opt.step()
    assert len(unbounded.history) == 1001 and unbounded.log.dropped.steps == 0
    unbounded.remove()


def _rows(log: MonitorLog) -> list[tuple]:
    from gradscope.monitor.views import _ReportTable

    return _ReportTable(log, 24).rows()


@pytest.mark.parametrize("bad", [0, "3", 1.5, True])
def test_history_must_be_a_positive_integer_or_none(bad) -> None:
    model, opt = _many_tensors(1)
    with pytest.raises(gs.MonitorError, match="history="):
        gs.GradMonitor(model, history=bad)


def test_jsonl_that_is_a_folder_is_refused_before_training(tmp_path) -> None:
    model, _ = _many_tensors(1)
    with pytest.raises(gs.MonitorError, match="not a regular file"):
        gs.GradMonitor(model, jsonl=tmp_path)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_memory_is_flat_over_100k_steps(tmp_path) -> None:
    """100k optimizer steps, one in 50 logged (2,000 logged steps of 40 tensors), the last 500
    kept: the process's resident memory after 100k steps is within 2 MiB of what it was after
    30k, when the history was already full (unbounded, the 1,400 logged steps in between would
    hold about 25 MiB), and the streamed file holds every logged step."""
    model, opt = _many_tensors(40)
    stream = tmp_path / "all.jsonl"
    mon = gs.GradMonitor(model, optimizer=opt, every=50, history=500, jsonl=stream)
    figures = {}
    for i in range(100_000):
        opt.step()
        if i + 1 in (30_000, 100_000):
            gc.collect()
            figures[i + 1] = _rss()
    mon.remove()
    grown = figures[100_000] - figures[30_000]
    print(f"RSS after 30k steps {figures[30_000] / 2**20:.1f} MiB, after 100k "
          f"{figures[100_000] / 2**20:.1f} MiB (+{grown / 2**20:.2f} MiB)")
    assert len(mon.history) == 500 and mon.log.dropped.steps == 1500
    assert grown < 2 * 2**20
    with stream.open() as f:
        lines = sum(1 for _ in f)
    assert lines == 2_000
    assert json.loads(stream.read_text().splitlines()[-1])["step"] == 99_950


def test_a_log_read_back_reports_like_the_live_monitor(tmp_path) -> None:
    """MonitorLog owns the views: the report of a streamed or saved log, read back with
    read_jsonl, is the live monitor's, line for line; and it writes the same JSONL/CSV."""
    from rich.console import Console

    def text(renderable) -> str:
        console = Console(width=140, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
        console.print(renderable)
        console.file.close()
        return console.export_text()

    mon = _alerting_run(tmp_path, jsonl=tmp_path / "stream.jsonl")
    live = text(mon.report())
    for path in (tmp_path / "stream.jsonl", mon.to_jsonl(tmp_path / "saved.jsonl")):
        log = read_jsonl(path)
        assert text(log.report()) == live
        assert log.to_csv(tmp_path / "r.csv").read_text() == mon.to_csv(
            tmp_path / "l.csv").read_text()
    again = read_jsonl(tmp_path / "saved.jsonl").to_jsonl(tmp_path / "again.jsonl")
    assert again.read_text() == (tmp_path / "saved.jsonl").read_text()  # a fixed point
