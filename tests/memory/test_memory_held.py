"""Storages alive without the graph (a model's parameters and buffers, the forward's inputs) are
no activations: ``gs.trace(model=..., inputs=...)`` marks them (``SavedTensor.alias``) and
``Graph.memory()`` (what ``gradscope tree`` prints) then agrees with ``gs.activation_report``
(what ``gradscope memory`` prints), module by module (issue 27)."""

from __future__ import annotations

import json
import re

import pytest
import torch
from conftest import SAMPLES, run_cli
from torch import nn

import gradscope as gs
from gradscope.errors import SchemaError
from gradscope.graph.graph import Graph
from gradscope.memory.saved_records import Split


def _bn_mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    return net, (torch.randn(5, 6),)


def _frozen() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The second Linear is frozen: its weight is saved (for the input's gradient) but is no
    leaf node of the graph."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    net[2].requires_grad_(False)
    return net, (torch.randn(3, 4),)


def _cnn() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    mf = gs.load_model_file(SAMPLES / "cnn.py")
    module, inputs, _ = mf.build()
    return module, (inputs,)


def _inclusive(split: dict[str | None, Split], path: str) -> int:
    """Activation bytes of ``path`` and the modules inside it (``activation_report`` rows are
    inclusive; the graph's ``module_split`` gives each storage to its innermost module)."""
    return sum(
        sp.activation for k, sp in split.items()
        if k is not None and (path == "" or k == path or k.startswith(path + "."))
    )


@pytest.mark.parametrize("make", [_cnn, _bn_mlp, _frozen], ids=["cnn", "batchnorm", "frozen"])
def test_graph_activations_equal_activation_report_per_module(make):
    model, inputs = make()
    report = gs.activation_report(model, *inputs)  # restores the running statistics
    with gs.scopes(model):
        out = model(*inputs)
    mem = gs.trace(out, model=model, inputs=inputs).memory()
    split = mem.module_split()
    assert mem.activation_bytes == report.total > 0
    for row in report.rows:
        assert _inclusive(split, row.path) == row.activation_bytes, row.path
    # without the marks the input, the buffers and the frozen weight count as activations
    # (what tree said before): the same storages, only their kind moves
    unmarked = gs.trace(out).memory()
    assert unmarked.activation_bytes > mem.activation_bytes
    assert mem.total == unmarked.total


def test_marked_storages_are_those_of_parameters_buffers_and_inputs():
    model, inputs = _bn_mlp()
    with gs.scopes(model):
        out = model(*inputs)
    graph = gs.trace(out, model=model, inputs=inputs)
    bn = model[1]
    assert bn.running_mean is not None and bn.running_var is not None
    for node in graph.nodes:
        for s in node.saved:
            if node.name == "NativeBatchNormBackward0" and s.name in ("running_mean",
                                                                      "running_var"):
                assert s.alias == "leaf"
            elif node.name == "AddmmBackward0" and s.name == "mat1" and node.module == "0":
                assert s.alias == "leaf"  # the forward's input
            elif s.name in ("result1", "result2", "result"):
                assert s.alias is None  # made by the forward: held only by the graph
    # only the buffers are marked when the inputs are not given
    no_inputs = gs.trace(out, model=model)
    marked = {(n.name, s.name) for n in no_inputs.nodes for s in n.saved if s.alias}
    assert ("NativeBatchNormBackward0", "running_mean") in marked
    assert ("AddmmBackward0", "mat1") not in {
        (n.name, s.name) for n in no_inputs.nodes for s in n.saved if s.alias and n.module == "0"
    }


def test_alias_survives_json_and_old_json_reads_without_it():
    model, inputs = _bn_mlp()
    with gs.scopes(model):
        graph = gs.trace(model(*inputs), model=model, inputs=inputs)
    assert Graph.from_json(graph.to_json()) == graph
    doc = json.loads(graph.to_json())
    saved = [s for n in doc["nodes"] for s in n.get("saved", [])]
    assert any(s.get("alias") == "leaf" for s in saved)
    for s in saved:
        s.pop("alias", None)  # a document written before the field existed
    old = Graph.from_json(json.dumps(doc))
    assert all(s.alias is None for n in old.nodes for s in n.saved)
    assert old.memory().total == graph.memory().total
    # the careful reader (taken for anything the fast path does not know) names a bad value
    s = saved[0]
    s["alias"] = "param"
    with pytest.raises(SchemaError, match=r"saved\[0\]\.alias: expected"):
        Graph.from_json(json.dumps(doc))


def test_collapsed_boxes_keep_the_marks():
    model, inputs = _cnn()
    with gs.scopes(model):
        graph = gs.trace(model(*inputs), model=model, inputs=inputs)
    full = graph.memory().module_split(1)
    boxes = {n.module: n.box for n in graph.collapse(1).nodes if n.box is not None}
    conv, bn = boxes["stem.0"], boxes["stem.1"]  # (a list index stays with its container)
    # the first conv saves the file's input and its weight: nothing only the graph holds
    assert conv.leaf_bytes == conv.saved_bytes == inputs[0].nbytes + model.stem[0].weight.nbytes
    assert conv.activation_bytes == full["stem.0"].activation == 0
    # BatchNorm: weight and the two running statistics are alive anyway
    assert bn.leaf_bytes == 3 * model.stem[1].running_mean.nbytes
    assert bn.activation_bytes == full["stem.1"].activation


def test_tree_cli_agrees_with_activation_report():
    proc = run_cli("tree", str(SAMPLES / "cnn.py"))
    assert proc.returncode == 0, proc.stderr
    model, inputs = _cnn()
    report = gs.activation_report(model, *inputs)
    m = re.search(r"saved tensors hold ([\d.]+ \w+) of activations", proc.stdout)
    assert m is not None, proc.stdout
    assert m.group(1) == gs.format_bytes(report.total)
    rows = dict(re.findall(r"^(stem\.0|stem\.1|layer2\.bn1)\s+([\d.]+ \w+)", proc.stdout, re.M))
    assert rows["stem.0"] == "0 B"  # the example input is the file's, not the graph's
    assert rows["stem.1"] == "32.1 KiB" and rows["layer2.bn1"] == "16.1 KiB"
    assert report.row("stem.0").activation_bytes == 0
