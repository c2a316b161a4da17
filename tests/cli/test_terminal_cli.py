"""What the commands print (issue 29 items 4, 12, 14, 21; issue 27 item 5): a model's names and
source lines are text (markup literal, escapes visible), lines fit a 72-column terminal,
``COLUMNS=0`` prints, a model that prints or replaces ``sys.stdout``/``sys.stderr`` cannot
corrupt or take gradscope's output, and the options and environments that used to end in an
internal error (exit 3) get one line and exit 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, SAMPLES, run_cli
from gradscope_cli.main import main
from rich.cells import cell_len

EXE = Path(sys.executable).parent / "gradscope"


class Done:
    """What an in-process ``main([...])`` left: its code and what it printed."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run(capsys, monkeypatch):
    """``run(*args, cwd=..., **env)``: the whole CLI (main's exit codes and one-line errors)
    in this process, so torch is imported once."""

    def call(*args: str, cwd: Path, **env: str) -> Done:
        monkeypatch.chdir(cwd)
        for key, value in {"COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb", **env}.items():
            monkeypatch.setenv(key, value)
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main(list(args))
        out, err = capsys.readouterr()
        return Done(int(exc.value.code or 0), out, err)

    return call


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, COLUMNS="120", NO_COLOR="1", TERM="dumb")
    full.update(env)
    return subprocess.run([str(EXE), *args], capture_output=True, text=True, cwd=cwd,
                          env=full, timeout=240)


def one_line(proc: subprocess.CompletedProcess | Done, code: int = 2) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == code, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "internal error" not in lines[0]
    return lines[0]


HOSTILE = """
import torch
from torch import nn
net = nn.Sequential()
net.add_module("[/]", nn.Linear(4, 8))
net.add_module("a\\x1b]0;pwned\\x07b", nn.Tanh())
net.add_module("[link=http://evil:8/]c", nn.Linear(8, 2))
model = net
example_input = torch.randn(16, 4)
"""


