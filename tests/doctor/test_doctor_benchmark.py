"""``benchmarks/doctor_layers.py`` (the doctor's cost by the number of layers, issue 48) runs as
the performance page shows it: a row per size, the doctor finding nothing on the healthy
chain (the script asserts it), with a block per step and with several steps in one block, and
with ``--split``'s columns (an empty mode, empty module hooks, both)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "doctor_layers.py"


@pytest.mark.parametrize("steps, split", [(1, True), (3, False)])
def test_the_sweep_prints_a_ratio_per_size(steps: int, split: bool) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--layers", "5", "20", "--rounds", "2",
                           "--steps", str(steps), *(["--split"] if split else [])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"{steps} step(s) per block; CPU milliseconds per step"
    extra = ["mode", "hooks", "floor"] if split else []
    assert lines[1].split() == ["layers", "plain", "ms", "doctor", "ms", "ratio", *extra]
    rows = [line.split() for line in lines[2:]]
    assert [row[0] for row in rows] == ["5", "20"]
    for row in rows:
        assert len(row) == 4 + len(extra)
        plain, doctored = float(row[1]), float(row[2])
        ratios = [float(cell.removesuffix("x")) for cell in row[3:]]
        assert plain > 0 and doctored > 0 and all(ratio > 0 for ratio in ratios)


def test_a_step_count_below_one_is_one_line_and_exit_2() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--steps", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "0 is not a positive number; give 1 or more" in done.stderr
    assert "Traceback" not in done.stderr
