"""`gradscope render` / `tree` of model files whose model is torch.compile'd (in process, through
typer's runner: a subprocess would pay torch's import and the compile again for each case;
tests/cli/test_samples.py runs samples/compiled.py as a subprocess)."""

from __future__ import annotations

import json
import textwrap

import pytest
import torch._dynamo
from conftest import SAMPLES
from gradscope_cli.main import app
from typer.testing import CliRunner

import gradscope as gs
from gradscope._torch import torchcompat
from gradscope.graph import compiled

SAMPLE = str(SAMPLES / "compiled.py")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def run(*args: str):
    # a wide terminal, whatever an earlier test left in the environment: the tree wraps its
    # long lines at the terminal's width, and these tests read whole forward lines
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def test_tree_draws_the_region_without_a_dynamo_warning():
    code, out, err = run("tree", SAMPLE)
    assert code == 0, err
    assert "aten.threshold_backward.default" in out
    assert "[<compiled>.fc1]" in out and "[<compiled>.norm]" in out
    assert "CompiledFunctionBackward" in out
    assert "Warning" not in out + err and "graph break" not in out + err


def test_render_backward_json_has_the_region_and_its_boundary_gradients(tmp_path):
    path = tmp_path / "c.json"
    code, _, err = run("render", SAMPLE, "--backward", "-o", str(path))
    assert code == 0, err
    assert "all gradients finite" in err
    graph = gs.Graph.from_json(path.read_text())
    (region,) = [n for n in graph.nodes if n.compiled is not None]
    assert region.compiled.ops == sum(1 for n in graph.nodes if n.region == region.id) - 1
    assert region.order is not None
    leaving = [e for e in graph.edges if e.grad_norm is not None
               and graph.node(e.src).region == region.id
               and graph.node(e.dst).kind == "accumulate"]
    assert len(leaving) == 6  # one per parameter: fc1, norm, fc2 weights and biases


def test_render_depth_1_draws_the_region_as_one_box(tmp_path):
    path = tmp_path / "d.dot"
    code, _, err = run("render", SAMPLE, "--depth", "1", "-o", str(path))
    assert code == 0, err
    dot = path.read_text()
    assert "<compiled>" in dot and "torch.compile region" in dot
    assert "aten.mm.default" not in dot


NAN_FILE = textwrap.dedent('''
    import torch
    from torch import nn

    class SqrtFeatures(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 8)
            self.head = nn.Linear(8, 1)

        def forward(self, x):
            h = self.fc(x)
            return self.head(torch.where(h > 0, h.sqrt(), torch.zeros_like(h)))

    torch.manual_seed(0)
    model = torch.compile(SqrtFeatures(), backend="aot_eager")
    example_input = torch.randn(16, 6)

    def loss_fn(output):
        return output.pow(2).mean()
''')


def test_tree_backward_names_the_nan_inside_the_region(tmp_path):
    path = tmp_path / "nan_compiled.py"
    path.write_text(NAN_FILE)
    code, out, err = run("tree", str(path), "--backward")
    assert code == 1, err  # a NaN found: the problem asked about
    assert "first non-finite gradient: nan from aten.mul.Scalar" in out
    assert "nan_compiled.py:13: return self.head(torch.where(h > 0, h.sqrt()" in out
    assert "aten.mul.Scalar" in err  # the summary line


def test_an_opaque_region_gets_a_one_line_note(monkeypatch):
    # a torch whose AOTAutograd lacks what gradscope reads (the probe is by feature, not version)
    monkeypatch.setattr(torchcompat, "_OUTPUT_KINDS", ("non_alias", "kind_of_a_future_torch"))
    monkeypatch.setattr(torchcompat, "_SUPPORT", [])
    compiled._REGIONS.clear()
    code, out, err = run("tree", SAMPLE)
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("gradscope: note:")]
    assert len(notes) == 1 and "drawn opaque" in notes[0] and torch.__version__ in notes[0]
    assert "aten." not in out and "CompiledFunctionBackward" in out


def test_json_of_a_region_is_valid_schema_4(tmp_path):
    path = tmp_path / "c.json"
    code, _, err = run("render", SAMPLE, "-o", str(path))
    assert code == 0, err
    data = json.loads(path.read_text())
    assert data["gradscope"] == 4 and data["kind"] == "graph"
    assert any("compiled" in n for n in data["nodes"])
    assert any(e.get("kind") == "saved" for e in data["edges"])
