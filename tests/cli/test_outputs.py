"""Where `gradscope render` and `report` write: only regular files are replaced (a symlink's
target, never a FIFO, a device, a socket), `-o -` is standard output, the output path is settled
before the model file runs (a file that changes folder cannot move it), and `--format` must agree
with the suffix of `-o`. Every case runs the console script in a subprocess."""

from __future__ import annotations

import json
import os
import socket
import stat
import textwrap
from pathlib import Path

import pytest
from conftest import SAMPLES, run_cli

import gradscope as gs
from gradscope.output.files import output_target, write_atomic

MLP = str(SAMPLES / "mlp.py")

#: A model file that leaves a mark when it runs (refusals must come before it runs).
MARKED = """
import pathlib, torch
pathlib.Path({mark!r}).write_text("ran")
model = torch.nn.Linear(3, 2)
example_input = torch.randn(4, 3)
"""


def one_error_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("gradscope: error: ")
    return lines[0]


def marked_model(tmp_path: Path) -> tuple[Path, Path]:
    mark = tmp_path / "ran.txt"
    path = tmp_path / "m.py"
    path.write_text(MARKED.format(mark=str(mark)))
    return path, mark


# ---------------------------------------------------------------------------- symlinks
def test_a_symlink_is_followed_and_stays_a_link(tmp_path):
    real = tmp_path / "real.dot"
    real.write_text("old")
    link = tmp_path / "link.dot"
    link.symlink_to(real)
    proc = run_cli("render", MLP, "-o", str(link))
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text().startswith("digraph")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.dot", "real.dot"]  # no temp


def test_a_dangling_symlink_creates_its_target(tmp_path):
    (tmp_path / "out").mkdir()
    link = tmp_path / "g.json"
    link.symlink_to(tmp_path / "out" / "graph.json")
    proc = run_cli("render", MLP, "-o", str(link))
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink()
    assert json.loads((tmp_path / "out" / "graph.json").read_text())["nodes"]


def test_the_library_follows_a_symlink_too(tmp_path):
    real = tmp_path / "a.txt"
    real.write_text("old")
    (tmp_path / "b.txt").symlink_to(real)
    write_atomic(tmp_path / "b.txt", "new")
    assert (tmp_path / "b.txt").is_symlink() and real.read_text() == "new"


# ---------------------------------------------------------------------------- not a file
def test_a_fifo_is_refused_before_the_model_runs(tmp_path):
    fifo = tmp_path / "g.dot"
    os.mkfifo(fifo)
    model, mark = marked_model(tmp_path)
    line = one_error_line(run_cli("render", str(model), "-o", str(fifo)))
    assert "FIFO" in line and "not a regular file" in line and str(fifo) in line
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert not mark.exists()


def test_a_socket_and_a_folder_are_refused(tmp_path):
    sock_path = tmp_path / "g.svg"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(sock_path))
        line = one_error_line(run_cli("render", MLP, "-o", str(sock_path)))
        assert "a socket" in line
        assert stat.S_ISSOCK(os.stat(sock_path).st_mode)
    finally:
        server.close()
    folder = tmp_path / "g.json"
    folder.mkdir()
    assert "a folder" in one_error_line(run_cli("render", MLP, "-o", str(folder)))
    assert folder.is_dir()


def test_a_device_node_is_refused(tmp_path):
    """A character device made here (the same numbers as /dev/null): refused, left alone."""
    node = tmp_path / "null.svg"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    before = os.stat(node)
    line = one_error_line(run_cli("render", MLP, "-o", str(node)))
    assert "a character device" in line
    after = os.stat(node)
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev
    assert after.st_ino == before.st_ino


def test_dev_null_is_never_replaced():
    """First the check alone (nothing is written if it holds), then the command itself."""
    with pytest.raises(gs.OutputError, match="character device"):
        output_target("/dev/null")
    before = os.stat("/dev/null")
    proc = run_cli("render", MLP, "-o", "/dev/null", "--format", "svg")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode)
    assert (after.st_ino, after.st_rdev, after.st_dev) == (
        before.st_ino, before.st_rdev, before.st_dev)
    assert "character device" in one_error_line(proc)
    with pytest.raises(gs.OutputError, match="character device"):
        write_atomic("/dev/null", "x")
    assert os.stat("/dev/null").st_ino == before.st_ino


