"""Incidents: the planted bugs of samples/incidents/ against ground truth computed here.

Ground truth never comes from gradscope's recorders:
* backward-origin bugs: the same step re-run under ``torch.autograd.detect_anomaly``; its
  error names the node, its warning the forward line, and the module is the one whose
  ``forward`` holds that line;
* forward-origin bugs: plain forward hooks on every module (the first module output that is
  non-finite), and a ten-line ``TorchFunctionMode`` here for the first non-finite op and its line;
* exploding: per-module gradient norms read from ``p.grad`` with ``get_total_norm``.
"""

from __future__ import annotations

import importlib.util
import inspect
import io
import itertools
import json
import math
import re
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

import gradscope as gs
from gradscope.monitor.incident import (
    Incident,
    ModuleChange,
    OpInput,
    alert_line,
)

SAMPLES = Path(__file__).resolve().parents[2] / "samples" / "incidents"
_count = itertools.count()


def load(name: str):
    """A fresh import of a sample (its model is built again from the same seed)."""
    path = SAMPLES / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_incident_sample_{next(_count)}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def train(mod, steps: int, *, monitor: dict | None = None, last=None):
    """The plain training loop of the model-file contract; ``last(model, x, y, loss_fn)``
    replaces the loop's final step (ground-truth runs)."""
    model, loss_fn = mod.model, mod.loss_fn
    opt = mod.optimizer(model.parameters())
    mon = None
    if monitor is not None:
        mon = gs.GradMonitor(model, optimizer=opt, loss_fn=loss_fn, **monitor)
    batches = mod.batches()
    for step in range(steps):
        x, y = next(batches)
        if last is not None and step == steps - 1:
            return last(model, x, y, loss_fn)
        out = model(x)
        if mon is not None:
            mon.target(y)
        loss_fn(out, y).backward()
        opt.step()
        opt.zero_grad()
    if mon is not None:
        mon.remove()
    return mon


def incident_of(name: str, steps: int = 5) -> tuple[object, Incident]:
    mod = load(name)
    mon = train(mod, steps, monitor={})
    assert len(mon.incidents) == 1, mon.incidents
    return mod, mon.incidents[0]


# ---------------------------------------------------------------- ground truth helpers
def anomaly_truth(mod, fresh) -> tuple[str, str, int]:
    """(node name, file, line) that detect_anomaly blames when step BAD_STEP runs under it."""

    def last(model, x, y, loss_fn):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.autograd.detect_anomaly():
                loss = loss_fn(model(x), y)
                with pytest.raises(RuntimeError) as err:
                    loss.backward()
        node = re.search(r"Function '(\w+)' returned nan", str(err.value)).group(1)
        text = "\n".join(str(w.message) for w in caught)
        frames = re.findall(r'File "([^"]+)", line (\d+)', text)
        file, line = [(f, int(n)) for f, n in frames if Path(f).parent == SAMPLES][-1]
        return node, file, line

    return train(fresh, mod.BAD_STEP + 1, last=last)


def module_with_line(model: torch.nn.Module, file: str, line: int) -> str:
    """The innermost module whose class's forward holds file:line."""
    found = None
    for name, m in model.named_modules():
        fwd = type(m).forward
        code = getattr(fwd, "__code__", None)
        if code is None or Path(code.co_filename) != Path(file):
            continue
        lines, start = inspect.getsourcelines(fwd)
        if start <= line < start + len(lines) and (found is None or len(name) > len(found)):
            found = name
    return found


class FirstNonFinite(TorchFunctionMode):
    """The first torch call whose output holds NaN/Inf: its grad_fn and the sample's line."""

    def __init__(self) -> None:
        super().__init__()
        self.found = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.found is None and isinstance(out, torch.Tensor) and out.is_floating_point():
            if not bool(torch.isfinite(out).all()):
                frame = sys._getframe(1)
                while frame is not None and Path(frame.f_code.co_filename).parent != SAMPLES:
                    frame = frame.f_back
                node = type(out.grad_fn).__name__ if out.grad_fn is not None else None
                self.found = (node, frame.f_code.co_filename, frame.f_lineno)
        return out


