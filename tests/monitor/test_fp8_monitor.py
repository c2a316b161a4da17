"""A module output in float8 (issue 29 item 9, for the monitor and ``gradscope report``).

fp8 training stores an activation in ``float8_e4m3fn``/``float8_e5m2`` and reads it back
widened. torch has no ``isfinite``/``isinf`` for ``e4m3fn`` and no norm for any float8, so
the monitor's activation check and module rows read such values through a float32 copy. The
monitor goes on monitoring (no "please report" warning: warnings are errors here), its norms
are the parameters' own ``p.grad.norm()``, a module row of the fp8 output is the norm of the
gradient autograd gave it, and the gradients are bitwise those of the same loop unmonitored.
``gradscope report`` on such a model file shows the norms (not "no grad") and exits 0.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from gradscope_cli.main import main
from torch import nn

import gradscope as gs

FP8 = [getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)]
pytestmark = pytest.mark.skipif(not FP8, reason="this torch has no float8 dtypes")


class ToFp8(nn.Module):
    """Stores its input in float8 (its output is a float8 tensor); ``poison``: a log first,
    NaN for the negative values."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype
        self.poison = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.poison:
            x = x.log()
        return x.to(self.dtype)


class Net(nn.Module):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.a = nn.Linear(6, 16)
        self.mid = ToFp8(dtype)
        self.b = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.mid(self.a(x)).float())


def _keep_output_grads(module: nn.Module, into: list[torch.Tensor]) -> None:
    """The user's own hook: the gradient autograd hands ``module``'s output (ground truth)."""
    def hook(mod, args, out):
        if out.requires_grad:
            out.register_hook(lambda g: into.append(g.detach().clone()))
    module.register_forward_hook(hook)


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_a_float8_module_output_is_monitored_with_the_true_norms(dtype) -> None:
    torch.manual_seed(0)
    watched, plain = Net(dtype), Net(dtype)
    plain.load_state_dict(watched.state_dict())
    opt_w = torch.optim.SGD(watched.parameters(), lr=0.05)
    opt_p = torch.optim.SGD(plain.parameters(), lr=0.05)
    mid_grads: list[torch.Tensor] = []
    _keep_output_grads(watched.mid, mid_grads)
    data = [torch.randn(8, 6) for _ in range(4)]
    with gs.GradMonitor(watched, optimizer=opt_w, modules=True, activations=True,
                        full_every=1) as mon:
        for x in data:
            truth = {}
            for model, opt in ((watched, opt_w), (plain, opt_p)):
                opt.zero_grad()
                model(x).square().mean().backward()
                truth[model] = {n: p.grad.clone() for n, p in model.named_parameters()}
                opt.step()
            for name, g in truth[watched].items():  # monitoring never changes a gradient
                assert torch.equal(g, truth[plain][name]), name
            st = mon.history[-1]
            assert st.forward_nonfinite is None
            for name, g in truth[watched].items():
                assert st.params[name].norm == pytest.approx(g.norm().item(), rel=1e-6)
                assert st.params[name].max_abs == pytest.approx(g.abs().max().item(), rel=1e-6)
            got = st.modules["mid"]
            want = mid_grads[-1]
            assert want.dtype == dtype  # the row is of a float8 gradient
            assert got.norm == pytest.approx(want.float().norm().item(), rel=1e-6)
            assert got.max_abs == pytest.approx(want.float().abs().max().item(), rel=1e-6)
    assert len(mon.history) == len(data)
    assert not mon.alerts and not mon.incidents


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_a_nan_made_before_the_float8_cast_is_found_and_replayed(dtype) -> None:
    torch.manual_seed(0)
    model = Net(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with gs.GradMonitor(model, optimizer=opt, activations=True) as mon:
        for step in range(3):
            model.mid.poison = step == 1
            opt.zero_grad()
            model(torch.randn(8, 6)).square().mean().backward()
            opt.step()
    assert [st.forward_nonfinite for st in mon.history[:2]] == [None, "mid"]
    (inc,) = mon.incidents
    assert (inc.step, inc.phase, inc.op, inc.module, inc.value) == (
        1, "forward", "LogBackward0", "mid", "nan")
    assert inc.input is None  # an op of the forward made it


def test_a_float8_model_output_is_replayed_not_a_failed_replay() -> None:
    """The model's own output in float8 (the loss widens it): the replay reads the output
    and the gradient that reached it widened."""
    dtype = FP8[0]

    class Out(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x).sqrt().to(dtype)  # sqrt of a negative: NaN in the forward

    torch.manual_seed(0)
    model = Out()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with gs.GradMonitor(model, optimizer=opt) as mon:
        opt.zero_grad()
        model(torch.randn(8, 4)).float().square().mean().backward()
        opt.step()
    (inc,) = mon.incidents
    assert inc.replayed and inc.note is None, inc.note
    assert (inc.phase, inc.op, inc.module, inc.value) == ("forward", "SqrtBackward0", "", "nan")
    assert inc.inputs[0].dtype == "float32" and inc.inputs[0].nan  # sqrt's saved result


MODEL_FILE = """
    import torch

    class ToFp8(torch.nn.Module):
        def forward(self, x):
            return x.to(torch.{dtype})

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 8)
            self.mid = ToFp8()
            self.b = torch.nn.Linear(8, 2)

        def forward(self, x):
            return self.b(self.mid(self.a(x)).float())

    torch.manual_seed(0)
    model = Net()
    example_input = torch.randn(5, 4)

    def loss_fn(out):
        return out.square().mean()
"""


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_report_shows_the_real_norms_of_a_float8_model(tmp_path, capsys, monkeypatch, dtype):
    name = str(dtype).replace("torch.", "")
    path = tmp_path / f"fp8_report_{name}.py"
    path.write_text(textwrap.dedent(MODEL_FILE.format(dtype=name)))
    out = tmp_path / "steps.jsonl"
    monkeypatch.setenv("COLUMNS", "120")
    with pytest.raises(SystemExit) as exc:
        main(["report", str(path), "--steps", "3", "--jsonl", str(out)])
    stdout, stderr = capsys.readouterr()
    assert (exc.value.code or 0) == 0, stdout + stderr
    assert "no grad" not in stdout and "please report" not in stderr
    # ground truth: the file's loop by hand (default SGD lr 1e-2, example_input repeated)
    ns: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    model, x = ns["model"], ns["example_input"]
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    truth = []
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        ns["loss_fn"](model(x)).backward()
        truth.append({n: p.grad.norm().item() for n, p in model.named_parameters()})
        opt.step()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3
    for row, want in zip(rows, truth, strict=True):
        got = {n: p["norm"] for n, p in row["params"].items()}
        assert got == pytest.approx(want, rel=1e-5)
    last = truth[-1]["b.weight"]
    line = next(ln for ln in stdout.splitlines() if ln.strip().startswith("b.weight"))
    assert f"{last:.3g}" in line
