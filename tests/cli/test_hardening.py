"""The CLI under the cases that used to break it: deep graphs, model files that exit, failed
writes, bad options, layouts Graphviz cannot finish. Every case runs the installed console
script in a subprocess (a crash there cannot take pytest down)."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES, run_cli

import gradscope as gs

CHAIN = """
import torch

def build():
    x = torch.randn(3, requires_grad=True)
    y = x
    for _ in range({n}):
        y = y * 1.0001
    return y
"""


def one_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------- deep graphs
def test_tree_of_a_60000_op_chain_does_not_crash(tmp_path):
    chain = write(tmp_path, "chain.py", CHAIN.format(n=60_000))
    proc = run_cli("tree", str(chain), "--max-lines", "5")
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])
    assert "60003 nodes" in proc.stdout


def test_render_of_a_60000_op_chain_is_bounded_and_does_not_crash(tmp_path):
    chain = write(tmp_path, "chain.py", CHAIN.format(n=60_000))
    out = tmp_path / "chain.dot"
    proc = run_cli("render", str(chain), "-o", str(out))
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])
    assert "nodes nearest the outputs" in proc.stderr and "-o graph.html" in proc.stderr
    assert "drew 1500 of 60003 nodes and 1 box;" in proc.stderr  # issue 20: the singular
    assert out.read_text().count("MulBackward0") <= 1500


DEEP_CHAIN = textwrap.dedent("""
    import sys, torch, gradscope as gs
    x = torch.ones(2, requires_grad=True)
    y = x
    for _ in range(100_000):
        y = y * 1.0
    gs.trace(y, saved=False)
    if sys.argv[1] == "release":
        assert gs.release(y) == 100_001 and y.grad_fn is None
    del y
    print("freed")