def forward_truth(mod, fresh) -> tuple[str | None, tuple]:
    """(first module with a non-finite output by forward hooks, first non-finite op)."""

    def last(model, x, y, loss_fn):
        bad = []
        names = {id(m): n for n, m in model.named_modules()}

        def hook(m, args, out):
            if isinstance(out, torch.Tensor) and not bool(torch.isfinite(out).all()):
                bad.append(names[id(m)])

        handles = [m.register_forward_hook(hook) for m in model.modules()]
        try:
            with FirstNonFinite() as mode:
                out = model(x)
                loss_fn(out, y)
        finally:
            for h in handles:
                h.remove()
        return (bad[0] if bad else None), mode.found

    return train(fresh, mod.BAD_STEP + 1, last=last)


def line_of(file: str, line: int) -> str:
    return f"{Path(file).relative_to(Path.cwd())}:{line}" if Path(file).is_relative_to(
        Path.cwd()
    ) else f"{file}:{line}"


# ---------------------------------------------------------------- the planted bugs
@pytest.mark.parametrize("name", ["sqrt_where"])
def test_backward_origin_matches_detect_anomaly(name: str) -> None:
    mod, inc = incident_of(name)
    node, file, line = anomaly_truth(mod, load(name))
    assert (inc.step, inc.kind, inc.phase) == (mod.BAD_STEP, "nonfinite", "backward")
    assert inc.op == node
    assert inc.line == line_of(file, line)
    assert inc.module == module_with_line(mod.model, file, line)
    assert inc.replayed and inc.micro_batch == 0 and inc.note is None


@pytest.mark.parametrize("name", ["log_prob", "norm_div", "layernorm_eps0", "fp16_attention"])
def test_forward_origin_matches_forward_hooks(name: str) -> None:
    mod, inc = incident_of(name)
    module, (node, file, line) = forward_truth(mod, load(name))
    assert (inc.step, inc.kind, inc.phase) == (mod.BAD_STEP, "nonfinite", "forward")
    assert inc.module == module
    assert inc.op == node
    assert inc.line == line_of(file, line)
    assert inc.value in ("nan", "inf")


def test_log_of_zero_names_what_log_was_given() -> None:
    _, inc = incident_of("log_prob")
    given = {i.name: i for i in inc.inputs}
    assert given["self"].min == 0.0 and not given["self"].nan
    assert "min 0" in inc.summary()


def test_loss_nan_is_outside_and_names_the_loss_op() -> None:
    mod, inc = incident_of("loss_nan")
    module, (node, file, line) = forward_truth(mod, load("loss_nan"))
    assert module is None  # no module output was non-finite: the model is not where it began
    assert (inc.step, inc.phase, inc.module) == (mod.BAD_STEP, "outside", None)
    assert inc.op == node and inc.line == line_of(file, line)


def test_loss_nan_without_loss_fn_says_what_is_missing() -> None:
    mod = load("loss_nan")
    opt = mod.optimizer(mod.model.parameters())
    mon = gs.GradMonitor(mod.model, optimizer=opt)
    for _, (x, y) in zip(range(5), mod.batches()):
        mod.loss_fn(mod.model(x), y).backward()
        opt.step()
        opt.zero_grad()
    mon.remove()
    (inc,) = mon.incidents
    assert inc.phase == "outside" and inc.op is None and "loss_fn=" in inc.note


def test_compiled_block_names_the_aten_op_and_line(fresh_dynamo) -> None:
    mod, inc = incident_of("compiled_block")
    fresh = load("compiled_block")
    eager = fresh.Net(compile_block=False)
    eager.load_state_dict(
        {k.replace("_orig_mod.", ""): v for k, v in fresh.model.state_dict().items()}
    )
    fresh.model = eager  # batches() reads the anchor of the model being trained
    node, file, line = anomaly_truth(mod, fresh)
    assert node == "SqrtBackward0"  # detect_anomaly, on the block run eagerly
    assert (inc.step, inc.phase) == (mod.BAD_STEP, "backward")
    assert inc.op.startswith("aten.")  # the op inside the compiled backward (sqrt's derivative)
    assert inc.line == line_of(file, line)
    assert inc.module.split(".")[0] == module_with_line(eager, file, line)


