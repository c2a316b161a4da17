"""`gradscope render` and `gradscope tree` through a subprocess, as users run them: every sample
renders, and every bad input gets one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import textwrap

import pytest
from conftest import SAMPLES, run_cli

FOUNDATION_SAMPLES = ["mlp", "cnn", "transformer", "custom_function"]


def one_error_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr  # one line: what happened, how to fix it
    assert lines[0].startswith("gradscope: error: ")
    return lines[0]


@pytest.mark.parametrize("sample", FOUNDATION_SAMPLES)
def test_render_every_sample(tmp_path, sample):
    fmt = "svg" if shutil.which("dot") else "dot"
    out = tmp_path / f"{sample}.{fmt}"
    proc = run_cli("render", str(SAMPLES / f"{sample}.py"), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert out.exists() and out.stat().st_size > 500
    assert f"wrote {out}" in proc.stderr


def test_render_json_loss_attrs_and_default_output(tmp_path):
    shutil.copy(SAMPLES / "mlp.py", tmp_path / "mine.py")
    proc = run_cli("render", "mine.py", "--format", "json", "--loss", "--attrs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "mine.json").read_text())
    names = [n["name"] for n in data["nodes"]]
    assert "NllLossBackward0" in names and "fc1.weight" in names


def test_render_no_saved(tmp_path):
    out = tmp_path / "g.dot"
    assert run_cli("render", str(SAMPLES / "mlp.py"), "-o", str(out), "--no-saved").returncode == 0
    assert "orange" not in out.read_text()


def test_tree_prints_names_shapes_and_bytes():
    proc = run_cli("tree", str(SAMPLES / "mlp.py"))
    assert proc.returncode == 0, proc.stderr
    assert "AddmmBackward0" in proc.stdout and "fc1.weight (16, 8)" in proc.stdout
    assert "KiB" in proc.stdout or " B" in proc.stdout


def test_named_entry_point(tmp_path):
    (tmp_path / "two.py").write_text(textwrap.dedent("""
        import torch
        x = torch.randn(3, requires_grad=True)
        def first():
            return x.exp().sum()
        def second():
            return {"a": x.sin(), "b": [x.cos(), None]}
    """))
    proc = run_cli("tree", "two.py:second", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "SinBackward0" in proc.stdout and "CosBackward0" in proc.stdout
    assert "ExpBackward0" not in proc.stdout


def test_main_block_does_not_run(tmp_path):
    (tmp_path / "m.py").write_text(textwrap.dedent("""
        import torch
        model = torch.nn.Linear(2, 2)
        example_input = torch.randn(1, 2)
        if __name__ == "__main__":
            open("MAIN_RAN", "w").write("oops")
    """))
    assert run_cli("tree", "m.py", cwd=tmp_path).returncode == 0
    assert not (tmp_path / "MAIN_RAN").exists()


BAD_FILES = {
    "syntax": ("def build(:\n    pass\n", r"bad\.py:1: SyntaxError"),
    "import_error": ("import torch\nx = 1\nraise ValueError('broken on purpose')\n",
                     r"bad\.py:3: ValueError: broken on purpose \(raised while importing"),
    "nothing": ("import torch\nweights = 3\n", r"neither a zero-argument build\(\) nor model"),
    "no_grad": ("import torch\nmodel = torch.nn.Linear(2, 2)\nexample_input = torch.randn(1, 2)\n"
                "model.requires_grad_(False)\n", r"no_grad"),
    "build_raises": ("def build():\n    return 1 / 0\n", r"bad\.py:2: ZeroDivisionError"),
    "model_class": ("import torch\nclass Net(torch.nn.Module):\n    pass\nmodel = Net\n"
                    "example_input = torch.randn(1)\n", r"not an instance"),
    "no_example_input": ("import torch\nmodel = torch.nn.Linear(2, 2)\n", r"no example_input"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_model_files(tmp_path, case):
    source, pattern = BAD_FILES[case]
    (tmp_path / "bad.py").write_text(source)
    proc = run_cli("render", "bad.py", "-o", "x.dot", cwd=tmp_path)
    import re

    assert re.search(pattern, one_error_line(proc)), proc.stderr
    if case == "nothing":
        assert "a model file defines model (an nn.Module) and example_input" in proc.stderr


def test_missing_file_and_missing_name(tmp_path):
    assert "no such file" in one_error_line(run_cli("tree", str(tmp_path / "nope.py")))
    line = one_error_line(run_cli("tree", f"{SAMPLES / 'mlp.py'}:nothere"))
    assert "no name 'nothere'" in line
    line = one_error_line(run_cli("tree", f"{SAMPLES / 'mlp.py'}:example_input"))
    assert "example_input is Tensor" in line and "build()" in line


def test_unknown_format(tmp_path):
    line = one_error_line(run_cli("render", str(SAMPLES / "mlp.py"), "-o", str(tmp_path / "g.gif")))
    assert "unknown output format 'gif'" in line
    line = one_error_line(run_cli("render", str(SAMPLES / "mlp.py"), "--format", "bmp"))
    assert "unknown output format 'bmp'" in line


def test_no_graphviz_binary(tmp_path):
    env_path = os.environ["PATH"]
    os.environ["PATH"] = str(tmp_path)  # run_cli copies os.environ: no `dot` on this PATH
    try:
        proc = run_cli("render", str(SAMPLES / "mlp.py"), "-o", str(tmp_path / "g.svg"))
    finally:
        os.environ["PATH"] = env_path
    line = one_error_line(proc)
    assert "apt-get install graphviz" in line and "-o graph.dot" in line
    assert not (tmp_path / "g.svg").exists()


def test_loss_without_loss_fn(tmp_path):
    (tmp_path / "m.py").write_text(
        "import torch\nmodel = torch.nn.Linear(2, 2)\nexample_input = torch.randn(1, 2)\n"
    )
    line = one_error_line(run_cli("render", "m.py", "--loss", "-o", "g.dot", cwd=tmp_path))
    assert "no loss_fn" in line


def test_help_lists_commands():
    proc = run_cli("--help")
    assert proc.returncode == 0 and "render" in proc.stdout and "tree" in proc.stdout


def test_render_backward_marks_the_first_nan_and_exits_1(tmp_path):
    out = tmp_path / "nan.dot"
    proc = run_cli("render", str(SAMPLES / "nan_backward.py"), "--backward", "-o", str(out))
    assert proc.returncode == 1, proc.stderr
    text = out.read_text()
    assert "first nan gradient" in text and "#0 " in text
    assert "SqrtBackward0" in proc.stderr and "nan_backward.py:" in proc.stderr
    ok = run_cli("tree", str(SAMPLES / "mlp.py"), "--backward")
    assert ok.returncode == 0 and "#0 " in ok.stdout and "‖∇‖" in ok.stdout


def test_tree_at_a_depth_lists_modules_and_their_memory():
    proc = run_cli("tree", str(SAMPLES / "transformer.py"), "--depth", "1")
    assert proc.returncode == 0, proc.stderr
    assert "encoder (TransformerEncoder)" in proc.stdout
    assert "saved tensors hold" in proc.stdout and "module" in proc.stdout


def test_render_memory_labels_the_nodes(tmp_path):
    dot = tmp_path / "m.dot"
    proc = run_cli("render", str(SAMPLES / "mlp.py"), "--memory", "-o", str(dot))
    assert proc.returncode == 0 and "holds 2.0 KiB" in dot.read_text()


def test_render_to_html_writes_a_page(tmp_path):
    html = tmp_path / "m.html"
    proc = run_cli("render", str(SAMPLES / "mlp.py"), "-o", str(html))
    assert proc.returncode == 0 and html.read_text().lstrip().lower().startswith("<!doctype html")