""")


@pytest.mark.parametrize("mode", ["release", "plain"])
def test_release_frees_a_deep_chain_without_recursion(mode: str):
    """Without gs.release, the same program dies with SIGSEGV once a Python walk has run
    (the "plain" run: the failure release prevents)."""
    def stack_8mib() -> None:  # the usual default, whatever this machine's ulimit -s is
        resource.setrlimit(resource.RLIMIT_STACK, (8 << 20, 8 << 20))

    proc = subprocess.run([sys.executable, "-c", DEEP_CHAIN, mode], capture_output=True,
                          text=True, timeout=120, preexec_fn=stack_8mib)
    if mode == "release":
        assert proc.returncode == 0 and "freed" in proc.stdout, proc.stderr[-400:]
    else:
        assert proc.returncode == -signal.SIGSEGV


def test_release_keeps_values_and_gradients():
    import torch

    x = torch.randn(4, requires_grad=True)
    y = (x.exp() * 2).sum()
    y.backward(retain_graph=True)
    grad = x.grad.clone()
    value = y.detach().clone()
    assert gs.release({"loss": y}) == 4
    assert y.grad_fn is None and torch.equal(y, value) and torch.equal(x.grad, grad)


# ---------------------------------------------------------------------------- model files
@pytest.mark.parametrize(
    ("body", "expect"),
    [
        ("import sys\nsys.exit(0)\n", "called sys.exit(0)"),
        ("raise SystemExit(3)\n", "called sys.exit(3)"),
        ("class Stop(BaseException):\n    pass\nraise Stop('no')\n", "Stop: no"),
        ("import torch\ndef build():\n    import sys\n    sys.exit('bye')\n",
         "called sys.exit('bye')"),
    ],
)
def test_model_files_that_exit_give_exit_2_and_one_line(tmp_path, body, expect):
    path = write(tmp_path, "m.py", body)
    proc = run_cli("render", str(path), "-o", str(tmp_path / "g.dot"))
    assert proc.returncode == 2
    line = one_line(proc)
    assert line.startswith("gradscope: error: ") and expect in line and "m.py" in line
    assert not (tmp_path / "g.dot").exists()


def test_ctrl_c_in_a_model_file_exits_130_with_the_interrupted_line(tmp_path):
    path = write(tmp_path, "m.py", "def build():\n    raise KeyboardInterrupt\n")
    proc = run_cli("tree", str(path))
    assert proc.returncode == 130
    assert one_line(proc) == "gradscope: interrupted"


def test_sigint_during_a_run_exits_130(tmp_path):
    path = write(tmp_path, "slow.py", """
        import time, torch
        def build():
            print("started", flush=True)
            time.sleep(60)
    """)
    exe = Path(sys.executable).parent / "gradscope"
    proc = subprocess.Popen([str(exe), "tree", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stderr is not None  # what the model file prints goes to stderr (issue 29)
    assert proc.stderr.readline().strip() == "started"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "gradscope: interrupted"


# ---------------------------------------------------------------------------- atomic output
def _limit_file_size(limit: int):
    def pre() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return pre


@pytest.mark.parametrize("suffix", ["svg", "dot", "json", "html"])
def test_a_failed_write_keeps_the_previous_file(tmp_path, suffix):
    if suffix == "svg" and gs.dot_binary() is None:
        pytest.skip("needs the Graphviz binary")
    out = tmp_path / f"graph.{suffix}"
    previous = b"the previous good file\n"
    out.write_bytes(previous)
    exe = Path(sys.executable).parent / "gradscope"
    proc = subprocess.run(
        [str(exe), "render", str(SAMPLES / "transformer.py"), "-o", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=240,
        preexec_fn=_limit_file_size(4096),
    )
    assert proc.returncode == 2, proc.stderr
    line = one_line(proc)
    assert line.startswith(f"gradscope: error: cannot write {out}") and "unchanged" in line
    assert out.read_bytes() == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no temporary left


def test_report_outputs_are_atomic_too(tmp_path):
    out = tmp_path / "steps.jsonl"
    out.write_text("old\n")
    exe = Path(sys.executable).parent / "gradscope"
    proc = subprocess.run(
        [str(exe), "report", str(SAMPLES / "mlp.py"), "--steps", "60", "--json", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=240,
        preexec_fn=_limit_file_size(2048),
    )
    assert proc.returncode == 2 and "cannot write" in proc.stderr.splitlines()[-1]
    assert out.read_text() == "old\n"


# ---------------------------------------------------------------------------- usage errors
@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["render", "samples/mlp.py", "--bogus"], "No such option: --bogus"),
        (["render", "samples/mlp.py", "--depth", "-1"], "'--depth'"),
        (["render", "samples/mlp.py", "--depth", "x"], "'--depth'"),
        (["tree", "samples/mlp.py", "--max-lines", "-3"], "'--max-lines'"),
        (["report", "samples/mlp.py", "--steps", "0"], "'--steps'"),
        (["render", "samples/mlp.py", "--timeout", "0"], "'--timeout'"),
        (["render"], "Missing argument"),
        (["bogus"], "No such command 'bogus'"),
    ],
)
def test_usage_errors_are_one_line_with_exit_2(args, expect):
    proc = run_cli(*args)
    assert proc.returncode == 2
    line = one_line(proc)
    assert line.startswith("gradscope: error: ") and expect in line and "-h)" in line


def test_check_with_empty_inputs_names_the_file(tmp_path):
    path = write(tmp_path, "f.py", """
        import torch
        def double(x):
            return 2 * x
        def double_inputs():
            return ()
    """)
    proc = run_cli("check", f"{path}:double")
    assert proc.returncode == 2
    assert str(path) in proc.stderr and "no arguments" in proc.stderr


# ---------------------------------------------------------------------------- layout
def test_full_image_render_stops_at_the_timeout(tmp_path):
    if gs.dot_binary() is None:
        pytest.skip("needs the Graphviz binary")
    chain = write(tmp_path, "chain.py", CHAIN.format(n=20_000))
    proc = run_cli("render", str(chain), "--full", "--timeout", "2", "-o", str(tmp_path / "c.svg"))
    assert proc.returncode == 2
    line = one_line(proc)
    assert "more than 2 s" in line and "-o graph.dot" in line
    assert not (tmp_path / "c.svg").exists()
