"""`gradscope check FILE:NAME`: exit 0 on pass, 1 on a failed check, 2 on unusable input."""

from __future__ import annotations

import textwrap

import pytest
from conftest import SAMPLES, run_cli
from gradscope_cli.main import main

import gradscope as gs

FUNCTIONS = str(SAMPLES / "functions.py")
CORRECT = [cls.__name__ for cls in gs.load_model_file(FUNCTIONS).module.CORRECT]


def _run(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["check", *args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.mark.parametrize("name", CORRECT)
def test_every_correct_sample_function_passes(capsys, name):
    code, out, _ = _run(capsys, f"{FUNCTIONS}:{name}")
    assert code == 0, out
    assert out.startswith(f"PASS {name}: passed gradcheck and gradgradcheck")


def test_wrong_clipped_relu_exits_1_and_shows_the_jacobians(capsys):
    code, out, _ = _run(capsys, f"{FUNCTIONS}:WrongClippedReLU", "--no-double")
    assert code == 1
    assert "FAIL WrongClippedReLU" in out and "numerical" in out and "analytical" in out
    assert "gradgradcheck" not in out.splitlines()[0]


def test_scaled_tanh_sample_passes_through_the_installed_script():
    proc = run_cli("check", "samples/custom_function.py:ScaledTanh")
    assert proc.returncode == 0, proc.stderr
    assert "PASS ScaledTanh" in proc.stdout


def _write(tmp_path, body: str, name: str = "fns.py") -> str:
    path = tmp_path / name
    path.write_text("import torch\n" + textwrap.dedent(body))
    return str(path)


ONCE = """
from torch.autograd.function import once_differentiable
class Sin(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()
    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()
example_inputs = (torch.tensor([0.3, -1.2], dtype=torch.float64, requires_grad=True),)
def twice(x):
    return x * 2
"""


def test_example_inputs_fallback_and_double_flag(tmp_path, capsys):
    target = _write(tmp_path, ONCE) + ":Sin"
    assert _run(capsys, target)[0] == 1  # backward is not differentiable
    assert _run(capsys, target, "--no-double")[0] == 0
    assert _run(capsys, target.replace(":Sin", ":twice"))[0] == 0  # a plain function


@pytest.mark.parametrize(
    "body, name, words",
    [
        ("x = 1\n", "Missing", "no name 'Missing'"),
        ("model = torch.nn.Linear(2, 2)\n", "model", "expected a torch.autograd.Function"),
        ("def f(x):\n    return x\n", "f", "no f_inputs() or example_inputs"),
        ("def f(x):\n    return x\ndef f_inputs():\n    raise ValueError('boom')\n", "f",
         "fns.py:5: ValueError: boom (raised while calling f_inputs())"),
        ("def f(x):\n    return x @ x\ndef f_inputs():\n"
         "    return (torch.ones(2, 3, dtype=torch.float64, requires_grad=True),)\n", "f",
         "raised RuntimeError"),
        ("def f(x):\n    return x\nexample_inputs = 'abc'\n", "f", "expected a tensor or a tuple"),
    ],
)
def test_unusable_input_exits_2_with_one_line(tmp_path, capsys, body, name, words):
    code, out, err = _run(capsys, _write(tmp_path, body) + f":{name}")
    assert code == 2
    assert out == ""
    assert err.startswith("gradscope: error:") and words in err
    assert "Traceback" not in err


@pytest.mark.parametrize("target", ["samples/nope.py:F", FUNCTIONS])
def test_missing_file_or_name_exits_2(capsys, target):
    code, _, err = _run(capsys, target)
    assert code == 2 and err.startswith("gradscope: error:")