def test_exploding_lr_names_the_modules_that_grew_most() -> None:
    mod = load("exploding_lr")
    mon = train(mod, 5, monitor={})
    (inc,) = mon.incidents
    # ground truth: per-module norms from p.grad at every step of a plain run
    fresh = load("exploding_lr")
    norms = []
    model, opt = fresh.model, fresh.optimizer(fresh.model.parameters())
    for _, (x, y) in zip(range(5), fresh.batches()):
        fresh.loss_fn(model(x), y).backward()
        per_module = {}
        for name, m in model.named_children():
            per_module[name] = float(torch.nn.utils.get_total_norm(
                [p.grad for p in m.parameters()]
            ))
        norms.append(per_module)
        opt.step()
        opt.zero_grad()
    totals = [math.sqrt(sum(v * v for v in n.values())) for n in norms]
    first = next(i for i, t in enumerate(totals) if t > 1e3)  # the explode threshold
    growth = {m: norms[first][m] / norms[first - 1][m] for m in norms[first]}
    assert (inc.step, inc.kind) == (first, "exploding")
    assert inc.changes[0].module == max(growth, key=growth.get)
    assert inc.changes[0].bad == pytest.approx(norms[first][inc.changes[0].module], rel=1e-5)
    alert = next(a for a in mon.alerts if a.kind == "exploding")
    assert f"grew most: {inc.changes[0].module}" in alert_line(alert, mon.incidents)


def test_alert_line_names_the_origin() -> None:
    mod = load("sqrt_where")
    mon = train(mod, 5, monitor={})
    nan = next(a for a in mon.alerts if a.kind == "nan")
    line = alert_line(nan, mon.incidents)
    assert line.startswith(nan.message)  # the alert stays the rules' (a replayed log's)
    assert "; origin: SqrtBackward0 in dist (samples/incidents/sqrt_where.py:24)" in line


