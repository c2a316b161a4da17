"""The console edge of `gradscope`: a start-up that imports no torch, and every way a run can end
(an internal error, a closed pipe, Ctrl-C at any moment) gives at most one line and the
documented exit code, never a traceback. Each case runs the installed console script (or the
same entry point) in a subprocess, as a user's shell does."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES

EXE = Path(sys.executable).parent / "gradscope"
ENV = dict(os.environ, COLUMNS="120", NO_COLOR="1", TERM="dumb")
ENV.pop("GRADSCOPE_DEBUG", None)
INTERNAL = "gradscope: internal error: {} (GRADSCOPE_DEBUG=1 shows the traceback)"


def python(code: str, *args: str, env: dict[str, str] | None = None, **kw):
    """Run ``code`` in a fresh interpreter, as the console script would run ``main``."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, cwd=ROOT, env=env or ENV,
                          timeout=240, **kw)


# ---------------------------------------------------------------------------- start-up
@pytest.mark.parametrize("args", [["--help"], ["render", "--help"], ["tree", "-h"],
                                  ["report", "--help"], ["check", "--help"]])
def test_help_imports_no_torch_and_takes_under_a_second_of_cpu(args):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-X", "importtime", str(EXE), *args],
                          capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert proc.returncode == 0, proc.stderr
    assert "Usage: gradscope" in proc.stdout
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")]
    assert "typer" in imported and "gradscope" in imported  # the importtime list is real
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")]
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 1.0, f"{args}: {cpu:.2f} s of CPU"


def test_help_shows_boolean_options_as_flags():
    proc = subprocess.run([str(EXE), "render", "--help"], capture_output=True, text=True,
                          cwd=ROOT, env=ENV, timeout=60)
    assert proc.returncode == 0
    assert "<bool>" not in proc.stdout
    assert "--attrs" in proc.stdout and "--saved" in proc.stdout and "--no-saved" in proc.stdout
    assert "<path>" in proc.stdout  # options that take a value still say what


def test_import_gradscope_imports_no_torch():
    proc = python("""
        import sys, gradscope as gs
        assert "torch" not in sys.modules, "import gradscope imported torch"
        assert "svg" in gs.FORMATS
        gs.trace  # the first name that needs torch imports it
        assert "torch" in sys.modules
    """)
    assert proc.returncode == 0, proc.stderr


# ---------------------------------------------------------------------------- internal errors
FORCED = """
    import sys
    import gradscope
    def broken(spec):
        raise ZeroDivisionError("boom\\nsecond line \\x1b[31mred")
    gradscope.load_model_file = broken      # a bug anywhere under a command
    from gradscope_cli.main import main
    main(sys.argv[1:])
"""


def test_an_internal_error_is_one_line_and_exit_3():
    proc = python(FORCED, "tree", str(SAMPLES / "mlp.py"))
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.splitlines() == [INTERNAL.format("ZeroDivisionError: boom")]
    assert proc.stdout == ""


def test_gradscope_debug_shows_the_traceback_and_still_exits_3():
    proc = python(FORCED, "tree", str(SAMPLES / "mlp.py"), env=dict(ENV, GRADSCOPE_DEBUG="1"))
    assert proc.returncode == 3
    assert "Traceback (most recent call last)" in proc.stderr and "in broken" in proc.stderr
    assert proc.stderr.splitlines()[-1] == INTERNAL.format("ZeroDivisionError: boom")


def test_an_internal_error_in_process(monkeypatch, capsys):
    from gradscope_cli import main as entry
    from gradscope_cli import process

    import gradscope

    def broken(spec):
        raise KeyError("no such thing")

    monkeypatch.delenv("GRADSCOPE_DEBUG", raising=False)
    monkeypatch.setattr(gradscope, "load_model_file", broken)
    with pytest.raises(SystemExit) as exit_info:
        entry.main(["render", str(SAMPLES / "mlp.py"), "-o", "never.dot"])
    assert exit_info.value.code == process.EXIT_INTERNAL == 3
    err = capsys.readouterr().err
    assert err.splitlines() == [INTERNAL.format("KeyError: 'no such thing'")]


def test_a_gradscope_error_stays_exit_2_with_one_line():
    proc = subprocess.run([str(EXE), "tree", "no/such/file.py"], capture_output=True, text=True,
                          cwd=ROOT, env=ENV, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "gradscope: error: no such file: no/such/file.py (give the path of a Python model "
        "file, e.g. samples/mlp.py)"
    ]


def test_the_exit_codes_are_documented():
    from gradscope_cli import process as entry

    doc = entry.__doc__ or ""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for code in (entry.EXIT_INTERNAL, entry.EXIT_INTERRUPTED, entry.EXIT_PIPE_CLOSED):
        assert f" {code} " in doc, code
        assert f"`{code}`" in readme, code


# ---------------------------------------------------------------------------- closed pipes
BIG = """
import torch

def build():
    y = torch.randn(3, requires_grad=True)
    for _ in range(4000):
        y = y * 1.0001
    return y
"""


