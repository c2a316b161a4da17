"""``benchmarks/doctor_layers.py`` (the doctor's cost by the number of layers, issue 48) runs as
the performance page shows it: a row per size, the doctor finding nothing on the healthy
chain (the script asserts it), with a block per step and with several steps in one block."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "doctor_layers.py"


@pytest.mark.parametrize("steps", [1, 3])
def test_the_sweep_prints_a_ratio_per_size(steps: int) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--layers", "5", "20", "--rounds", "2",
                           "--steps", str(steps)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{steps} step(s) per block; CPU milliseconds per step"
    rows = [line.split() for line in lines[2:]]
    assert [row[0] for row in rows] == ["5", "20"]
    for row in rows:
        plain, doctored, ratio = float(row[1]), float(row[2]), float(row[3].rstrip("x"))
        assert plain > 0 and doctored > 0 and ratio > 0
