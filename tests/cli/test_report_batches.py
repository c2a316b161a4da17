"""``gradscope report`` on batches() a user got wrong: one line and exit 2, never a
traceback, exit 3 or a "healthy" report of nothing (issue 47's adversarial pass)."""

from __future__ import annotations

from conftest import run_cli

MODEL = """
import torch
model = torch.nn.Linear(3, 2)
example_input = torch.randn(4, 3)

def loss_fn(output, target):
    return torch.nn.functional.mse_loss(output, target)

def batches():
{body}
"""


def _report(tmp_path, body: str):
    path = tmp_path / "m.py"
    path.write_text(MODEL.format(body=body), encoding="utf-8")
    return run_cli("report", str(path), "--steps", "2")


def test_an_empty_batches_is_exit_2_not_a_healthy_report(tmp_path):
    proc = _report(tmp_path, "    return iter(())")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "batches() gave no batch at all" in line and "Traceback" not in proc.stderr


def test_ids_that_are_not_one_per_example_are_exit_2(tmp_path):
    proc = _report(tmp_path, "    yield torch.randn(4, 3), torch.randn(4, 2), 7")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "gave int 7 as the third item" in line and "one id per example" in line


def test_a_huge_id_value_is_cut_in_the_message(tmp_path):
    proc = _report(tmp_path, "    yield torch.randn(4, 3), torch.randn(4, 2), 'x' * 2_000_000")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert len(proc.stderr) < 400, len(proc.stderr)
