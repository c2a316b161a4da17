"""`gradscope report`: trains a model file under the monitor; exit 1 on NaN/Inf, 2 on bad input.

Ground truth for the samples comes from training them here with plain PyTorch."""

from __future__ import annotations

import csv
import importlib.util
import json
import textwrap

import pytest
import torch
from conftest import SAMPLES, run_cli
from gradscope_cli.main import main

import gradscope as gs


def cli(capsys, monkeypatch, *args: str) -> tuple[int, str, str]:
    """Run the CLI in this process (fast); returns (exit code, stdout, stderr)."""
    monkeypatch.setenv("COLUMNS", "120")
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def first_nonfinite_by_hand(name: str, steps: int) -> tuple[int, list[str]]:
    """Train a sample with plain PyTorch (SGD lr 1e-2, its batches) and find the first step whose
    gradients hold NaN/Inf, and which parameters."""
    spec = importlib.util.spec_from_file_location(f"truth_{name}", SAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    opt = torch.optim.SGD(mod.model.parameters(), lr=1e-2)
    batches = mod.batches()
    for step in range(steps):
        x, y = next(batches)
        opt.zero_grad()
        mod.loss_fn(mod.model(x), y).backward()
        bad = [n for n, p in mod.model.named_parameters() if not torch.isfinite(p.grad).all()]
        if bad:
            return step, bad
        opt.step()
    raise AssertionError("the sample never produced a non-finite gradient")


def test_nan_sample_exit_1_names_parameter_and_step(tmp_path) -> None:
    step, bad = first_nonfinite_by_hand("nan_training", 6)
    assert (step, bad) == (3, ["gain"])
    out = tmp_path / "steps.jsonl"
    proc = run_cli("report", str(SAMPLES / "nan_training.py"), "--steps", "6", "--jsonl", str(out))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "first non-finite: gain at step 3" in proc.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(6))
    first = next(r for r in rows if any(p["nan"] or p["inf"] for p in r["params"].values()))
    assert first["step"] == step
    assert [n for n, p in first["params"].items() if p["nan"] or p["inf"]] == bad
    assert {"kind": "nan", "name": "gain"}.items() <= first["alerts"][0].items()


def test_json_is_one_document_and_jsonl_one_line_per_step(tmp_path) -> None:
    """``--json`` means one JSON document, as in ``memory`` and ``doctor``; ``--jsonl`` the
    JSON Lines log. Both carry the same records and read back to the same log."""
    doc, lines = tmp_path / "log.json", tmp_path / "log.jsonl"
    proc = run_cli("report", str(SAMPLES / "nan_training.py"), "--steps", "5",
                   "--json", str(doc), "--jsonl", str(lines))
    assert proc.returncode == 1, proc.stderr
    whole = json.loads(doc.read_text())
    assert (whole["gradscope"], whole["kind"]) == (2, "monitor")
    rows = [json.loads(line) for line in lines.read_text().splitlines()]
    assert len(rows) == 5 and [r["step"] for r in whole["steps"]] == [r["step"] for r in rows]
    assert whole["log"] == rows[0]["log"]
    assert whole["steps"][1:] == rows[1:]
    a, b = gs.read_jsonl(doc), gs.read_jsonl(lines)
    assert a.steps == b.steps and a.alerts == b.alerts and a.names == b.names
    assert [i.to_dict() for i in a.incidents] == [i.to_dict() for i in b.incidents]


