"""`gradscope memory FILE`: the per-module table at 80 columns, the plan and its measured run.

Ground truth: ``gs.measure_forward`` (the profiler's allocations) of the sample's own model."""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import SAMPLES
from gradscope_cli.main import main

import gradscope as gs

SAMPLE = SAMPLES / "memory_blocks.py"


def cli(capsys, monkeypatch, *args: str) -> tuple[int, str, str]:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def sample_module():
    spec = importlib.util.spec_from_file_location("truth_memory_blocks", SAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_table_at_80_columns_ranked_by_what_a_checkpoint_frees(capsys, monkeypatch):
    code, out, err = cli(capsys, monkeypatch, "memory", str(SAMPLE))
    assert code == 0, err
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    mod = sample_module()
    measured = gs.measure_forward(mod.model, mod.example_input, loss_fn=mod.loss_fn)
    assert f"activations held at the end of the forward: {gs.format_bytes(measured)}" in out
    rows = [line.split() for line in lines if line.startswith("blocks.")]
    assert [r[0] for r in rows[:6]] == [f"blocks.{i}" for i in range(6)]
    assert "Traceback" not in err


def test_budget_plan_is_applied_and_measured(capsys, monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    js, png = tmp_path / "m.json", tmp_path / "m.png"
    code, out, err = cli(capsys, monkeypatch, "memory", str(SAMPLE), "--budget", "40%",
                         "--json", str(js), "--plot", str(png))
    assert code == 0, err
    data = json.loads(js.read_text())
    plan, check = data["plan"], data["verification"]
    assert plan["modules"] and plan["predicted"] <= plan["budget"]
    assert abs(plan["predicted"] - check["measured"]) <= 0.05 * check["measured"]
    assert check["measured"] <= plan["budget"]
    assert data["every_block"]["modules"] == [f"blocks.{i}" for i in range(6)]
    assert "fits the budget" in out and "checkpoint every block" in out
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert all(len(line) <= 80 for line in out.splitlines())


@pytest.mark.parametrize("budget, message", [
    ("1B", "smallest reachable figure is"),
    ("lots", "is not a size"),
])
def test_unusable_budgets_exit_2_in_one_line(capsys, monkeypatch, budget, message):
    code, out, err = cli(capsys, monkeypatch, "memory", str(SAMPLE), "--budget", budget)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_what_if_columns(capsys, monkeypatch):
    code, out, err = cli(capsys, monkeypatch, "memory", str(SAMPLE), "--autocast", "bf16",
                         "--scale-batch", "2")
    assert code == 0, err
    assert "bf16" in out and "batch x2" in out and "linear extrapolation" in out
    assert all(len(line) <= 80 for line in out.splitlines())


def test_render_memory_still_works(tmp_path, capsys, monkeypatch):
    dot = tmp_path / "g.dot"
    code, out, err = cli(capsys, monkeypatch, "render", str(SAMPLE), "--memory", "-o", str(dot))
    assert code == 0, err
    assert "holds" in dot.read_text()
