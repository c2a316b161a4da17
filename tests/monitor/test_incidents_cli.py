"""``gradscope report`` on a planted-bug sample: the incident's origin in the first lines,
exit 1 (the origin checked against detect_anomaly in test_incidents.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]


def test_report_prints_the_origin_first_and_exits_1(tmp_path) -> None:
    out = tmp_path / "m.jsonl"
    res = run_cli(
        "report", "samples/incidents/sqrt_where.py", "--steps", "5", "--jsonl", str(out),
        cwd=ROOT,
    )
    assert res.returncode == 1, res.stderr
    head = res.stdout.splitlines()[:3]
    assert head[0].startswith("incident: step 3: the backward made nan at SqrtBackward0 in dist")
    assert any("sqrt_where.py:24: return torch.where(d2 > 0, d2.sqrt(), 0.0)" in ln
               for ln in head)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    (inc,) = [r["incident"] for r in rows if "incident" in r]
    assert (inc["op"], inc["module"], inc["phase"]) == ("SqrtBackward0", "dist", "backward")


def test_report_names_the_loss_op_for_a_nan_made_by_the_loss() -> None:
    res = run_cli("report", "samples/incidents/loss_nan.py", "--steps", "5", cwd=ROOT)
    assert res.returncode == 1, res.stderr
    first = " ".join(" ".join(res.stdout.splitlines()[:3]).split())  # the console wraps
    assert "the loss made it, at DivBackward0 outside the model" in first
    assert "loss_nan.py:22" in first


PLANTED = sorted(p.stem for p in (ROOT / "samples" / "incidents").glob("*.py"))


@pytest.mark.parametrize("sample", PLANTED)
def test_every_planted_bug_sample_reports_its_incident_first(sample: str) -> None:
    res = run_cli("report", f"samples/incidents/{sample}.py", "--steps", "5", cwd=ROOT)
    assert res.returncode == 1, res.stderr
    assert res.stdout.startswith("incident: step 3: "), res.stdout[:300]
