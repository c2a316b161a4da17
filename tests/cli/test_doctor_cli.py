"""``gradscope doctor FILE``: each planted bug of samples/doctor/ is named in the first lines with
exit code 1, a healthy file gives exit 0, a file that cannot be used exit 2 with one line;
names from the model are printed as data; ``render --backward`` and ``report`` point at the
doctor when they end in one of its torch errors."""

from __future__ import annotations

import textwrap

import pytest
from conftest import SAMPLES, in_process_cli

DOCTOR = SAMPLES / "doctor"


@pytest.fixture
def invoke(capsys, monkeypatch):
    """The console script's entry point, in process, at 80 columns."""
    return in_process_cli(capsys, monkeypatch, 80)


@pytest.mark.parametrize(("sample", "title"), [
    ("inplace", "inplace at inplace.py:30"),
    ("backward_twice", "backward_twice at backward_twice.py:27"),
    ("no_grad_fn", "no_grad_fn at no_grad_fn.py:47"),
    ("grad_none", "grad_none (cut) at grad_none.py:29"),
    ("training_loop", "not_in_optimizer"),
    ("inplace_forward", "inplace_forward (leaf) at inplace_forward.py:25"),
])
def test_each_planted_bug_is_named_first_with_exit_1(invoke, sample, title):
    code, out, err = invoke("doctor", str(DOCTOR / f"{sample}.py"))
    assert code == 1, err
    lines = out.splitlines()
    assert "finding" in lines[0]
    assert lines[1].startswith(title), out
    assert any(line.strip().startswith("fix: ") for line in lines)
    assert max(len(line) for line in lines) <= 80


def test_a_healthy_file_exits_0(invoke):
    code, out, err = invoke("doctor", str(DOCTOR / "healthy.py"))
    assert code == 0, err
    assert out.startswith("healthy: no findings (2 backwards, 2 optimizer steps)")


def test_a_file_it_cannot_use_is_one_line_and_exit_2(invoke, tmp_path):
    code, _, err = invoke("doctor", str(tmp_path / "missing.py"))
    assert code == 2 and err.count("\n") == 1 and "no such file" in err
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nmodel = torch.nn.Linear(2, 2)\n"
                      "example_input = torch.ones(3)\n")
    code, _, err = invoke("doctor", str(broken))
    assert code == 2 and err.startswith("gradscope: error: ") and err.count("\n") == 1


def test_names_from_the_model_are_data(invoke, tmp_path):
    f = tmp_path / "evil.py"
    f.write_text(textwrap.dedent('''
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.add_module("[red]evil\\x1b[2J", nn.Linear(4, 4))
                self.out = nn.Linear(4, 1)

            def forward(self, x):
                return self.out(x)

        model = Net()
        example_input = torch.randn(2, 4)
        def loss_fn(output): return output.sum()
    '''))
    code, out, _ = invoke("doctor", str(f))
    assert code == 1
    assert "[red]evil\\x1b[2J.weight" in out and "\x1b" not in out


def test_render_backward_and_report_point_at_the_doctor(invoke):
    code, _, err = invoke("render", str(DOCTOR / "inplace.py"), "--backward", "-o", "-",
                          "--format", "json")
    assert code == 2 and "modified by an inplace operation" in err
    assert "gradscope doctor" in err and err.count("\n") == 1
    code, _, err = invoke("report", str(DOCTOR / "backward_twice.py"), "--steps", "2")
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert "backward through the graph a second time" in last and "gradscope doctor" in last


def test_json_writes_the_findings(invoke, tmp_path):
    from gradscope.doctor.findings import findings_from_json

    out = tmp_path / "f.json"
    code, _, err = invoke("doctor", str(DOCTOR / "grad_none.py"), "--json", str(out))
    assert code == 1 and "wrote" in err
    found = findings_from_json(out.read_text())
    assert [(f.kind, f.reason, f.param) for f in found] == [
        ("grad_none", "cut", "gate.weight"), ("grad_none", "cut", "gate.bias")]
