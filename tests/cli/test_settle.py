"""Outputs never replace inputs (issue 29 items 1, 23, 25; issue 27 item 5): every command's
outputs are settled in one place (``gradscope_cli.outputs.settle``) before the model file runs;
one aimed at an input, at another output, into a missing folder (without ``--mkdir``), with a
name the file system cannot take, or with a suffix the option cannot write is refused in one
line, exit 2, and the model file never ran."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import SAMPLES
from gradscope_cli.main import main


class Done:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """The whole CLI (main's codes and one-line errors) in this process: torch imported once."""

    def call(*args: str, cwd: Path) -> Done:
        monkeypatch.chdir(cwd)
        monkeypatch.setenv("COLUMNS", "120")
        capsys.readouterr()
        with pytest.raises(SystemExit) as exc:
            main(list(args))
        out, err = capsys.readouterr()
        return Done(int(exc.value.code or 0), out, err)

    return call

MODEL = """
import pathlib, torch
pathlib.Path(__file__).with_name("ran.txt").write_text("ran")
model = torch.nn.Linear(3, 2)
example_input = torch.randn(4, 3)
def loss_fn(out):
    return out.pow(2).mean()
"""


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.py"
    path.write_text(MODEL, encoding="utf-8")
    return path


def refused(proc, *words: str) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def unchanged(model: Path) -> None:
    assert model.read_text(encoding="utf-8") == MODEL
    assert not model.with_name("ran.txt").exists(), "the model file ran"


@pytest.mark.parametrize("args", [
    ["report", "{m}", "--json", "{m}", "--steps", "1"],
    ["memory", "{m}", "--json", "{m}"],
    ["memory", "{m}", "--json", "{link}"],
    ["report", "{m}", "--csv", "{hard}", "--steps", "1"],
    ["render", "{m}", "-o", "{m}", "-f", "dot"],
    ["doctor", "{m}", "--json", "{m}"],
    ["doctor", "{m}", "--json", "{link}"],
], ids=["report-json", "memory-json", "memory-json-symlink", "report-csv-hardlink", "render",
        "doctor-json", "doctor-json-symlink"])
def test_an_output_aimed_at_the_model_file_is_refused_before_it_runs(model, tmp_path, args,
                                                                    run_cli):
    (tmp_path / "link.py").symlink_to(model)
    os.link(model, tmp_path / "hard.py")
    names = {"m": str(model), "link": str(tmp_path / "link.py"), "hard": str(tmp_path / "hard.py")}
    proc = run_cli(*(a.format(**names) for a in args), cwd=tmp_path)
    refused(proc, "the model file", "replace an input")
    unchanged(model)


def test_two_outputs_naming_one_file_are_refused(model, tmp_path, run_cli):
    proc = run_cli("report", str(model), "--json", "x.out", "--csv", "./x.out", "--steps", "1",
                   cwd=tmp_path)
    refused(proc, "--json and --csv name the same file")
    unchanged(model)
    assert not (tmp_path / "x.out").exists()


def test_diff_refuses_an_output_over_an_input_and_a_wrong_suffix(tmp_path, run_cli):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    for p in (a, b):
        proc = run_cli("render", str(SAMPLES / "mlp.py"), "-o", str(p), cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
    before = b.read_bytes()
    refused(run_cli("diff", str(a), str(b), "-o", str(b), cwd=tmp_path), "the second graph")
    assert b.read_bytes() == before
    refused(run_cli("diff", str(a), str(b), "-o", "d.svg", cwd=tmp_path), ".html")
    assert not (tmp_path / "d.svg").exists()
    assert run_cli("diff", str(a), str(b), "-o", "d.html", cwd=tmp_path).returncode == 0
    assert (tmp_path / "d.html").read_text().lstrip().lower().startswith("<!doctype html")


@pytest.mark.parametrize("command", [
    ["render", "{m}", "-o", "{out}.json"],
    ["memory", "{m}", "--json", "{out}.json"],
    ["doctor", "{m}", "--json", "{out}.json"],
], ids=["render", "memory", "doctor"])
def test_a_missing_folder_is_refused_unless_mkdir(model, tmp_path, command, run_cli):
    out = tmp_path / "missing" / "deeper" / "x"
    args = [a.format(m=model, out=out) for a in command]
    refused(run_cli(*args, cwd=tmp_path), "does not exist", "--mkdir")
    unchanged(model)
    assert not (tmp_path / "missing").exists()
    proc = run_cli(*args, "--mkdir", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert Path(f"{out}.json").stat().st_size > 0


def test_a_250_character_name_is_written_and_a_300_one_refused_first(model, tmp_path,
                                                                    run_cli):
    name = "g" * 245 + ".json"
    proc = run_cli("render", str(model), "-o", name, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / name).stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["m.py", name, "ran.txt"])
    (tmp_path / "ran.txt").unlink()
    refused(run_cli("render", str(model), "-o", "h" * 295 + ".json", cwd=tmp_path),
            "too long")
    unchanged(model)


def test_every_way_of_naming_an_input_is_caught_in_process(tmp_path, monkeypatch):
    """``settle`` itself, over the spellings of one file: relative, ``..``, a link to a
    link, a hard link; and two outputs that are one file however they are written."""
    from gradscope_cli.outputs import settle

    import gradscope as gs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    model = tmp_path / "m.py"
    model.write_text("x = 1\n")
    (tmp_path / "l1.py").symlink_to(model)
    (tmp_path / "l2.py").symlink_to(tmp_path / "l1.py")
    os.link(model, tmp_path / "h.py")
    inputs = [("the model file", "m.py")]
    for aim in ("m.py", "./m.py", "sub/../m.py", str(model), "l2.py", "h.py"):
        with pytest.raises(gs.OutputError, match="the model file"):
            settle([("--json", Path(aim))], inputs=inputs)
    for a, b in (("x.json", "./x.json"), ("x.json", "sub/../x.json"), ("x.json", "x.json")):
        with pytest.raises(gs.OutputError, match="name the same file"):
            settle([("--json", Path(a)), ("--csv", Path(b))], inputs=inputs)
    done = settle([("--json", Path("a.json")), ("--csv", None), ("-o", Path("-"))],
                  inputs=inputs, stdout=("-o",))
    assert done[0] is not None and done[0].path == tmp_path / "a.json"
    assert done[1:] == [None, None]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.py", "l1.py", "l2.py", "m.py",
                                                         "sub"]


@pytest.mark.parametrize("args", [
    ["report", "{m}", "--csv", "-", "--steps", "1"],
    ["report", "{m}", "--json", "-", "--steps", "1"],
    ["memory", "{m}", "--json", "-"],
    ["doctor", "{m}", "--json", "-"],
], ids=["report-csv", "report-json", "memory-json", "doctor-json"])
def test_dash_is_refused_where_only_a_file_is_written(model, tmp_path, args, run_cli):
    """Only ``render -o -`` writes to standard output; elsewhere ``-`` was taken as "not
    asked for" (nothing written, nothing said) or as a file named ``-``."""
    proc = run_cli(*(a.format(m=model) for a in args), cwd=tmp_path)
    refused(proc, " -: ", "not to standard output", "give a file name")
    unchanged(model)
    assert not (tmp_path / "-").exists()


@pytest.mark.parametrize("args", [
    ["report", "{m}", "--plot", "p.svg", "--steps", "1"],
    ["memory", "{m}", "--plot", "q.jpg"],
    ["memory", "{m}", "--step", "--plot", "q.pdf"],
], ids=["report", "memory", "memory-step"])
def test_a_plot_not_named_png_is_refused(model, tmp_path, args, run_cli):
    """The plots are PNG: a .svg/.jpg/.pdf name would hold PNG bytes under the wrong suffix."""
    pytest.importorskip("matplotlib")
    proc = run_cli(*(a.format(m=model) for a in args), cwd=tmp_path)
    refused(proc, "--plot", ".png")
    unchanged(model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.py"]


def test_doctor_json_is_written_where_asked(model, tmp_path, run_cli):
    proc = run_cli("doctor", str(model), "--json", "out/d.json", "--mkdir", cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stderr
    assert (tmp_path / "out" / "d.json").read_text().startswith("{")
    assert model.read_text(encoding="utf-8") == MODEL