def test_a_closed_pipe_ends_quietly(tmp_path):
    """`gradscope tree big.py | head -5`: five lines, nothing on stderr."""
    (tmp_path / "big.py").write_text(BIG)
    proc = subprocess.run(
        ["sh", "-c", f'"{EXE}" tree big.py --max-lines 100000 | head -5'],
        capture_output=True, text=True, cwd=tmp_path, env=ENV, timeout=240,
    )
    assert proc.stderr == ""
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 5


def test_a_closed_pipe_exits_141_with_nothing_on_stderr(tmp_path):
    (tmp_path / "big.py").write_text(BIG)
    reader, writer = os.pipe()
    proc = subprocess.Popen([str(EXE), "tree", "big.py", "--max-lines", "100000"],
                            stdout=writer, stderr=subprocess.PIPE, cwd=tmp_path, env=ENV)
    os.close(writer)
    with os.fdopen(reader, "rb") as out:
        first = out.read(100)  # the tree has started; then the reader goes away
    _, err = proc.communicate(timeout=240)
    assert first
    assert err == b"" and proc.returncode == 141


def test_a_pipe_closed_before_anything_was_written_is_quiet():
    """The reader is gone before the help is printed: the write, or Python's own flush at
    exit, meets the closed pipe; neither may print 'Exception ignored' or a traceback."""
    reader, writer = os.pipe()
    os.close(reader)
    proc = subprocess.Popen([str(EXE), "--help"], stdout=writer, stderr=subprocess.PIPE,
                            cwd=ROOT, env=ENV)
    os.close(writer)
    _, err = proc.communicate(timeout=60)
    assert err == b"" and proc.returncode == 141


# ---------------------------------------------------------------------------- Ctrl-C
def _loaded(pid: int, what: str) -> bool:
    try:
        return what in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
def test_ctrl_c_while_torch_is_being_imported_exits_130_with_one_line():
    """A real SIGINT during start-up: sent once torch's library is mapped (its import, one to
    several seconds, is under way), before the model file is even read."""
    proc = subprocess.Popen([str(EXE), "tree", str(SAMPLES / "mlp.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)
    deadline = time.monotonic() + 60
    while not _loaded(proc.pid, "libtorch") and proc.poll() is None:
        assert time.monotonic() < deadline, "torch was never loaded"
        time.sleep(0.002)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (130, "gradscope: interrupted\n")
    assert out == ""


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc")
@pytest.mark.parametrize("marker", ["zlib.cpython", "_decimal.cpython"])
def test_ctrl_c_early_in_start_up_exits_130_with_one_line(marker):
    """SIGINT while typer, rich and gradscope are imported, before torch: sent once the process
    has mapped an extension module that only those imports load (the interpreter's own first
    tens of milliseconds, before any gradscope code runs, are Python's; see the README)."""
    proc = subprocess.Popen([str(EXE), "tree", str(SAMPLES / "mlp.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)
    deadline = time.monotonic() + 60
    while not _loaded(proc.pid, marker) and proc.poll() is None:
        assert time.monotonic() < deadline, f"{marker} was never loaded"
        time.sleep(0.001)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (130, "gradscope: interrupted\n")
    assert out == ""


def _unfilled_lines(text: str) -> list[str]:
    """Lines of a help screen after which the next line's first word would still have fitted:
    a line break from the source (a docstring paragraph written over several lines keeps its
    breaks in typer's command list and in later paragraphs), not rich's wrapping. Consecutive
    lines of one paragraph, or of one table cell (the next line starts further right than the
    panel's first column), are compared against the right edge of the box they are in."""
    bad = []
    lines = text.splitlines()
    for prev, line in zip(lines, lines[1:]):
        panel = line.startswith("│") and prev.startswith("│")
        if panel:
            inner, before = line[1:].rstrip().removesuffix("│").rstrip(), prev[1:].rstrip()
            before = before.removesuffix("│").rstrip()
            right = len(line) - 3  # "│" at both ends, one space of padding inside each
            if not inner.strip() or len(inner) - len(inner.lstrip()) <= 1 or not before.strip():
                continue  # a blank row, or a new row of the table
        else:
            inner, before = line.rstrip(), prev.rstrip()
            right = 79  # the body is padded one space each side of the 80 columns
            if not inner.strip() or not before.strip() or before.lstrip().startswith("Usage:"):
                continue
            if line.startswith(("╭", "╰")) or prev.startswith(("╭", "╰", "│")):
                continue
            if prev.startswith("     "):
                continue  # a line of code (the template of a model file) keeps its breaks
        word = inner.split()[0]
        if word.startswith("["):
            continue  # typer starts "[default: ...]" on a line of its own
        if len(before) + 1 + len(word) <= right:
            bad.append(f"{before.strip()!r} then {word!r}")
    return bad


@pytest.mark.parametrize("command", ["", "render", "tree", "report", "check", "memory", "diff",
                                     "doctor"])
def test_help_is_wrapped_as_one_text_at_80_columns(command):
    """``gradscope --help`` and each command's, 80 columns wide: no line is longer, and none
    ends before the edge while the next line's first word would have fitted there (the
    doctor's summary once broke after "a second" in the command list)."""
    env = dict(ENV, COLUMNS="80")
    proc = subprocess.run([str(EXE), *([command] if command else []), "--help"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines()) <= 80
    assert _unfilled_lines(proc.stdout) == []
