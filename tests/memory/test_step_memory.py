"""step_memory / max_batch, checked against measurements the recorder does not make.

Ground truth: ``measure_step`` runs the same step without the recorder and reads the CPU
allocator's allocation and free events from the profiler (the running sum's maximum, plus what
was live before); the recorder follows storages through a dispatch mode and weak references.
The two share nothing but the model. Meta and FakeTensorMode figures are compared with the same
model on the CPU; restoration with copies taken before.
"""

from __future__ import annotations

import json
import random
import sys

import pytest
import torch
from torch import nn

import gradscope as gs
from gradscope.memory.step import measure_step
from gradscope.memory.step_records import CATEGORIES, MAX_POINTS, StepMemory

sys.path.insert(0, __import__("os").path.dirname(__file__))
from test_memplan import cnn, gpt2, llama  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def mlp():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 512), nn.GELU(), nn.Dropout(0.1), nn.Linear(512, 256),
                          nn.LayerNorm(256), nn.Tanh(), nn.Linear(256, 10))
    return model, (torch.randn(128, 64),), lambda out: out.pow(2).mean()


FAMILIES = {"mlp": mlp, "cnn": cnn, "gpt2": gpt2, "llama": llama}


def optimizer(name: str, model: nn.Module):
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def within(a: int, b: int, tol: float) -> bool:
    return abs(a - b) <= tol * max(b, 1)


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_first_and_steady_peaks_match_the_profiler(family, opt):
    model, inputs, loss_fn = FAMILIES[family]()
    o = optimizer(opt, model)
    mem = gs.step_memory(model, *inputs, optimizer=o, loss_fn=loss_fn)
    first, steady, method = measure_step(model, *inputs, optimizer=o, loss_fn=loss_fn)
    assert method == "profiler"
    assert within(mem.first_step, first, 0.05), (mem.first_step, first)
    assert within(mem.steady_state, steady, 0.05), (mem.steady_state, steady)
    assert mem.peak == max(mem.first_step, mem.steady_state)
    assert sum(mem.at_peak.values()) == mem.peak and set(mem.at_peak) == set(CATEGORIES)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert mem.at_peak["parameters"] >= params
    # AdamW's two states per parameter (SGD momentum: one) are there in the steady state
    state = [p for p in mem.timeline if p.step == 2][0].by_category()["optimizer_state"]
    per = 2 if opt == "adamw" else 1
    assert state >= per * params


def test_without_an_optimizer_one_step_and_the_categories():
    model, (x,), loss_fn = mlp()
    mem = gs.step_memory(model, x, loss_fn=loss_fn)
    (measured, _, _) = measure_step(model, x, loss_fn=loss_fn)
    assert mem.first_step == mem.steady_state == mem.peak
    assert within(mem.peak, measured, 0.02)
    assert mem.at_peak["optimizer_state"] == 0
    assert mem.at_peak["inputs"] == x.numel() * 4
    assert mem.peak_phase in ("forward", "backward")
    assert {p.phase for p in mem.timeline} == {"forward", "backward"}
    end = [p for p in mem.timeline if p.phase == "forward"][-1].by_category()
    acts = gs.activation_report(model, x, loss_fn=loss_fn).total
    assert within(end["activations"], acts, 0.05)  # the forward's saves, as the report says


@pytest.mark.parametrize("family", ["cnn", "gpt2", "mlp"])
def test_meta_figures_equal_the_real_run(family):
    model, inputs, loss_fn = FAMILIES[family]()
    real = gs.step_memory(model, *inputs, optimizer=optimizer("adamw", model), loss_fn=loss_fn)
    with torch.device("meta"):
        torch.manual_seed(0)
        meta_model, meta_inputs, _ = FAMILIES[family]()
    meta_inputs = tuple(torch.empty_like(t, device="meta") for t in inputs)
    meta = gs.step_memory(meta_model, *meta_inputs, optimizer=optimizer("adamw", meta_model),
                          loss_fn=loss_fn)
    assert meta.device.startswith("meta")
    assert within(meta.first_step, real.first_step, 0.01)
    assert within(meta.steady_state, real.steady_state, 0.01)


def test_under_fake_tensor_mode_nothing_is_allocated_and_the_figure_holds():
    from torch._subclasses.fake_tensor import FakeTensorMode

    model, (x,), loss_fn = mlp()
    real = gs.step_memory(model, x, optimizer=optimizer("adamw", model), loss_fn=loss_fn)
    with FakeTensorMode():
        torch.manual_seed(0)
        fmodel, (fx,), _ = mlp()
        fake = gs.step_memory(fmodel, fx, optimizer=optimizer("adamw", fmodel),
                              loss_fn=loss_fn)
    assert fake.first_step == real.first_step and fake.steady_state == real.steady_state


