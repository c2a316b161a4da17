"""What the forward recorder sees, and what it does not (issue 27 item 3, and the input-NaN wart
of its closing note):

- ``ModelFile.backward`` (``render/tree --backward``) runs the entry point (``build()``, the
  model's construction) with no recorder at all: only the forward gradscope runs, and the loss,
  are recorded; a ``build()`` that returns outputs is its own forward and is recorded as one;
- a NaN already in an input is said with the first op that computes from it, not with a read
  of its shape (``x.shape`` is a ``__get__`` to a ``TorchFunctionMode``), or as held by the
  input with no op when none computes from it.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

# the CLI runner, the file writer and the NaN-poisoned torch.empty of the forward-finding tests
from test_forward_findings import FINDINGS, invoke, poisoned_empty, write
from torch import nn

import gradscope as gs

# ---------------------------------------------------------------------------- build()
PROBED = """
    import torch

    calls = []     # one entry per build() call
    stamps = []    # the metadata of a node made while building: a recorder would stamp it

    def probe():
        node = (torch.ones(2, requires_grad=True) * 2).grad_fn
        stamps.append(dict(node.metadata))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            probe()                                    # inside the constructor
            self.emb = torch.nn.Embedding(10, 8, padding_idx=0)
            self.fc = torch.nn.Linear(8, 2)
            self.register_buffer("junk", torch.full((3,), float("nan")))  # never read

        def forward(self, ids):
            return self.fc(self.emb(ids))  # line: forward

    def build():
        calls.append(1)
        torch.manual_seed(0)
        net = Net()
        probe()                                        # in build() itself
        return net, torch.tensor([[0, 3, 5], [2, 0, 9]])

    def loss_fn(out):
        return out.pow(2).mean()
"""


def test_build_runs_with_no_recorder_and_only_the_forward_is_recorded(tmp_path):
    f = write(tmp_path, "probed.py", PROBED)
    mf = gs.load_model_file(f)
    run = mf.backward()
    assert mf.get("calls") == [1]  # built once
    assert mf.get("stamps") == [{}, {}]  # nothing stamped what build() and __init__ made
    assert run.forward_nonfinite is None and run.trace.first_nonfinite is None
    lines = {n.name: n.created_at or "" for n in run.trace.graph.nodes}
    assert "# line: forward" in lines["AddmmBackward0"]  # the forward is recorded
    assert "# line: forward" in lines["EmbeddingBackward0"]
    # ground truth: a plain forward and backward of the same build gives the same gradients
    module, ids, _ = mf.build()
    mf.loss(module(ids)).backward()
    steps = {s.node_id: s for s in run.trace.steps}
    leaf_of = {e.src: e.dst for e in run.trace.graph.edges if e.kind == "grad"}
    got = {run.trace.graph.node(leaf_of[n.id]).name: steps[n.id].grad_outputs[0].norm
           for n in run.trace.graph.nodes if n.kind == "accumulate"}
    for name, p in module.named_parameters():
        assert got[name] == pytest.approx(p.grad.norm().item(), rel=1e-5), name


MLP = """
    import torch

    def build():
        net = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.ReLU(),
                                  torch.nn.Linear(32, 32), torch.nn.ReLU(),
                                  torch.nn.Linear(32, 1))
        return net, torch.randn(8, 6)

    def loss_fn(out):
        return out.pow(2).mean()
"""


def test_render_of_models_built_with_nan_poisoned_empty_finds_nothing(tmp_path):
    """The issue's 3-layer MLP built in ``build()``: every ``torch.empty`` of its constructors
    holds NaN (``reset_parameters`` then writes every element)."""
    f = write(tmp_path, "mlp.py", MLP)
    with poisoned_empty():
        assert torch.isnan(torch.empty(3)).all()
        code, out = invoke("render", f, "--loss", "--backward", "-o", str(tmp_path / "g.dot"))
    assert code == 0, out
    assert not any(s in out for s in FINDINGS), out
    assert "all gradients finite" in out


HF = """
    import torch
    import transformers

    def build():
        torch.manual_seed(0)
        cfg = transformers.BertConfig(num_hidden_layers=1, num_attention_heads=2,
                                      hidden_size=16, intermediate_size=32, vocab_size=32,
                                      max_position_embeddings=8, pad_token_id=0)
        return transformers.BertModel(cfg), {"input_ids": torch.tensor([[1, 5, 7, 2, 0, 0]])}

    def loss_fn(out):
        return out.last_hidden_state.pow(2).mean()
