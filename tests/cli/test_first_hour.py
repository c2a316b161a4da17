"""The first hour of a user: ``print()`` of every report shows the report, the terminal width
is kept when piped, every command's help says what a model file needs, and ``gradscope
example`` writes one."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import SAMPLES

import gradscope as gs

ANSI = re.compile(r"\x1b\[")


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def _plain(value: object) -> str:
    text = str(value)
    assert "object at 0x" not in text and not ANSI.search(text), text
    assert text.strip(), "empty text"
    assert max(len(line) for line in text.splitlines()) <= 100
    return text


def test_print_of_the_monitor_report_is_its_text(capsys):
    model = _mlp()
    with gs.GradMonitor(model) as mon:
        for _ in range(3):
            model(torch.randn(4, 3)).sum().backward()
    text = _plain(mon.report())
    assert "0.weight" in text and "2.bias" in text
    assert _plain(mon.log.report()) == text
    print(mon.report())
    assert "0.weight" in capsys.readouterr().out


def test_rich_still_draws_the_report_as_before():
    from rich.console import Console

    model = _mlp()
    with gs.GradMonitor(model) as mon:
        model(torch.randn(4, 3)).sum().backward()
    console = Console(width=100, color_system=None, record=True)
    with console.capture() as captured:
        console.print(mon.report())
    drawn = [line.rstrip() for line in captured.get().rstrip("\n").splitlines()]
    assert drawn == str(mon.report()).splitlines()
    assert mon.report().renderable is not None  # the renderable itself is still reachable


def test_print_of_a_check_result_and_an_explanation():
    functions = gs.load_model_file(SAMPLES / "functions.py").module
    result = gs.check(functions.ClippedReLU, *functions.ClippedReLU_inputs())
    assert "ClippedReLU" in _plain(result.render())
    x = torch.arange(6.0).reshape(2, 3)
    assert "stride" in _plain(gs.explain(x.t(), x).render()).lower()


def test_print_of_the_memory_reports():
    model = _mlp()
    x = torch.randn(4, 3)
    with gs.saved_memory(model) as mem:
        out = model(x)
    assert "0" in _plain(mem.report().render())
    del out
    report = gs.activation_report(model, x)
    assert "Linear" in _plain(report.render()) or "0" in _plain(report.render())
    step = gs.step_memory(model, x)
    assert "peak" in _plain(step.render()).lower()


def test_print_of_the_doctor_report_and_the_graph():
    model = _mlp()
    with gs.doctor(model) as doc:
        model(torch.randn(4, 3)).sum().backward()
    _plain(doc.report().render())
    graph = gs.trace(model(torch.randn(2, 3)), model=model)
    assert "AddmmBackward0" in _plain(graph.render())


# ------------------------------------------------------------- the terminal's width, piped
def _piped(*args: str, columns: int, cwd=None) -> str:
    """``COLUMNS=N gradscope ARGS | cat``: standard output a pipe, no terminal anywhere."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from conftest import ROOT

    exe = Path(sys.executable).parent / "gradscope"
    env = dict(os.environ, COLUMNS=str(columns), NO_COLOR="1", TERM="dumb", OMP_NUM_THREADS="1")
    proc = subprocess.run([str(exe), *args], capture_output=True, stdin=subprocess.DEVNULL,
                          text=True, cwd=cwd or ROOT, env=env, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.stdout


def test_tree_of_a_deep_encoder_fits_80_columns_through_a_pipe_and_reads_block_by_block():
    text = _piped("tree", "samples/deep_encoder.py", columns=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    tree = lines[: next(i for i, ln in enumerate(lines) if ln.startswith("saved tensors hold"))]
    first: dict[str, int] = {}
    for i, line in enumerate(tree):
        for layer in ("63.linear1", "63.self_attn", "62.norm2", "62.linear1", "0.norm1"):
            if f"encoder.layers.{layer}" in line:
                first.setdefault(layer, i)
    # the last block is drawn whole (feed-forward, then attention) before the one below it,
    # and the skip path does not walk down to the first block on the way
    assert first["63.linear1"] < first["63.self_attn"] < first["62.norm2"] < first["62.linear1"]
    assert first["62.linear1"] < first.get("0.norm1", len(tree))
    assert "(shown below)" in text
    residual = re.compile(r"AddBackward0  n\d+  \[encoder\.layers\.\d+\]$")
    spine = [ln for ln in tree if residual.search(ln)]
    assert len(spine) > 40 and {len(ln) - len(ln.lstrip()) for ln in spine} == {0}, spine[:4]


WIDE = '''
import torch


class WideWrong(torch.autograd.Function):
    """A wrong backward whose Jacobians hold wide numbers: 8 columns of -2.17879e-05*."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w * 1234.5678

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w * 1234.5678 * 1.001, g * x * 1.0e-5


def WideWrong_inputs():
    torch.manual_seed(0)
    return (torch.randn(2, 4, dtype=torch.float64, requires_grad=True),
            torch.randn(2, 4, dtype=torch.float64, requires_grad=True))
'''


@pytest.mark.parametrize("columns", [80, 40])
def test_check_keeps_every_number_and_mismatch_mark_at_a_narrow_width(tmp_path, columns):
    (tmp_path / "wide.py").write_text(WIDE, encoding="utf-8")
    narrow = _piped("check", "wide.py:WideWrong", "--no-double", columns=columns, cwd=tmp_path)
    wide = _piped("check", "wide.py:WideWrong", "--no-double", columns=200, cwd=tmp_path)
    assert max(len(line) for line in narrow.splitlines()) <= columns
    assert "…" not in narrow  # no number cut
    assert narrow.count("*") == wide.count("*") >= 16
    starred = re.compile(r"-?\d[\d.]*(?:e[+-]\d+)?\*")  # each mismatch, its number whole
    assert sorted(starred.findall(narrow)) == sorted(starred.findall(wide))


def test_check_of_the_clipped_relu_sample_keeps_its_marks_at_80_columns():
    narrow = _piped("check", "samples/functions.py:WrongClippedReLU", columns=80)
    wide = _piped("check", "samples/functions.py:WrongClippedReLU", columns=200)
    assert narrow.count("*") == wide.count("*") > 0
    assert max(len(line) for line in narrow.splitlines()) <= 80


# ------------------------------------------------------- what a file needs, and an example
MODEL_COMMANDS = ["render", "tree", "report", "memory", "doctor"]


def _help(capsys, monkeypatch, *args: str) -> str:
    from gradscope_cli.main import main

    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exc:
        main([*args, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", MODEL_COMMANDS)
def test_help_of_a_model_command_shows_the_template_and_the_example(capsys, monkeypatch,
                                                                    command):
    from gradscope.modelfile import TEMPLATE_CODE as TEMPLATE

    text = _help(capsys, monkeypatch, command)
    flat = " ".join(text.split())
    for line in TEMPLATE.splitlines():
        assert " ".join(line.split()) in flat, line
    assert "gradscope example mlp" in flat
    assert "samples/" not in text  # not in the wheel: the user has no such folder


def test_help_of_check_and_diff_say_what_their_files_are(capsys, monkeypatch):
    check = " ".join(_help(capsys, monkeypatch, "check").split())
    assert "def Square_inputs():" in check and "gradscope example functions" in check
    assert "samples/" not in check
    diff = " ".join(_help(capsys, monkeypatch, "diff").split())
    assert "-o a.json" in diff and "gradscope example mlp" in diff


def test_help_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys\nfrom gradscope_cli.main import main\n"
            "try:\n    main(['tree', '--help'])\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write(str('torch' in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.stderr.endswith("False"), proc.stderr
    assert "gradscope example mlp" in proc.stdout


def test_bundled_examples_are_the_samples_byte_for_byte():
    from gradscope_cli import example

    assert set(example.names()) >= {"mlp", "nan_training", "functions", "memory_blocks"}
    for name in example.names():
        bundled = (example.EXAMPLES / f"{name}.py").read_bytes()
        assert bundled == (SAMPLES / f"{name}.py").read_bytes(), (
            f"cli/examples/{name}.py differs from samples/{name}.py: copy the sample over it"
        )


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    from gradscope_cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_example_writes_a_model_file_that_every_command_reads(capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    code, out, _ = _cli(capsys, "example")
    assert code == 0 and "mlp" in out and "nan_training" in out
    code, _, err = _cli(capsys, "example", "mlp")
    assert code == 0 and "wrote mlp.py" in err and "gradscope tree mlp.py" in err
    assert "samples/" not in (tmp_path / "mlp.py").read_text(encoding="utf-8")
    code, out, _ = _cli(capsys, "tree", "mlp.py")
    assert code == 0 and "AddmmBackward0" in out
    code, _, err = _cli(capsys, "example", "mlp")  # never overwrites silently
    assert code == 2 and "--force" in err
    code, _, err = _cli(capsys, "example", "nope")
    assert code == 2 and "mlp" in err
    code, _, _ = _cli(capsys, "example", "functions", "-o", "fns.py")
    assert code == 0
    code, out, _ = _cli(capsys, "check", "fns.py:ClippedReLU")
    assert code == 0 and out.startswith("PASS ClippedReLU")
    code, out, _ = _cli(capsys, "example", "memory_blocks", "-o", "-")
    assert code == 0 and out == (SAMPLES / "memory_blocks.py").read_text(encoding="utf-8")


# ------------------------------------------------------------------- the monitor's picture
def test_plot_shows_each_parameter_legibly_and_the_band_keeps_the_axis(monkeypatch, tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from gradscope.monitor.views import plot_series

    figures = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig) or real_close(fig))
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with gs.GradMonitor(model) as mon:
        for _ in range(40):
            opt.zero_grad()
            model(torch.randn(16, 3)).pow(2).mean().backward()
            opt.step()
    out = mon.plot(tmp_path / "grads.png")
    assert out.read_bytes()[:4] == b"\x89PNG"
    (fig,) = figures
    history, total = fig.axes[:2]
    assert "per parameter" in history.get_title()
    legend = [t.get_text() for t in history.get_legend().get_texts()]
    assert set(legend) >= {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert len(history.get_lines()) >= 4
    for ax in fig.axes:
        for label in ax.get_xticklabels() + ax.get_yticklabels():
            assert label.get_rotation() == 0
        texts = [*ax.get_xticklabels(), *ax.get_yticklabels(), ax.title, ax.xaxis.label]
        legend_box = ax.get_legend()
        texts += legend_box.get_texts() if legend_box is not None else []
        assert all(t.get_fontsize() >= 9 for t in texts if t.get_text())
    series = plot_series(mon.log)
    assert series["limit"], "no spike band drawn: the run is too short"
    low, high = total.get_ylim()
    assert high < min(series["limit"])  # the 10x band is clipped, the norms fill the panel
    assert high <= 1.5 * max(series["total"]) and low >= 0.5 * min(series["total"])


# ------------------------------------------------------------------------- scripts/demo.sh
def _demo_tree(tmp_path, setup: str):
    """A copy of the repository's demo with a stand-in ``setup.sh`` (the real one installs)."""
    import shutil

    from conftest import ROOT

    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "demo.sh", tmp_path / "scripts" / "demo.sh")
    (tmp_path / "scripts" / "setup.sh").write_text(setup, encoding="utf-8")
    (tmp_path / "samples").mkdir()
    shutil.copy(SAMPLES / "mlp.py", tmp_path / "samples" / "mlp.py")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    return tmp_path


def _bash(cwd, *args: str):
    import os
    import shutil
    import subprocess

    if shutil.which("dot") is None:
        pytest.skip("the demo renders an SVG: Graphviz is needed")
    env = dict(os.environ, COLUMNS="100", NO_COLOR="1", TERM="dumb", OMP_NUM_THREADS="1")
    return subprocess.run(["bash", "scripts/demo.sh", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, env=env)


def test_demo_ends_with_the_picture_and_a_summary_and_logs_the_installers(tmp_path):
    root = _demo_tree(tmp_path, "echo 'Collecting torch==2.13.0'\necho 'pip chatter' >&2\n")
    proc = _bash(root)
    assert proc.returncode == 0, proc.stderr
    assert "Collecting" not in proc.stdout + proc.stderr  # the installers went to the log
    assert "Collecting torch" in (root / "out" / "setup.log").read_text(encoding="utf-8")
    last = proc.stdout.rstrip("\n").splitlines()[-2:]
    assert last[0] == "picture: out/mlp.svg" and (root / "out" / "mlp.svg").is_file()
    assert re.match(r"\d+ nodes \(.*\), \d+ edges", last[1]), last


def test_demo_shows_the_log_tail_when_the_set_up_fails(tmp_path):
    root = _demo_tree(tmp_path, "echo 'ERROR: no matching distribution for torch'\nexit 3\n")
    proc = _bash(root)
    assert proc.returncode != 0
    assert "ERROR: no matching distribution for torch" in proc.stderr
    assert "out/setup.log" in proc.stdout + proc.stderr