def test_everything_is_restored_bitwise():
    import numpy as np

    model, (x,), loss_fn = mlp()
    model = nn.Sequential(model, nn.BatchNorm1d(10)).train()
    o = torch.optim.AdamW(model.parameters())
    loss_fn(model(x)).backward()
    o.step()  # a state to keep
    loss_fn(model(x)).backward()  # and gradients there before
    params = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    grad_ids = [id(p.grad) for p in model.parameters()]
    state = {k: {n: (v.clone() if torch.is_tensor(v) else v) for n, v in s.items()}
             for k, s in enumerate(o.state.values())}
    buffers = [b.clone() for b in model.buffers()]
    rng = torch.get_rng_state()
    py = random.getstate()
    npr = np.random.get_state()[1].copy()
    gs.step_memory(model, x, optimizer=o, loss_fn=loss_fn)
    assert all(torch.equal(a, b) for a, b in zip(params, model.parameters(), strict=True))
    assert [id(p.grad) for p in model.parameters()] == grad_ids
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters(), strict=True))
    for k, s in enumerate(o.state.values()):
        for n, v in s.items():
            assert torch.equal(v, state[k][n]) if torch.is_tensor(v) else v == state[k][n]
    assert all(torch.equal(a, b) for a, b in zip(buffers, model.buffers(), strict=True))
    assert torch.equal(rng, torch.get_rng_state())
    assert random.getstate() == py and (np.random.get_state()[1] == npr).all()


def test_with_a_checkpoint_plan_as_measured_and_lower_in_the_backward():
    model, inputs, loss_fn = cnn()
    o = optimizer("sgd", model)
    plan = gs.plan_checkpoints(model, *inputs, budget="40%", loss_fn=loss_fn)
    assert plan.modules
    plain = gs.step_memory(model, *inputs, optimizer=o, loss_fn=loss_fn)
    planned = gs.step_memory(model, *inputs, optimizer=o, loss_fn=loss_fn, plan=plan)
    first, steady, _ = measure_step(model, *inputs, optimizer=o, loss_fn=loss_fn, plan=plan)
    assert within(planned.steady_state, steady, 0.05), (planned.steady_state, steady)
    assert planned.plan == plan.modules
    fwd = [p.total for p in planned.timeline if p.phase == "forward"][-1]
    fwd0 = [p.total for p in plain.timeline if p.phase == "forward"][-1]
    assert fwd < fwd0
    assert not any("forward" in m.__dict__ for m in model.modules())  # the plan removed


def test_bf16_autocast_as_measured():
    model, (x,), loss_fn = mlp()
    mem = gs.step_memory(model, x, loss_fn=loss_fn, autocast="bf16")
    plain = gs.step_memory(model, x, loss_fn=loss_fn)
    measured, _, _ = measure_step(model, x, loss_fn=loss_fn, autocast="bf16")
    assert within(mem.peak, measured, 0.05)
    assert mem.autocast == "bf16" and mem.peak != plain.peak


def test_fits_and_max_batch_agree_with_measured_peaks():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(),
                          nn.Linear(256, 4))
    o = optimizer("adamw", model)

    def build(batch: int) -> torch.Tensor:
        return torch.randn(batch, 32)

    low = gs.step_memory(model, build(4), optimizer=o).peak
    high = gs.step_memory(model, build(8), optimizer=o).peak
    assert low < high
    capacity = (low + high) // 2
    found = gs.max_batch(build, model, capacity, optimizer=o)
    assert 4 <= found.batch < 8
    _, at, _ = measure_step(model, build(found.batch), optimizer=o)
    _, above, _ = measure_step(model, build(found.batch + 1), optimizer=o)
    # (the allocator also makes a few scalar tensors outside any dispatched op: 12 B here)
    assert at <= capacity + 64 and above > capacity
    assert found.at is not None and found.at.fits(capacity) and found.at.fits(f"{capacity}B")
    assert found.next_peak is not None and found.next_peak > capacity
    assert f"batch {found.batch} fits" in found.summary()
    assert f"{found.batch + 1} needs" in found.summary()
    assert gs.max_batch(build, model, 1000, optimizer=o).batch == 0