def test_markup_and_escapes_in_module_names_are_text_in_tree_and_memory(tmp_path, run):
    """``[/]`` used to crash tree's memory table (MarkupError, exit 3)."""
    write(tmp_path, "h.py", HOSTILE)
    for command in (["tree", "h.py"], ["memory", "h.py"]):
        proc = run(*command, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        out = proc.stdout
        assert "\x1b" not in out and "\x07" not in out
        assert "[/]" in out and "[link=http://evil:8/]c" in out
        assert "a\\x1b]0;pwned\\x07b" in out


NAN_LINE = """
import torch
def build():
    x = torch.tensor([-1.0, 4.0], requires_grad=True)
    y = x.sqrt()  # \x1b]0;pwned\x07\x1b[2J
    return y.sum()
"""


def test_the_backward_summary_shows_the_source_line_escaped(tmp_path, run):
    write(tmp_path, "n.py", NAN_LINE)
    proc = run("tree", "n.py", "--backward", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "\x1b" not in proc.stderr + proc.stdout and "\x07" not in proc.stderr
    assert "\\x1b]0;pwned\\x07\\x1b[2J" in proc.stderr


def test_lines_fit_a_72_column_terminal_and_columns_0_prints(tmp_path, run):
    """On a terminal (TTY_COMPATIBLE=1) the tree and tree's saved-memory summary wrap at 72;
    COLUMNS=0 used to make every command print nothing, its errors too."""
    proc = run("tree", str(SAMPLES / "mlp.py"), cwd=tmp_path, COLUMNS="72",
               TTY_COMPATIBLE="1", TERM="xterm")  # rich takes a dumb terminal as 80 wide
    assert proc.returncode == 0, proc.stderr
    lines = re.sub("\x1b\\[[0-9;]*m", "", proc.stdout).splitlines()  # bold and dim
    assert "(held only by the graph)" in " ".join(ln.strip() for ln in lines)
    assert max(cell_len(ln) for ln in lines) <= 72, max(lines, key=cell_len)
    zero = run("tree", str(SAMPLES / "mlp.py"), cwd=tmp_path, COLUMNS="0")
    assert zero.returncode == 0 and "AddmmBackward0" in zero.stdout, zero.stderr
    error = run("tree", "missing.py", cwd=tmp_path, COLUMNS="0")
    assert "no such file" in one_line(error)


PRINTS = """
import sys, torch
print("printed at import")
class Sink:
    def __init__(self):
        self.text = []
    def write(self, s):
        self.text.append(s)
        return len(s)
    def flush(self):
        pass
def build():
    print("printed in build")
    sys.stdout = Sink()
    sys.stderr = Sink()
    x = torch.randn(3, requires_grad=True)
    return (x * 2).sum()
"""


def test_a_model_that_prints_or_replaces_the_streams_cannot_take_the_output(tmp_path):
    write(tmp_path, "p.py", PRINTS)
    proc = cli("render", "p.py", "-o", "-", "-f", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gradscope"] >= 1  # the README's `| jq` example
    assert "printed at import" in proc.stderr and "printed in build" in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("wrote standard output: 5 nodes")
    bad = cli("render", "p.py", "-o", "-", "-f", "nope", cwd=tmp_path)
    assert "nope" in one_line(bad)


FAILS = """
import torch
def wrong(x):
    return x * 2 + 0.5 * x.detach()
def wrong_inputs():
    return (torch.randn(4, 3, dtype=torch.float64, requires_grad=True),)
"""


def test_check_headline_names_the_input_index_as_the_table_does(tmp_path, run):
    write(tmp_path, "f.py", FAILS)
    proc = run("check", "f.py:wrong", "--no-double", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    head = proc.stdout.splitlines()[0]
    assert "element in[" in head, head
    where = head.split("element ")[1].split(":")[0]
    assert where in proc.stdout.split("worst mismatch per input/output pair")[1]


DICT = """
import torch
from torch import nn
class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(4, 6)
    def forward(self, x, y=None, scale=1.0):
        return self.a(x).tanh() * scale + self.b(y).sigmoid()
torch.manual_seed(0)
model = Two()
x, y = torch.randn(8, 4), torch.randn(8, 4)
example_input = {INPUT}
"""


def test_memory_takes_inputs_as_render_does(tmp_path, run):
    """A dict is spread as keywords, a tuple as arguments; the same model called both ways
    gives the same table (it used to refuse the dict: 'dict' object has no attribute ...)."""
    tables = []
    for name, given in (("d", '{"x": x, "y": y, "scale": 2.0}'), ("t", "(x, y, 2.0)")):
        write(tmp_path, f"{name}.py", DICT.replace("{INPUT}", given))
        proc = run("memory", f"{name}.py", "--scale-batch", "2", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        tables.append(proc.stdout)
    assert tables[0] == tables[1]
    assert "tanh" not in tables[0] and " a " in tables[0].replace("\n", " ")


@pytest.mark.parametrize("args,words", [
    (["render", "{mlp}", "--timeout", "inf"], "--timeout"),
    (["render", "{mlp}", "--timeout", "1e308"], "--timeout"),
    (["memory", "{mlp}", "--budget", "1e999"], "--budget"),
    (["memory", "{mlp}", "--budget", "1e400%"], "--budget"),
    (["memory", "{mlp}", "--budget", "50%", "--max-recompute", "1e999"], "--max-recompute"),
    (["memory", "{mlp}", "--scale-batch", "inf"], "--scale-batch"),
    (["memory", "{mlp}", "--scale-batch", "0"], "--scale-batch"),
], ids=["timeout-inf", "timeout-1e308", "budget-1e999", "budget-1e400%", "max-recompute",
        "scale-batch-inf", "scale-batch-0"])
def test_options_out_of_range_are_one_line_and_exit_2(tmp_path, run, args, words):
    proc = run(*(a.format(mlp=SAMPLES / "mlp.py") for a in args), cwd=tmp_path)
    line = one_line(proc)
    assert words in line and str(SAMPLES) not in line.split(words)[0]


def test_a_bad_mplbackend_and_a_closed_stdout_are_one_line_and_exit_2(tmp_path):
    for command in (["memory", str(SAMPLES / "mlp.py"), "--plot", "m.png"],
                    ["report", str(SAMPLES / "mlp.py"), "--steps", "1", "--plot", "r.png"]):
        assert "MPLBACKEND" in one_line(cli(*command, cwd=tmp_path, MPLBACKEND="nope"))
    proc = subprocess.run(
        ["bash", "-c", f'"{EXE}" render "{SAMPLES / "mlp.py"}" -o - -f json >&-'],
        capture_output=True, text=True, cwd=tmp_path, timeout=240)
    assert "standard output is closed" in one_line(proc)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_model_exception_whose_str_raises_is_one_line_and_exit_2(tmp_path):
    write(tmp_path, "s.py", """
        class Odd(Exception):
            def __str__(self):
                raise RuntimeError("no message")
        def build():
            raise Odd()
    """)
    assert "Odd" in one_line(run_cli("tree", str(tmp_path / "s.py"), cwd=ROOT))
