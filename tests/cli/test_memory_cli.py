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


@pytest.mark.parametrize("sample", ["cnn", "mlp"])
def test_scale_batch_cuts_the_target_with_the_inputs(capsys, monkeypatch, sample):
    """The bundled cnn and mlp samples define example_target: the half-batch forward of
    --scale-batch must get half the target too (it raised "Expected input batch_size (2) to
    match target batch_size (4)"). The CLI prints the library's figure; at a batch where no
    tensor is under the allocator's 512-byte block, the extrapolation is what the doubled batch
    measures (the half batch holds its own storage: a view of the whole one counted it all)."""
    import torch

    path = SAMPLES / f"{sample}.py"
    code, out, err = cli(capsys, monkeypatch, "memory", str(path), "--scale-batch", "2")
    assert code == 0, err
    spec = importlib.util.spec_from_file_location(f"truth_{sample}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def half(o):  # the target's first rows in storage of their own, as the CLI cuts it
        return mod.loss_fn(o, mod.example_target[:o.shape[0]].clone())

    small = gs.activation_report(mod.model, mod.example_input, loss_fn=half, batch_scale=2)
    assert f"at batch x2: {gs.format_bytes(small.scaled_total)}" in " ".join(out.split())
    x, y = (torch.cat([t] * 64) for t in (mod.example_input, mod.example_target))
    doubled = gs.activation_report(mod.model, torch.cat([x, x]),
                                   loss_fn=lambda o: mod.loss_fn(o, torch.cat([y, y])))
    scaled = gs.activation_report(
        mod.model, x, loss_fn=lambda o: mod.loss_fn(o, y[:o.shape[0]].clone()), batch_scale=2)
    assert scaled.scaled_total == doubled.total