def test_a_monitor_log_that_is_neither_form_is_one_line(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "gradscope": 2,\n  "kind": "monitor"\n')
    with pytest.raises(gs.MonitorError, match=r"bad.json: line 1 is not a gradscope monitor"):
        gs.read_jsonl(bad)
    bad.write_text('{"gradscope": 2, "kind": "monitor", "log": {}, "steps": [3]}')
    with pytest.raises(gs.MonitorError, match=r"steps\[0\] is not a gradscope monitor record"):
        gs.read_jsonl(bad)


def test_vanishing_sample(capsys, monkeypatch) -> None:
    code, out, _ = cli(capsys, monkeypatch, "report", str(SAMPLES / "vanishing.py"), "--steps", "4")
    assert code == 0
    row = next(line for line in out.splitlines() if line.strip().startswith("0.weight"))
    assert row.rstrip().endswith("vanishing")
    assert "vanishing" in out.splitlines()[-1] or "vanishing" in out


def test_exploding_sample(capsys, monkeypatch) -> None:
    code, out, _ = cli(capsys, monkeypatch, "report", str(SAMPLES / "exploding.py"), "--steps", "2")
    assert code == 0
    assert "alerts: exploding" in out


def test_every_and_csv_on_the_mlp(capsys, monkeypatch, tmp_path) -> None:
    path = tmp_path / "g.csv"
    code, out, err = cli(
        capsys,
        monkeypatch,
        "report",
        str(SAMPLES / "mlp.py"),
        "--steps",
        "5",
        "--every",
        "2",
        "--csv",
        str(path),
    )
    assert code == 0, err
    assert "3 logged steps (every 2)" in out
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert sorted({int(r["step"]) for r in rows}) == [0, 2, 4]
    assert {r["param"] for r in rows} == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    assert f"wrote {path}" in err


def test_plot_option_writes_png(capsys, monkeypatch, tmp_path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "flow.png"
    code, _, _ = cli(
        capsys, monkeypatch, "report", str(SAMPLES / "mlp.py"), "--steps", "2", "--plot", str(path)
    )
    assert code == 0
    assert path.read_bytes()[:4] == b"\x89PNG"


BAD_FILES = {
    "no loss_fn": (
        """
        import torch
        model = torch.nn.Linear(3, 1)
        example_input = torch.randn(4, 3)
        """,
        "defines no loss_fn",
    ),
    "no target": (
        """
        import torch
        model = torch.nn.Linear(3, 1)
        example_input = torch.randn(4, 3)
        def loss_fn(output, target): return (output - target).pow(2).mean()
        """,
        "neither batches() nor example_target",
    ),
    "bad batch": (
        """
        import torch
        model = torch.nn.Linear(3, 1)
        example_input = torch.randn(4, 3)
        def loss_fn(output, target): return (output - target).pow(2).mean()
        def batches(): yield torch.randn(4, 3)
        """,
        "must be an (inputs, target) pair or an (inputs, target, ids) triple",
    ),
    "four-item batch": (
        """
        import torch
        model = torch.nn.Linear(3, 1)
        example_input = torch.randn(4, 3)
        def loss_fn(output, target): return (output - target).pow(2).mean()
        def batches(): yield torch.randn(4, 3), torch.randn(4, 1), [0, 1, 2, 3], "extra"
        """,
        "batches() gave a tuple",
    ),
    "raising forward": (
        """
        import torch
        class M(torch.nn.Linear):
            def forward(self, x): raise ValueError("shape trouble")
        model = M(3, 1)
        example_input = torch.randn(4, 3)
        def loss_fn(output): return output.sum()
        """,
        "ValueError: shape trouble (raised while running the forward of M)",
    ),
    "bad optimizer": (
        """
        import torch
        model = torch.nn.Linear(3, 1)
        example_input = torch.randn(4, 3)
        def loss_fn(output): return output.sum()
        def optimizer(params): return 0.1
        """,
        "expected a torch.optim.Optimizer",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_unusable_files_exit_2_with_one_line(capsys, monkeypatch, tmp_path, case: str) -> None:
    source, message = BAD_FILES[case]
    path = tmp_path / "bad_model.py"
    path.write_text(textwrap.dedent(source))
    code, _, err = cli(capsys, monkeypatch, "report", str(path), "--steps", "2")
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.startswith("gradscope: error:")]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err


def test_a_spike_in_a_file_with_ids_names_the_example_and_exits_1(capsys, monkeypatch,
                                                                   tmp_path) -> None:
    """``samples/spikes/bad_example.py``: batches() yields (inputs, target, ids); one example
    of step 30 comes x1000. The report names its id, exits 1, and the JSON Lines log holds the
    spike and every step's loss, equal to the file trained by hand with plain PyTorch."""
    code, out, _ = cli(capsys, monkeypatch, "report", str(SAMPLES / "spikes" / "bad_example.py"),
                       "--steps", "40", "--json", str(tmp_path / "run.jsonl"))
    assert code == 1
    assert "spike x" in out and "at step 30 (the gradient norm" in out
    assert "sample ex-00963 of micro-batch 0 carries 100% of the gradient" in out
    log = gs.read_jsonl(tmp_path / "run.jsonl")
    (inc,) = [i for i in log.incidents if i.kind == "spike"]
    assert (inc.step, inc.samples[0].id, inc.samples[0].index) == (30, "ex-00963", 3)
    spec = importlib.util.spec_from_file_location("bad_by_hand",
                                                  SAMPLES / "spikes" / "bad_example.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    opt = mod.optimizer(mod.model.parameters())
    losses = []
    for _, (x, y, _ids) in zip(range(40), mod.batches(), strict=False):
        opt.zero_grad(set_to_none=True)
        loss = mod.loss_fn(mod.model(x), y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    assert [st.loss for st in log.steps] == pytest.approx(losses, rel=1e-6)


def test_ids_in_a_dict_batch_name_the_example(capsys, monkeypatch, tmp_path) -> None:
    """Issue 47: the same file with dict batches, ``{"x": ..., "id": [...]}`` (the model takes
    the ids as a keyword it ignores): the spike names the example by the dict's ``"id"``."""
    source = (SAMPLES / "spikes" / "bad_example.py").read_text()
    source = source.replace(
        "model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))",
        "class Net(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.mlp = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))\n\n"
        "    def forward(self, x, id=None):\n"
        "        return self.mlp(x)\n\n\n"
        "model = Net()",
    )
    source = source.replace(
        '        yield x, y, [f"ex-{step * BATCH + i:05d}" for i in range(BATCH)]',
        '        yield {"x": x, "id": [f"ex-{step * BATCH + i:05d}" for i in range(BATCH)]}, y',
    )
    assert '"id":' in source and "class Net" in source
    path = tmp_path / "dict_ids.py"
    path.write_text(source)
    code, out, _ = cli(capsys, monkeypatch, "report", str(path), "--steps", "32")
    assert code == 1
    assert "sample ex-00963 of micro-batch 0 carries 100% of the gradient" in out, out