def test_timeline_is_thinned_and_the_record_round_trips(tmp_path):
    model, inputs, loss_fn = gpt2()
    mem = gs.step_memory(model, *inputs, optimizer=optimizer("adamw", model), loss_fn=loss_fn)
    assert mem.events > len(mem.timeline) or mem.events <= MAX_POINTS
    assert len(mem.timeline) <= MAX_POINTS
    assert max(p.total for p in mem.timeline) == mem.peak
    assert mem.peak_at.op and mem.peak_phase in ("forward", "backward", "optimizer")
    path = mem.write_json(tmp_path / "step.json")
    import json

    again = StepMemory.from_dict(json.loads(path.read_text()))
    assert again == mem
    assert "step peak" in mem.summary() and mem.peak_phase in mem.summary()


def test_the_forward_peak_names_its_line_and_module():
    class Wide(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up = nn.Linear(16, 4096)

        def forward(self, x):
            h = self.up(x)
            return (h.exp() * h.sin()).sum()  # the widest moment of the step is here

    model = Wide()
    with torch.no_grad():
        model.up.weight.requires_grad_(False)
        model.up.bias.requires_grad_(False)
    x = torch.randn(256, 16, requires_grad=True)
    mem = gs.step_memory(model, x)
    assert mem.peak_phase in ("forward", "backward")
    assert mem.peak_at.op.startswith(("aten.", "MulBackward", "SinBackward", "ExpBackward"))


def test_user_errors_are_one_line():
    model, (x,), _ = mlp()
    with pytest.raises(gs.GradscopeError, match="nn.Module"):
        gs.step_memory(lambda t: t, x)
    with pytest.raises(gs.GradscopeError, match="Optimizer"):
        gs.step_memory(model, x, optimizer="adamw")
    with pytest.raises(gs.GradscopeError, match="bf16"):
        gs.step_memory(model, x, autocast="int3")
    mem = gs.step_memory(model, x)
    with pytest.raises(gs.GradscopeError):
        mem.fits("lots")


MODEL_FILE = """
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 4))
example_input = torch.randn(16, 32)
def loss_fn(out): return out.pow(2).mean()
def build_inputs(batch): return torch.randn(batch, 32)
"""


def _cli(capsys, *args: str) -> tuple[int, str]:
    """The console script's entry point in this process: (exit code, stdout + stderr)."""
    from gradscope_cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out + err


def test_cli_memory_step_prints_the_peak_fits_and_the_largest_batch(tmp_path, capsys):
    import json

    path = tmp_path / "m.py"
    path.write_text(MODEL_FILE)
    code, out = _cli(capsys, "memory", str(path), "--step", "--optimizer", "adamw",
                     "--capacity", "230KiB", "--json", str(tmp_path / "s.json"))
    assert code == 0, out
    assert "step peak" in out and "optimizer state" in out
    assert "measured (profiler)" in out
    assert "fits in" in out and "needs" in out  # the batch search
    data = json.loads((tmp_path / "s.json").read_text())
    mem = StepMemory.from_dict({k: v for k, v in data.items() if k != "max_batch"})
    assert mem.optimizer == "AdamW" and data["max_batch"]["batch"] > 16
    assert mem.measured is not None and within(mem.peak, mem.measured, 0.01)


def test_cli_memory_step_exit_codes(tmp_path, capsys):
    path = tmp_path / "m.py"
    path.write_text(MODEL_FILE)
    code, out = _cli(capsys, "memory", str(path), "--step", "--capacity", "10kB")
    assert code == 1, out  # no optimizer: one step; it does not fit
    assert "does NOT fit" in out and "no batch fits" in out
    code, out = _cli(capsys, "memory", str(path), "--step", "--optimizer", "adam")
    assert code == 2 and "expected one of adamw, sgd, none" in out
    assert len(out.strip().splitlines()) == 1


def test_plans_against_the_step_peak_fit_when_measured_and_are_monotone():
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 512), nn.Tanh(), nn.Linear(512, 64))
                            for _ in range(6)])
    x = torch.randn(384, 64)
    base = gs.step_memory(model, x)
    rep = gs.activation_report(model, x)
    peaks = []
    for share in ("90%", "80%"):  # (the step peak is not monotone in the activations)
        plan = gs.plan_checkpoints(model, x, budget=share, report=rep, target="peak")
        assert plan.target == "peak" and plan.modules and plan.baseline == base.peak
        assert plan.predicted <= plan.budget
        peaks.append(plan)
    assert peaks[1].predicted <= peaks[0].predicted  # a smaller budget never a higher peak
    assert peaks[1].recompute_flops >= peaks[0].recompute_flops
    measured = max(measure_step(model, x, plan=peaks[1])[:2])
    assert measured <= peaks[1].budget + 64, (measured, peaks[1])  # measured: it fits