"""


def test_render_of_a_hugging_face_model_built_from_its_config(tmp_path):
    """BERT: ``Embedding(padding_idx=...)`` and ``torch.empty`` (poisoned) in its constructors;
    ``render --loss --backward`` (the tree is tested in test_forward_findings)."""
    pytest.importorskip("transformers")
    f = write(tmp_path, "bert.py", HF)
    with poisoned_empty():
        code, out = invoke("render", f, "--loss", "--backward", "-o", str(tmp_path / "g.dot"))
    assert code == 0, out
    assert not any(s in out for s in FINDINGS), out


OUTPUTS = """
    import torch

    calls = []
    w = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    made_at_import = (w * 3).sum()   # a graph the file made itself, returned as it is

    def build():
        calls.append(1)
        h = w * 2                    # line: mul
        return h.{op}().sum()        # line: op

    def kept():
        calls.append(1)
        return made_at_import
"""


def test_a_build_that_returns_outputs_is_recorded_as_the_forward(tmp_path):
    """Outputs from ``build()``: it is the forward, so it runs once more, recorded: its nodes
    get their lines and a NaN it makes is found (torch's own ``log`` of -4 is NaN)."""
    f = write(tmp_path, "outputs.py", OUTPUTS.format(op="exp"))
    mf = gs.load_model_file(f)
    run = mf.backward()
    assert mf.get("calls") == [1, 1]
    lines = {n.name: n.created_at or "" for n in run.trace.graph.nodes}
    assert "# line: mul" in lines["MulBackward0"] and "# line: op" in lines["ExpBackward0"]
    w = mf.get("w")
    assert torch.equal(w.grad, 2 * (2 * w.detach()).exp())  # one backward: d/dw sum(exp(2w))
    bad = write(tmp_path, "outputs_nan.py", OUTPUTS.format(op="log"))
    assert torch.isnan((torch.tensor([-2.0]) * 2).log()).all()
    found = gs.load_model_file(bad).backward().forward_nonfinite
    assert found is not None and (found.node, found.kind) == ("LogBackward0", "nan")
    assert "# line: op" in (found.where or "")
    # a graph made at import and returned as it is: the same tensor both times, intact
    code, out = invoke("tree", f + ":kept", "--backward")
    assert code == 0, out
    assert "all gradients finite" in out


# ---------------------------------------------------------------------------- input NaN
class _Shaped(nn.Module):
    """Reads its input's shape, size, dim and length before it computes from it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, d = x.shape
        assert x.size(0) == n and x.dim() == 2 and len(x) == n and x.is_floating_point()
        return self.fc(x)  # line: computes


def test_an_input_nan_is_named_by_the_first_op_that_computes_from_it():
    torch.manual_seed(0)
    model = _Shaped()
    x = torch.randn(4, 3)
    x[1, 2] = math.nan
    assert torch.isnan(x).any()  # ground truth: the batch holds the NaN
    with gs.record_forward(check_finite=True) as fw, gs.scopes(model):
        fw.name_inputs([("the input x", x)])
        model(x).sum()
    bad = fw.first_nonfinite
    assert (bad.input, bad.kind, bad.op, bad.node, bad.module) == (
        "the input x", "nan", "linear", None, "fc")
    assert "# line: computes" in (bad.where or "")
    assert re.search(r"\(first read by linear in fc, .*test_forward_build\.py:\d+\)$",
                     bad.summary()), bad.summary()


def test_a_property_that_computes_counts_and_an_input_nothing_computes_from_is_said():
    x = torch.randn(2, 3)
    x[0, 0] = math.inf
    with gs.record_forward(check_finite=True) as fw:
        fw.name_inputs([("the input x", x)])
        _ = x.shape
        x.T.sum()  # the transpose, a property: it computes from x
    assert (fw.first_nonfinite.input, fw.first_nonfinite.op) == ("the input x", "T")
    w = torch.ones(3, requires_grad=True)
    y = torch.full((2,), math.nan)
    with gs.record_forward(check_finite=True) as fw:
        fw.name_inputs([("the input y", y)])
        (w * float(y.shape[0])).sum()  # only y's shape is read
    bad = fw.first_nonfinite
    assert (bad.input, bad.kind, bad.op) == ("the input y", "nan", "")
    assert bad.summary() == ("the input y already held nan before the forward ran (no op of "
                             "the forward computed from it)")
