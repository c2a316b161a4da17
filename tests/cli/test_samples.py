"""Every bundled sample runs through the CLI, as its docstring says (typer's habit: every
documented example is run by a test). A new file in samples/ must be added here."""

from __future__ import annotations

import pytest
from conftest import SAMPLES, run_cli

# sample -> (CLI arguments after the file, expected exit code, text the output must contain)
CASES: dict[str, tuple[list[str], int, str]] = {
    "mlp": (["tree", "{f}", "--backward"], 0, "AccumulateGrad ← fc1.weight"),
    "compiled": (["tree", "{f}"], 0, "aten.threshold_backward.default"),
    "cnn": (["render", "{f}", "-o", "{tmp}/cnn.svg"], 0, "wrote"),
    "transformer": (["render", "{f}", "--depth", "1", "-o", "{tmp}/t.dot"], 0, "wrote"),
    "custom_function": (["check", "{f}:ScaledTanh"], 0, "ScaledTanh"),
    "functions": (["check", "{f}:WrongClippedReLU", "--no-double"], 1, "input 0"),
    "double_backward": (["tree", "{f}"], 0, "MulBackward1"),
    "nan_backward": (["render", "{f}", "--backward", "-o", "{tmp}/n.dot"], 1, "SqrtBackward0"),
    "nan_forward": (["tree", "{f}", "--backward"], 1,
                    "the forward already produced nan at LogBackward0 in mid"),
    "inf_backward": (["tree", "{f}", "--backward"], 1, "inf"),
    "deep_encoder": (["render", "{f}", "-o", "{tmp}/deep.svg"], 0, "x64"),
    "checkpointing": (["tree", "{f}", "--depth", "1"], 0, "saved tensors hold"),
    "leaky_training": (["report", "{f}", "--steps", "3"], 0, "3 logged steps"),
    "nan_training": (["report", "{f}", "--steps", "6"], 1, "nan"),
    "vanishing": (["report", "{f}", "--steps", "4"], 0, "vanishing"),
    "exploding": (["report", "{f}", "--steps", "4"], 0, "exploding"),
    "memory_blocks": (["memory", "{f}", "--budget", "40%"], 0, "fits the budget"),
}


def test_every_sample_is_covered():
    on_disk = {p.stem for p in SAMPLES.glob("*.py")}
    assert on_disk == set(CASES), "add the new sample to CASES"


@pytest.mark.parametrize("name", sorted(CASES))
def test_sample_through_the_cli(name, tmp_path):
    args, code, expect = CASES[name]
    argv = [a.format(f=SAMPLES / f"{name}.py", tmp=tmp_path) for a in args]
    proc = run_cli(*argv)
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out[-2000:]
    assert "Traceback" not in out
    assert expect in out, out[-2000:]