def test_a_peak_set_by_the_optimizer_state_says_no_plan_helps():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 512))
    x = torch.randn(4, 512)  # a tiny batch: weights, grads and Adam's state set the peak
    o = optimizer("adamw", model)
    assert gs.step_memory(model, x, optimizer=o).peak_phase == "optimizer"
    with pytest.raises(gs.BudgetError, match="no checkpoint plan frees"):
        gs.plan_checkpoints(model, x, budget="90%", target="peak", optimizer=o)
    with pytest.raises(gs.GradscopeError, match="target="):
        gs.plan_checkpoints(model, x, budget="90%", target="end")


def test_the_timeline_plot_is_a_png_and_the_table_renders(tmp_path):
    pytest.importorskip("matplotlib")
    from rich.console import Console

    model, (x,), loss_fn = mlp()
    mem = gs.step_memory(model, x, optimizer=optimizer("adamw", model), loss_fn=loss_fn)
    path = mem.plot(tmp_path / "t.png", title="mlp")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    console = Console(width=100, record=True)
    console.print(mem.render())
    text = console.export_text()
    assert "step peak" in text and "optimizer state" in text and "first step" in text


@pytest.mark.parametrize("opt", ["sgd", "adamw"])
def test_the_peak_equals_torch_memtracker_on_the_same_step(opt):
    """torch's own tracker (``torch.distributed._tools.mem_tracker.MemTracker``, private):
    the same two steps run for real under it give the same peak."""
    import copy

    tools = pytest.importorskip("torch.distributed._tools.mem_tracker")
    model, (x,), loss_fn = mlp()
    model.eval()  # no dropout: the two runs are the same computation
    mem = gs.step_memory(model, x, optimizer=optimizer(opt, model), loss_fn=loss_fn)
    twin = copy.deepcopy(model)
    o = optimizer(opt, twin)
    tracker = tools.MemTracker()
    tracker.track_external(twin, o, x)
    with tracker:
        for _ in range(2):
            loss_fn(twin(x)).backward()
            o.step()
            o.zero_grad(set_to_none=True)
            tracker.reset_mod_stats()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    assert mem.peak == peak


def test_max_batch_summary_tells_apart_what_fits_and_what_does_not():
    """At batch N the peak and batch N+1's peak round to the capacity's own "4.0 MiB": the
    summary gives them in bytes, so what fits and what does not can be told apart."""
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
    found = gs.max_batch(lambda b: torch.randn(b, 64), net, "4MiB",
                         optimizer=torch.optim.AdamW(net.parameters()))
    text = found.summary()
    assert found.peak <= found.capacity < found.next_peak
    assert f"peak {found.peak:,} B of {found.capacity:,} B" in text
    assert text.endswith(f"; {found.batch + 1} needs {found.next_peak:,} B")


TARGET_FILE = """
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 10))
example_input = torch.randn(8, 32)
example_target = torch.randint(0, 10, (8,))
def loss_fn(out, target): return F.cross_entropy(out, target)
def build_inputs(batch): return torch.randn(batch, 32)
"""


def test_max_batch_builds_each_candidates_target_too(tmp_path, capsys):
    """A loss that takes a target: each candidate batch gets a target of its own size (the
    file's example_target tiled, or build_target(batch)); before, example_target stayed at 8
    rows and the search stopped on cross_entropy's batch-size mismatch (exit 2). The batch
    found is the one gs.max_batch finds with the target built in plain torch."""
    import torch.nn.functional as F

    path = tmp_path / "m.py"
    path.write_text(TARGET_FILE)
    code, out = _cli(capsys, "memory", str(path), "--step", "--optimizer", "sgd",
                     "--capacity", "230KiB", "--json", str(tmp_path / "s.json"))
    assert code == 0, out
    found = json.loads((tmp_path / "s.json").read_text())["max_batch"]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(),
                                torch.nn.Linear(256, 10))
    ref = gs.max_batch(lambda b: torch.randn(b, 32), model, "230KiB",
                       optimizer=torch.optim.SGD(model.parameters(), lr=1e-2),
                       loss_fn=F.cross_entropy,
                       build_target=lambda b: torch.randint(0, 10, (b,)))
    assert found["batch"] == ref.batch > 8


def test_max_batch_reports_each_candidate():
    seen = []
    model = torch.nn.Linear(16, 16)
    gs.max_batch(lambda b: torch.randn(b, 16), model, "64KiB",
                 progress=lambda batch, peak: seen.append((batch, peak)))
    assert seen and seen[0][0] == 1 and all(p > 0 for _, p in seen)
    assert len({b for b, _ in seen}) == len(seen)  # each candidate once


META_TARGET_FILE = """
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)
with torch.device("meta"):
    model = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 10))
example_input = torch.randn(8, 32, device="meta")
example_target = torch.randint(0, 10, (8,)).to("meta")
def loss_fn(out, target): return F.cross_entropy(out, target)
def build_inputs(batch): return torch.randn(batch, 32, device="meta")
"""