# ---------------------------------------------------------------- the replay changes nothing
class Noisy(torch.nn.Module):
    """Dropout (RNG), BatchNorm (buffers) and a sqrt-under-where that goes NaN on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 8)
        self.bn = torch.nn.BatchNorm1d(8)
        self.drop = torch.nn.Dropout(0.3)
        self.out = torch.nn.Linear(8, 2)
        self.c = torch.nn.Parameter(torch.tensor(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.bn(self.fc(x)))
        d = (x[:, :1] - self.c).pow(2)
        return self.out(h) * torch.where(d > 0, d.sqrt(), 0.0)


def _run(replay: bool | None, steps: int = 8, accumulate: int = 2):
    torch.manual_seed(0)
    model = Noisy()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mon = None if replay is None else gs.GradMonitor(model, optimizer=opt, replay=replay)
    g = torch.Generator().manual_seed(3)
    for step in range(steps):
        for micro in range(accumulate):
            x = torch.randn(16, 6, generator=g)
            if step == 4 and micro == 1:
                x[2, 0] = model.c.detach()  # d = 0: NaN in the backward of sqrt
            model(x).square().mean().backward()
        torch.rand(5)  # the loop draws from the RNG between the forward and the step
        for p in model.parameters():
            p.grad.nan_to_num_(0.0)  # the loop cleans the gradients before the step
        opt.step()
        opt.zero_grad()
    if mon is not None:
        mon.remove()
    state = [t.detach().clone() for t in itertools.chain(model.parameters(), model.buffers())]
    for s in opt.state.values():
        state += [v.clone() for v in s.values() if torch.is_tensor(v)]
    state.append(torch.get_rng_state())
    return mon, state


def _same_bits(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(
        x.dtype == y.dtype and torch.equal(x.view(torch.uint8), y.view(torch.uint8))
        if x.dim() else torch.equal(x.reshape(1).view(torch.uint8), y.reshape(1).view(torch.uint8))
        for x, y in zip(a, b)
    )


def test_training_is_bitwise_identical_with_and_without_replay() -> None:
    _, plain = _run(None)
    mon, replayed = _run(True)
    _, off = _run(False)
    (inc,) = mon.incidents
    assert inc.replayed and inc.micro_batch == 1  # the second micro-batch went bad
    assert (inc.step, inc.phase, inc.op) == (4, "backward", "SqrtBackward0")
    assert _same_bits(plain, replayed)
    assert _same_bits(plain, off)


# ---------------------------------------------------------------- where it cannot replay
def test_no_optimizer_says_so() -> None:
    mod = load("sqrt_where")
    mon = gs.GradMonitor(mod.model)
    for _, (x, y) in zip(range(5), mod.batches()):
        mod.loss_fn(mod.model(x), y).backward()
        mod.model.zero_grad()
    mon.remove()
    (inc,) = mon.incidents
    assert not inc.replayed and inc.phase is None and "optimizer=" in inc.note
    assert "\n" not in inc.note


def test_parameters_changed_in_place_say_so() -> None:
    mod = load("sqrt_where")
    model, opt = mod.model, mod.optimizer(mod.model.parameters())
    mon = gs.GradMonitor(model, optimizer=opt)
    for _, (x, y) in zip(range(5), mod.batches()):
        mod.loss_fn(model(x), y).backward()
        with torch.no_grad():
            model.head.weight.mul_(1.0)  # an in-place change after the forward
        opt.step()
        opt.zero_grad()
    mon.remove()
    (inc,) = mon.incidents
    assert not inc.replayed and "changed in place" in inc.note


def test_replay_false_records_the_incident_without_origin() -> None:
    mod = load("sqrt_where")
    mon = train(mod, 5, monitor={"replay": False})
    (inc,) = mon.incidents
    assert not inc.replayed and inc.op is None and "replay=False" in inc.note
    assert inc.changes[0].module == "dist" and math.isnan(inc.changes[0].bad)


# ---------------------------------------------------------------- costs on good steps
def test_replay_costs_no_transfer_more_per_logged_step(monkeypatch) -> None:
    """The incident watch decides a replay from the step's one transfer (made at
    optimizer.step()'s pre-hook then): replay=True moves no more than replay=False."""
    from test_monitor import Transfers

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    counts = {}
    for replay in (False, True):
        mon = gs.GradMonitor(model, every=3, optimizer=opt, replay=replay)
        counter = Transfers(monkeypatch)
        seen = []
        for _ in range(6):
            before = counter.count
            model(torch.randn(8, 6)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            seen.append(counter.count - before)
        mon.remove()
        counts[replay] = seen
        monkeypatch.undo()
    assert counts[True] == counts[False] == [1, 0, 0, 1, 0, 0]


def test_memory_held_is_the_inputs_and_output_gradients() -> None:
    from test_monitor import _reachable_tensor_bytes

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    held = {}
    for replay in (False, True):
        mon = gs.GradMonitor(model, optimizer=opt, replay=replay)
        during: list[int] = []
        handle = opt.register_step_pre_hook(
            lambda *_, _m=mon, _d=during: _d.append(_reachable_tensor_bytes(_m, model, opt))
        )
        between = []
        for _ in range(3):
            model(torch.randn(32, 256)).square().mean().backward()
            opt.step()
            opt.zero_grad()
            between.append(_reachable_tensor_bytes(mon, model, opt))
        handle.remove()
        mon.remove()
        held[replay] = (max(during), max(between), between[-1])
    inputs, out_grads = 32 * 256 * 4, 32 * 64 * 4
    rng = torch.get_rng_state().nbytes
    extra = held[True][0] - held[False][0]
    assert 0 < extra <= inputs + out_grads + rng + 64  # (+ the flag of each backward)
    # past the step boundary: only the update rows of the first (full-statistics) step, two
    # float64 per tensor, left on the device until the next logged step's transfer
    assert held[True][1] - held[False][1] == 2 * 8 * 4
    assert held[True][2] == held[False][2]  # and nothing once they moved


# ---------------------------------------------------------------- the record and its views
def test_incident_round_trips_through_json() -> None:
    inc = Incident(
        step=7, kind="nonfinite", phase="forward", op="LogBackward0", module="head",
        line="m.py:3", code="torch.log(p)", value="inf",
        inputs=[OpInput("self", [4, 2], "float32", 0.0, 1.0)],
        changes=[ModuleChange("head", 1.0, math.nan), ModuleChange("body", None, math.inf)],
        micro_batch=0, replayed=True,
    )
    back = Incident.from_json(inc.to_json())
    assert back.to_dict() == inc.to_dict()
    assert math.isnan(back.changes[0].bad) and back.changes[1].bad == math.inf
    lines = inc.summary().splitlines()
    assert 2 <= len(lines) <= 4
    assert lines[0] == "step 7: the forward made inf at LogBackward0 in head (m.py:3)"


def test_jsonl_and_report_carry_the_incident(tmp_path) -> None:
    import io

    from rich.console import Console

    mod = load("sqrt_where")
    mon = train(mod, 5, monitor={})
    rows = [json.loads(x) for x in mon.to_jsonl(tmp_path / "m.jsonl").read_text().splitlines()]
    with_incident = [r for r in rows if "incident" in r]
    assert [r["step"] for r in with_incident] == [mod.BAD_STEP]
    assert Incident.from_dict(with_incident[0]["incident"]).to_dict() == mon.incidents[0].to_dict()
    console = Console(color_system=None, width=100, record=True, file=io.StringIO())
    console.print(mon.report())
    first = console.export_text().splitlines()[0]
    assert first.startswith("incident: step 3: the backward made nan at SqrtBackward0 in dist")


# ---------------------------------------------------------------- a model compiled as a whole
@pytest.mark.parametrize("given", ["wrapper", "inner"])
def test_a_model_compiled_as_a_whole(fresh_dynamo, given: str) -> None:
    from torch._dynamo.utils import counters

    mod = load("sqrt_where")
    model = mod.model
    compiled = torch.compile(model, backend="aot_eager")
    opt = mod.optimizer(model.parameters())
    mon = gs.GradMonitor(compiled if given == "wrapper" else model, optimizer=opt)
    for _, (x, y) in zip(range(5), mod.batches()):
        mod.loss_fn(compiled(x), y).backward()
        opt.step()
        opt.zero_grad()
    mon.remove()
    assert sum(counters["graph_break"].values()) == 0
    (inc,) = mon.incidents
    if given == "inner":  # its hooks run inside the compiled frame: nothing to replay
        assert not inc.replayed and "torch.compile wrapper" in inc.note
        return
    assert inc.replayed and inc.phase == "backward" and inc.op.startswith("aten.")
    assert inc.line == "samples/incidents/sqrt_where.py:24"


# ---------------------------------------------------------------- the incident in the JSONL
def test_incident_goes_through_jsonl_written_and_streamed(tmp_path) -> None:
    """The incident of a bad step is in the JSON Lines log, whether written at the end or
    streamed with jsonl=, and read_jsonl gives it back equal; replaying the alert rules over
    the read log gives the live run's alerts (an alert keeps the rules' message)."""
    from gradscope.monitor.alerts import alerts as replay_alerts

    streamed = tmp_path / "live.jsonl"
    mon = train(load("sqrt_where"), 5, monitor={"jsonl": streamed})
    assert len(mon.incidents) == 1
    written = mon.to_jsonl(tmp_path / "end.jsonl")
    for path in (written, streamed):
        log = gs.read_jsonl(path)
        assert log.incidents == mon.incidents
        assert [(a.kind, a.step, a.message) for a in log.alerts] == [
            (a.kind, a.step, a.message) for a in mon.alerts
        ]
        assert [(a.kind, a.step, a.message) for a in replay_alerts(log, log.thresholds)] == [
            (a.kind, a.step, a.message) for a in mon.alerts
        ]
    from rich.console import Console

    console = Console(width=80, record=True, file=io.StringIO())
    console.print(mon.report())
    text = console.export_text()
    assert text.splitlines()[0].startswith("incident: step 3: ")
    assert "; origin: SqrtBackward0 in dist" in " ".join(text.split())  # the alert line


def test_replay_follows_replaced_parameters() -> None:
    """A head replaced after the first step (fine-tuning a new classifier): the monitor
    re-reads the parameters (a MonitorWarning says so) and the replay of the bad step
    differentiates the current ones, naming the same origin as without the change."""
    mod = load("sqrt_where")
    model, loss_fn = mod.model, mod.loss_fn
    opt = mod.optimizer(model.parameters())
    mon = gs.GradMonitor(model, optimizer=opt, loss_fn=loss_fn)
    batches = mod.batches()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for step in range(5):
            if step == 1:
                new = torch.nn.Linear(5, 3)
                with torch.no_grad():
                    new.weight.copy_(model.head.weight)
                    new.bias.copy_(model.head.bias)
                model.head = new
                opt.add_param_group({"params": list(new.parameters())})
            x, y = next(batches)
            out = model(x)
            mon.target(y)
            loss_fn(out, y).backward()
            opt.step()
            opt.zero_grad()
    mon.remove()
    assert any("replaced: head.weight, head.bias" in str(w.message) for w in seen)
    (inc,) = mon.incidents
    assert inc.replayed and inc.step == mod.BAD_STEP
    assert (inc.op, inc.module, inc.phase) == ("SqrtBackward0", "dist", "backward")