# ---------------------------------------------------------------------------- standard output
def test_dash_writes_to_standard_output(tmp_path):
    proc = run_cli("render", MLP, "-o", "-", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert "fc1.weight" in [n["name"] for n in data["nodes"]]
    assert "wrote standard output" in proc.stderr
    assert list(tmp_path.iterdir()) == []
    dot = run_cli("render", MLP, "-o", "-", "--format", "dot", cwd=tmp_path)
    assert dot.returncode == 0 and dot.stdout.startswith("digraph")


# ---------------------------------------------------------------------------- settled first
CHDIR = """
import os, torch
os.chdir({away!r})
def build():
    os.chdir({away!r})
    x = torch.randn(3, requires_grad=True)
    return (x * 2).sum()
"""


@pytest.mark.parametrize("args, written", [
    (("-o", "out.dot"), "out.dot"),
    (("--format", "dot"), "m.dot"),  # the default output too
])
def test_a_model_file_that_changes_folder_cannot_move_the_output(tmp_path, args, written):
    here, away = tmp_path / "here", tmp_path / "away"
    here.mkdir()
    away.mkdir()
    (away / "out.dot").write_text("keep me")
    (away / "m.dot").write_text("keep me too")
    (here / "m.py").write_text(CHDIR.format(away=str(away)))
    proc = run_cli("render", "m.py", *args, cwd=here)
    assert proc.returncode == 0, proc.stderr
    assert (here / written).read_text().startswith("digraph")
    assert f"wrote {written}" in proc.stderr
    assert (away / "out.dot").read_text() == "keep me"
    assert (away / "m.dot").read_text() == "keep me too"


REPORT_CHDIR = """
import os, torch
model = torch.nn.Linear(3, 1)
example_input = torch.randn(8, 3)
def loss_fn(out):
    return out.pow(2).mean()
os.chdir({away!r})
"""


def chdir_model(tmp_path: Path) -> tuple[Path, Path]:
    """A model file that changes folder as it loads: (its folder, the folder it goes to)."""
    here, away = tmp_path / "here", tmp_path / "away"
    here.mkdir()
    away.mkdir()
    (here / "m.py").write_text(REPORT_CHDIR.format(away=str(away)))
    return here, away


def test_report_outputs_are_settled_before_the_model_runs(tmp_path):
    here, away = chdir_model(tmp_path)
    proc = run_cli("report", "m.py", "--steps", "2", "--jsonl", "log.jsonl", cwd=here)
    assert proc.returncode == 0, proc.stderr
    assert len((here / "log.jsonl").read_text().splitlines()) == 2
    assert not (away / "log.jsonl").exists()


@pytest.mark.parametrize("command", [("report", "--steps", "2"), ("memory",)])
def test_a_fifo_output_is_refused_before_the_model_runs(tmp_path, command):
    here, _ = chdir_model(tmp_path)
    fifo = here / "out.json"
    os.mkfifo(fifo)
    line = one_error_line(run_cli(command[0], "m.py", *command[1:], "--json", str(fifo),
                                  cwd=here))
    assert "FIFO" in line


# ---------------------------------------------------------------------------- format vs suffix

def test_memory_outputs_are_settled_before_the_model_runs(tmp_path):
    here, away = chdir_model(tmp_path)
    proc = run_cli("memory", "m.py", "--json", "mem.json", cwd=here)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((here / "mem.json").read_text())
    assert not (away / "mem.json").exists()

def test_a_format_that_disagrees_with_the_suffix_is_refused(tmp_path):
    model, mark = marked_model(tmp_path)
    line = one_error_line(
        run_cli("render", str(model), "-o", str(tmp_path / "x.png"), "--format", "svg"))
    assert "disagree" in line and "'x.svg'" in line
    assert not (tmp_path / "x.png").exists() and not mark.exists()
    with pytest.raises(gs.FormatError, match="disagree"):
        gs.Graph([], [], []).save(tmp_path / "y.json", format="dot")


def test_a_format_with_an_agreeing_or_unknown_suffix_is_fine(tmp_path):
    assert run_cli("render", MLP, "-o", str(tmp_path / "a.dot"), "-f", "DOT").returncode == 0
    proc = run_cli("render", MLP, "-o", str(tmp_path / "a.gv"), "--format", "dot")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "a.gv").read_text().startswith("digraph")


# ---------------------------------------------------------------------------- plurals
ONE_SAVED = """
import torch
def build():
    x = torch.randn(3, requires_grad=True)
    return x.exp()
"""


def test_messages_count_in_the_singular(tmp_path):
    (tmp_path / "one.py").write_text(textwrap.dedent(ONE_SAVED))
    proc = run_cli("render", "one.py", "-o", "g.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "1 saved tensor holding" in proc.stderr and "1 saved tensors" not in proc.stderr
    from gradscope_cli.common import plural

    assert [plural(n, "box", "boxes") for n in (0, 1, 2)] == ["0 boxes", "1 box", "2 boxes"]
    assert plural(1, "node") == "1 node" and plural(3, "step") == "3 steps"
