"""``tree``, ``tree --loss``, ``tree --backward``, ``tree --loss --backward`` and ``memory`` count
the same activations for the same model file (issue 27 item 5): the file's inputs (the
batch, a dict of keyword inputs, the loss's ``example_target``), the model's parameters and its
buffers (BatchNorm's running statistics) are alive without the graph, so they are no
activation on any path. The ground truth is ``gs.activation_report`` (saved-tensor hooks on a
plain forward), the figure ``memory`` prints.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import SAMPLES
from gradscope_cli.main import app
from gradscope_cli.render import load_graph
from typer.testing import CliRunner

import gradscope as gs
from gradscope.memory.saved_records import Split

PATHS = [[], ["--loss"], ["--backward"], ["--loss", "--backward"]]
ROW = re.compile(r"^(\S+)\s+(\d[\d.]* \w?i?B)\s+[\d.]+%", re.M)


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout + result.stderr


def tree_rows(target: str, *flags: str) -> dict[str, str]:
    """The module table of ``gradscope tree``: module path -> activations as printed."""
    code, out = invoke("tree", target, *flags)
    assert code == 0, out
    return dict(ROW.findall(out))


def inclusive(split: dict[str | None, Split], path: str) -> int:
    """Activation bytes of ``path`` and the modules inside it (the report's rows are inclusive;
    the graph gives each storage to its innermost module)."""
    return sum(sp.activation for k, sp in split.items()
               if k is not None and (path == "" or k == path or k.startswith(path + ".")))


GRAPHS = ("plain", "loss", "backward")


def graph_of(mf: gs.ModelFile, name: str) -> gs.Graph:
    """The graph a path of the CLI draws (the very functions the commands call): ``tree``,
    ``tree --loss``, ``tree --backward`` (with or without ``--loss``: the loss when the file
    has one)."""
    if name == "backward":
        return mf.backward().trace.graph
    return load_graph(mf, loss=name == "loss")


CNN = str(SAMPLES / "cnn.py")


def _cnn_truth() -> tuple[gs.ActivationReport, int]:
    """``activation_report`` of the CNN sample, and what its stem BatchNorm holds: its input
    and the two per-channel statistics the forward computed (not its running statistics)."""
    module, x, _ = gs.load_model_file(CNN).build()
    report = gs.activation_report(module, x)
    expected_bn = x.new_empty(4, 8, 16, 16).nbytes + 2 * module.stem[1].num_features * 4
    assert report.row("stem.1").activation_bytes == expected_bn
    assert report.row("stem.0").activation_bytes == 0
    return report, expected_bn


@pytest.mark.parametrize("name", GRAPHS)
def test_the_cnn_sample_counts_the_same_on_every_path(name):
    """The CNN of the issue: stem.0 (the first conv) saves only the file's input and its
    weight, so it holds 0 B of activations on every path, as ``memory`` says; BatchNorm saves
    its running statistics, which are buffers: they are not counted."""
    report, expected_bn = _cnn_truth()
    split = graph_of(gs.load_model_file(CNN), name).memory().module_split()
    for row in report.rows:
        assert inclusive(split, row.path) == row.activation_bytes, row.path
    assert split["stem.0"].activation == 0
    assert split["stem.1"].activation == expected_bn


@pytest.fixture(scope="module")
def plain_rows() -> dict[str, str]:
    """``gradscope tree`` of the CNN, its module rows (the loss's row left out)."""
    return {k: v for k, v in tree_rows(CNN).items() if not k.startswith("(")}


def test_tree_prints_what_memory_prints(plain_rows):
    _, expected_bn = _cnn_truth()
    assert plain_rows["stem.0"] == "0 B"
    assert plain_rows["stem.1"] == gs.format_bytes(expected_bn)
    code, out = invoke("memory", CNN, "--top", "100")
    assert code == 0, out
    printed = dict(re.findall(r"^(\S+)\s+(\d[\d.]* \w?i?B)\s", out, re.M))
    # memory's rows are inclusive, tree's innermost: the modules with no submodule agree
    for path in ("stem.0", "stem.1", "stem.2", "layer1.bn1", "layer2.shortcut.1", "fc"):
        assert printed[path] == plain_rows[path], path


@pytest.mark.parametrize("flags", PATHS[1:], ids=" ".join)
def test_tree_prints_the_same_rows_on_every_path(plain_rows, flags):
    got = tree_rows(CNN, *flags)
    assert {k: v for k, v in got.items() if k in plain_rows} == plain_rows


DICT_INPUTS = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.BatchNorm1d(6)
            self.fc = nn.Linear(6, 3)

        def forward(self, x, scale):
            return self.fc(self.norm(x) * scale)

    def build():
        torch.manual_seed(0)
        return Net(), {"x": torch.randn(5, 6), "scale": torch.rand(5, 6)}

    example_target = torch.randint(0, 3, (5,))

    def loss_fn(out, target):
        return nn.functional.cross_entropy(out, target)
"""


def test_keyword_inputs_and_the_target_are_no_activations(tmp_path: Path):
    """Inputs given as keywords (a dict) and the loss's target are the file's tensors on
    every path, the backward's included; ``scale`` is saved by the multiplication."""
    path = tmp_path / "dict_inputs.py"
    path.write_text(textwrap.dedent(DICT_INPUTS))
    mf = gs.load_model_file(path)
    module, inputs, _ = mf.build()
    torch.manual_seed(0)
    report = gs.activation_report(module, inputs["x"], inputs["scale"])
    target = mf.get("example_target")
    for name in GRAPHS:
        graph = graph_of(mf, name)
        mem = graph.memory()
        split = mem.module_split()
        for row in report.rows:
            assert inclusive(split, row.path) == row.activation_bytes, (name, row.path)
        # the buffers, the scale, and (with the loss) the target: alive without the graph
        held = {(n.name, s.name) for n in graph.nodes for s in n.saved if s.alias == "leaf"}
        assert ("NativeBatchNormBackward0", "running_mean") in held, name
        assert ("MulBackward0", "other") in held or ("MulBackward0", "self") in held, name
        if name != "plain":
            assert ("NllLossBackward0", "target") in held, name
            # the loss's own: log_softmax's result (5 x 3) and nll_loss's total_weight ()
            assert split[None].activation == 5 * 3 * 4 + 4, name
            assert split[None].leaf == target.nbytes, name
    plain = tree_rows(str(path))
    got = tree_rows(str(path), "--loss", "--backward")
    assert {k: v for k, v in got.items() if k in plain} == plain


def test_without_the_inputs_the_backward_path_would_count_them():
    """The marks are what moves the input: the same backward graph traced without them counts
    the example input as stem.0's activation (what tree --backward printed before)."""
    mf = gs.load_model_file(CNN)
    module, x, _ = mf.build()
    with gs.scopes(module):
        loss = mf.loss(module(x))
    try:
        with gs.record_backward(loss, model=module, saved=True) as bare:
            loss.backward()
    finally:
        gs.release(loss)
    split = bare.graph.memory().module_split()
    assert split["stem.0"].activation == x.nbytes
    marked = gs.load_model_file(CNN).backward().trace.graph
    assert marked.memory().module_split()["stem.0"].activation == 0
