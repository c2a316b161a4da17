"""A NaN already in the batch (issue 29 item 15, for the monitor and ``gradscope report``).

The value came in with the data: no op of the forward made it, so the incident says so and
names the tensor by the ``forward`` argument it was given as (``the input x``, ``the input
mask`` of ``model(**batch)``, ``the input batch['pixels']``), or the parameter that held it,
rather than "the forward made nan at linear". The planted NaN is the ground truth; a NaN an op
makes (``log`` of a negative) is still that op's, and the replay's contract (the forked child
or the process) gives the same answer.
"""

from __future__ import annotations

import json
import textwrap

import pytest
import torch
from gradscope_cli.main import main
from torch import nn

import gradscope as gs
from gradscope.monitor.incident import Incident, alert_line


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _train(model: nn.Module, batches: list, call=lambda m, b: m(b)) -> gs.GradMonitor:
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    with gs.GradMonitor(model, optimizer=opt, activations=True) as mon:
        for batch in batches:
            opt.zero_grad()
            call(model, batch).float().square().mean().backward()
            opt.step()
    return mon


def _batches(n: int, bad: int, shape=(5, 4)) -> list[torch.Tensor]:
    out = [torch.randn(*shape) for _ in range(n)]
    out[bad][2, 1] = float("nan")
    assert torch.isnan(out[bad]).any() and not any(torch.isnan(b).any() for b in out[:bad])
    return out


@pytest.mark.parametrize("fork", ["1", "0"])
def test_a_nan_in_the_batch_is_said_as_the_input_held_it(monkeypatch, fork) -> None:
    monkeypatch.setenv("GRADSCOPE_REPLAY_FORK", fork)
    torch.manual_seed(0)
    mon = _train(Net(), _batches(4, bad=2))
    inc = mon.incidents[0]
    assert (inc.step, inc.kind, inc.phase, inc.value) == (2, "nonfinite", "forward", "nan")
    assert inc.input == "the input x"
    assert (inc.op, inc.module) == ("linear", "fc1")  # the call that read it first
    assert inc.line is not None and inc.line.endswith(f":{Net.forward.__code__.co_firstlineno + 1}")
    head = inc.summary().splitlines()[0]
    assert head.startswith("step 2: the input x already held nan before the forward ran "
                           "(first read by linear in fc1 (")
    assert "the forward made" not in inc.summary()
    nan_alert = next(a for a in mon.alerts if a.kind == "nan")
    assert alert_line(nan_alert, mon.incidents).endswith(
        "; origin: the input x, which already held nan before the forward")
    back = Incident.from_json(inc.to_json())  # the field goes through the JSON Lines log
    assert back == inc


def test_an_op_made_nan_is_still_the_ops() -> None:
    class LogNet(Net):
        def forward(self, x):
            return self.fc2(self.fc1(x).log())  # log of a negative: made by the forward

    torch.manual_seed(0)
    mon = _train(LogNet(), [torch.randn(5, 4)])
    (inc,) = mon.incidents
    assert (inc.phase, inc.op, inc.input) == ("forward", "LogBackward0", None)
    assert inc.summary().startswith("step 0: the forward made nan at LogBackward0 in the "
                                    "model's own forward")


class Keyed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.fc = nn.Linear(4, 2)

    def forward(self, input_ids, mask):
        return self.fc(self.emb(input_ids) * mask.unsqueeze(-1))


class Dict(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, batch):
        return self.fc(batch["pixels"])


def test_inputs_are_named_by_argument_and_key() -> None:
    torch.manual_seed(0)
    mask = torch.ones(3, 5)
    mask[1, 1] = float("nan")
    batch = {"input_ids": torch.randint(0, 10, (3, 5)), "mask": mask}
    mon = _train(Keyed(), [batch], call=lambda m, b: m(**b))  # model(**batch), HF style
    assert mon.incidents[0].input == "the input mask"
    pixels = torch.randn(3, 4)
    pixels[0, 0] = float("inf")
    mon = _train(Dict(), [{"pixels": pixels}])
    inc = mon.incidents[0]
    assert (inc.input, inc.value) == ("the input batch['pixels']", "inf")
    seq = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1))
    mon = _train(seq, _batches(1, bad=0))  # Sequential's forward(input)
    assert mon.incidents[0].input == "the model's input"


def test_a_parameter_that_already_held_nan_is_named() -> None:
    torch.manual_seed(0)
    model = Net()
    with torch.no_grad():
        model.fc2.bias[1] = float("nan")
    mon = _train(model, [torch.randn(5, 4)])
    inc = mon.incidents[0]
    assert (inc.input, inc.op, inc.module) == ("the parameter fc2.bias", "linear", "fc2")


MODEL_FILE = """
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(4, 8)
            self.fc2 = torch.nn.Linear(8, 1)

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x)))

    torch.manual_seed(0)
    model = Net()
    example_input = torch.randn(6, 4)

    def batches():
        for i in range(10):
            x = torch.randn(6, 4)
            if i == 2:
                x[3, 0] = float("nan")  # the data loader's bad row
            yield x, torch.randn(6, 1)

    def loss_fn(out, target):
        return torch.nn.functional.mse_loss(out, target)
"""


def test_report_says_the_input_held_it_and_exits_1(tmp_path, capsys, monkeypatch) -> None:
    path = tmp_path / "input_nan_report.py"
    path.write_text(textwrap.dedent(MODEL_FILE))
    out = tmp_path / "steps.jsonl"
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exc:
        main(["report", str(path), "--steps", "4", "--jsonl", str(out)])
    stdout, stderr = capsys.readouterr()
    assert exc.value.code == 1, stdout + stderr
    first = stdout.splitlines()[0]
    assert first.startswith("incident: step 2: the input x already held nan before the forward "
                            "ran (first read by linear in fc1"), first
    assert "the forward made" not in stdout
    assert "origin: the input x, which already held nan before the forward" in stdout
    assert "first non-finite: the input x (before the forward) at step 2" in stdout, stdout
    (inc,) = [json.loads(r)["incident"] for r in out.read_text().splitlines()
              if "incident" in json.loads(r)]
    assert (inc["input"], inc["phase"], inc["value"]) == ("the input x", "forward", "nan")