def test_a_meta_file_with_a_meta_target_is_measured_and_searched(tmp_path, capsys):
    """The file's example_target (on meta, like its model) goes to the step with the batch:
    closed over by the loss it raised FakeTensor's device mismatch (exit 2). The peak and the
    batch found are those of the same model on the CPU with a real target."""
    import torch.nn.functional as F

    path = tmp_path / "m.py"
    path.write_text(META_TARGET_FILE)
    code, out = _cli(capsys, "memory", str(path), "--step", "--optimizer", "sgd",
                     "--capacity", "230KiB", "--json", str(tmp_path / "s.json"))
    assert code == 0, out
    data = json.loads((tmp_path / "s.json").read_text())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(),
                                torch.nn.Linear(256, 10))
    sgd = torch.optim.SGD(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 10, (8,))
    real = gs.step_memory(model, torch.randn(8, 32), optimizer=sgd, loss_fn=F.cross_entropy,
                          target=ids)
    assert data["peak"] == real.peak
    ref = gs.max_batch(lambda b: torch.randn(b, 32), model, "230KiB", optimizer=sgd,
                       loss_fn=F.cross_entropy,
                       build_target=lambda b: torch.randint(0, 10, (b,)))
    assert data["max_batch"]["batch"] == ref.batch > 8


def test_an_lbfgs_file_exits_2_in_one_line(tmp_path, capsys):
    path = tmp_path / "m.py"
    path.write_text(MODEL_FILE + "def optimizer(params): return torch.optim.LBFGS(params)\n")
    code, out = _cli(capsys, "memory", str(path), "--step")
    assert code == 2, out
    assert len(out.strip().splitlines()) == 1 and "LBFGS" in out and "closure" in out


@pytest.mark.parametrize("terminal", [True, False])
def test_the_batch_search_shows_each_candidate_on_a_terminal_only(tmp_path, capsys,
                                                                  monkeypatch, terminal):
    """Each candidate's batch and peak on stderr as it is tried, when stderr is a terminal
    (a search could run minutes with no output); nothing of it when it is not."""
    import gradscope_cli.memory_step as memory_step

    monkeypatch.setattr(memory_step, "_is_terminal", lambda: terminal)
    path = tmp_path / "m.py"
    path.write_text(MODEL_FILE)
    code, out = _cli(capsys, "memory", str(path), "--step", "--capacity", "230KiB",
                     "--json", str(tmp_path / "s.json"))
    assert code == 0, out
    lines = [ln for ln in out.splitlines() if ln.startswith("batch ") and ": peak" in ln]
    if not terminal:
        assert not lines
        return
    found = json.loads((tmp_path / "s.json").read_text())["max_batch"]["batch"]
    assert lines[0].startswith("batch 1: peak") and any(
        ln.startswith(f"batch {found}: peak") and "(fits)" in ln for ln in lines)
    assert all(ln.endswith(("(fits)", "(does not fit)")) for ln in lines)


class _Broken(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)[:, 5]  # index 5 of 2: IndexError at this line


@pytest.mark.parametrize("fork", ["1", "0"])
def test_an_error_in_the_users_forward_is_raised_at_its_line(fork, monkeypatch):
    """Raised in the forked child, the user's error came back with a traceback that ended in
    gradscope's fork runner (the command line said "isolated.py:112: IndexError"); it ends at
    the user's line, as it does when the step runs in process."""
    import inspect
    import traceback

    monkeypatch.setenv("GRADSCOPE_FORK", fork)
    with pytest.raises(IndexError) as excinfo:
        gs.step_memory(_Broken(), torch.randn(3, 4))
    last = traceback.extract_tb(excinfo.value.__traceback__)
    lines, start = inspect.getsourcelines(_Broken.forward)
    assert any(f.filename == __file__ and f.name == "forward"
               and f.lineno == start + len(lines) - 1 for f in last)


def test_the_cli_names_the_users_line_of_an_error_in_the_step(tmp_path, capsys):
    path = tmp_path / "m.py"
    path.write_text(MODEL_FILE.replace("def loss_fn(out): return out.pow(2).mean()",
                                       "def loss_fn(out): return out[:, 99].mean()"))
    line = next(i for i, t in enumerate(MODEL_FILE.splitlines(), 1) if "def loss_fn" in t)
    code, out = _cli(capsys, "memory", str(path), "--step")
    assert code == 2 and len(out.strip().splitlines()) == 1
    assert f"{path}:{line}: IndexError" in out, out
