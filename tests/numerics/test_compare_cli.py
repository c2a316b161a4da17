"""``gradscope compare``: a model file against a candidate set-up, and two saved runs. Exit 0
when they agree, 1 when a divergence is found (named in the output), 2 with one line for any
input it cannot use (a missing file, a JSON document of another kind, runs of different
models, an unknown candidate)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SAMPLES, in_process_cli
from torch import nn

import gradscope as gs

NUMERICS = SAMPLES / "numerics"


@pytest.fixture
def invoke(capsys, monkeypatch):
    """The console script's entry point, in process, at 120 columns."""
    return in_process_cli(capsys, monkeypatch, 120)


def _line(name: str, marker: str) -> str:
    lines = (NUMERICS / f"{name}.py").read_text().splitlines()
    return f"{name}.py:{next(i + 1 for i, line in enumerate(lines) if marker in line)}"


def test_the_softmax_sample_diverges_at_its_exp_line(invoke, tmp_path):
    out_json = tmp_path / "d.json"
    code, out, err = invoke("compare", str(NUMERICS / "softmax_fp16.py"), "--candidate", "fp16",
                            "--json", str(out_json))
    assert code == 1, err
    assert "First divergence: aten.exp (forward) at " + _line(
        "softmax_fp16", "# overflows in float16") in " ".join(out.split())
    doc = json.loads(out_json.read_text())
    assert (doc["gradscope"], doc["kind"], doc["ok"]) == (1, "numerics_compare", False)
    assert doc["first"]["op"] == "aten.exp" and doc["first"]["error"] == "inf"


@pytest.mark.parametrize("candidate", ["compile", "float64", "bf16"])
def test_a_healthy_model_agrees_with_each_candidate(invoke, candidate):
    code, out, err = invoke("compare", str(SAMPLES / "mlp.py"), "--candidate", candidate)
    assert code == 0, out + err
    assert "The runs agree" in out
    assert f"candidate ({candidate})" in err


def test_two_saved_runs(invoke, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(6, 4)
    paths = []
    for scale, name in ((1.0, "a"), (1.0, "b"), (3.0, "c")):
        model.zero_grad()
        with gs.record_numerics(model) as run:
            (model(x).square().sum() * scale).backward()
        paths.append(str(run.save(tmp_path / f"{name}.json")))
    code, out, _ = invoke("compare", paths[0], paths[1])
    assert code == 0 and "agree" in out
    code, out, _ = invoke("compare", paths[0], paths[2])  # the loss scaled: from its mul on
    assert code == 1 and "First divergence: aten.mul" in " ".join(out.split())


def test_inputs_it_cannot_use_are_one_line_and_exit_2(invoke, tmp_path):
    model = nn.Linear(4, 2)
    with gs.record_numerics(model) as run:
        model(torch.randn(3, 4)).sum().backward()
    good = str(run.save(tmp_path / "good.json"))
    other = nn.Linear(4, 3)
    with gs.record_numerics(other) as run2:
        other(torch.randn(3, 4)).sum().backward()
    different = str(run2.save(tmp_path / "other.json"))
    doctor = tmp_path / "doctor.json"
    doctor.write_text(json.dumps({"gradscope": 2, "kind": "doctor", "findings": []}))
    cases = [
        (["compare", str(tmp_path / "missing.json"), good], "cannot read"),
        (["compare", good, str(doctor)], "not a saved numerics run"),
        (["compare", good, different], "different models"),
        (["compare", good], "give the candidate run too"),
        (["compare", str(tmp_path / "missing.py"), "--candidate", "fp16"], "missing.py"),
        (["compare", str(SAMPLES / "mlp.py"), "--candidate", "int8"], "expected one of"),
        (["compare", good, good, "--candidate", "bf16"], "--candidate runs a model file"),
    ]
    for args, said in cases:
        code, out, err = invoke(*args)
        assert code == 2, (args, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and said in lines[0], (args, err)
