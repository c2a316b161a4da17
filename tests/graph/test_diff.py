"""``gs.diff``: nodes matched by module path, op name and order (never by id), checked against
what the models themselves are (their modules and parameters), and ``gradscope diff``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import run_cli
from torch import nn

import gradscope as gs
from gradscope.graph.diff import node_keys, union


def traced(model: nn.Module, x: torch.Tensor, *, scale: float = 1.0) -> gs.Graph:
    with gs.scopes(model):
        y = model(x)
    return gs.trace((y * scale).sum(), model=model)


def recorded(model: nn.Module, x: torch.Tensor, *, scale: float = 1.0) -> gs.Graph:
    with gs.scopes(model):
        y = model(x)
    loss = (y * scale).sum()
    with gs.record_backward(loss, model=model) as rec:
        loss.backward()
    return rec.graph


def mlp(*widths: int) -> nn.Sequential:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        if i:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(a, b))
    return nn.Sequential(*layers)


def test_a_graph_diffed_with_itself_is_empty() -> None:
    g = traced(mlp(3, 8, 8, 2), torch.randn(5, 3))
    d = gs.diff(g, g)
    assert d.empty and not d.added and not d.removed and not d.changed
    assert d.matched == {n.id: n.id for n in g.nodes}
    # and with a copy traced again (new objects, same ids): still empty
    assert gs.diff(g, gs.Graph.from_json(g.to_json())).empty


def test_one_extra_layer_adds_exactly_its_nodes() -> None:
    x = torch.randn(5, 3)
    small = mlp(3, 8, 8)
    big = nn.Sequential(*small, nn.ReLU(), nn.Linear(8, 8))  # the same layers, and two more
    a, b = traced(small, x), traced(big, x)
    d = gs.diff(a, b)
    # the new layers' nodes, as the model says: made in modules 3 and 4, or their parameters
    new = {name for name, _ in big.named_parameters() if name.split(".")[0] in ("3", "4")}
    expected = {n.id for n in b.nodes
                if (n.module or "").split(".")[0] in ("3", "4") or n.name in new}
    assert expected and set(d.added) == expected
    assert d.removed == [] and d.changed == []
    assert len(d.matched) == len(a.nodes)
    # ids moved (the new layers sit next to the output), the match did not use them
    assert any(ia != ib for ia, ib in d.matched.items())
    assert {b.node(i).name for i in d.added} >= {"AddmmBackward0", "ReluBackward0", "4.weight"}
    # and the other way round: the same nodes removed
    back = gs.diff(b, a)
    assert set(back.removed) == expected and back.added == [] and back.changed == []


def test_a_wider_layer_is_changed_with_the_models_shapes() -> None:
    x = torch.randn(5, 3)
    a, b = traced(mlp(3, 8, 2), x), traced(mlp(3, 16, 2), x)
    d = gs.diff(a, b)
    assert d.added == [] and d.removed == []
    by_key = {c.key: c for c in d.changed}
    w = by_key["leaf:0.weight"]
    assert w.fields["shape"] == (str(tuple(mlp(3, 8, 2)[0].weight.shape)),
                                 str(tuple(mlp(3, 16, 2)[0].weight.shape)))
    assert by_key["leaf:2.weight"].fields["shape"] == ("(2, 8)", "(2, 16)")
    assert "leaf:2.bias" not in by_key  # (2,) in both
    # the second layer's matmul saved a (5, 8) then a (5, 16) input: shapes and bytes differ
    mm = next(c for c in d.changed if c.key == "2/AddmmBackward0")
    assert "(5, 8)" in mm.fields["saved"][0] and "(5, 16)" in mm.fields["saved"][1]
    # saved: its input (5 x width) and the weight's transpose, float32
    expected = tuple(gs.format_bytes((5 * w + mlp(3, w, 2)[2].weight.numel()) * 4) for w in (8, 16))
    assert mm.fields["saved bytes"] == expected


def test_norm_ratios_follow_the_gradients() -> None:
    """b's loss is 3x a's: every gradient, hence every edge's norm, is 3x (ground truth:
    backward is linear in the output gradient)."""
    x = torch.randn(5, 3)
    ma, mb = mlp(3, 8, 2), mlp(3, 8, 2)
    a = recorded(ma, x)
    b = recorded(mb, x, scale=3.0)
    # torch's own gradients: 3x
    ratio = (mb[0].weight.grad.norm() / ma[0].weight.grad.norm()).item()
    assert math.isclose(ratio, 3.0, rel_tol=1e-5)
    acc = next(n.id for n in b.nodes if n.kind == "accumulate" and "AccumulateGrad(0.weight)"
               == node_keys(b)[n.id])
    into = [r for r in gs.diff(a, b).ratios if r.dst == acc]
    assert into and all(math.isclose(r.ratio, ratio, rel_tol=1e-4) for r in into)
    d = gs.diff(a, b)
    normed = [e for e in b.edges if e.grad_norm is not None]
    assert normed and len(d.ratios) == len(normed)
    # above the scale (the output and its sum) the gradient is the same ones; below it, 3x
    for r in d.ratios:
        want = 1.0 if b.node(r.src).name in ("output", "SumBackward0") else 3.0
        assert math.isclose(r.ratio, want, rel_tol=1e-4), (b.node(r.src).name, r)
    assert sum(r.ratio > 2 for r in d.ratios) > len(d.ratios) // 2
    assert d.empty  # the same graph, only the gradients differ
    assert "ratio" in d.summary() and "3" in d.summary()


def test_keys_are_unique_and_not_ids() -> None:
    g = traced(mlp(3, 8, 8, 8, 2), torch.randn(4, 3))
    keys = node_keys(g)
    assert len(set(keys.values())) == len(g.nodes)
    assert not any(k.startswith("n") and k[1:].isdigit() for k in keys.values())


def test_union_holds_both_graphs() -> None:
    x = torch.randn(5, 3)
    small = mlp(3, 8)
    big = nn.Sequential(*small, nn.ReLU(), nn.Linear(8, 4))
    a, b = traced(big, x), traced(small, x)  # going from big to small: layers removed
    d = gs.diff(a, b)
    nodes, edges, roots, marks = union(a, b, d)
    ids = [n.id for n in nodes]
    assert len(ids) == len(set(ids)) == len(b.nodes) + len(d.removed)
    assert all(e.src in ids and e.dst in ids for e in edges)
    assert sorted(v for v in marks.values()) == ["removed"] * len(d.removed)


# ---------------------------------------------------------------------- the command line
@pytest.fixture()
def two_files(tmp_path: Path) -> tuple[Path, Path, gs.GraphDiff]:
    x = torch.randn(5, 3)
    small = mlp(3, 8, 8)
    a, b = traced(small, x), traced(nn.Sequential(*small, nn.ReLU(), nn.Linear(8, 8)), x)
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    a.save(pa)
    b.save(pb)
    return pa, pb, gs.diff(a, b)


def test_cli_diff_prints_and_writes_the_page(two_files, tmp_path: Path) -> None:
    pa, pb, d = two_files
    out = tmp_path / "d.html"
    proc = run_cli("diff", str(pa), str(pb), "-o", str(out))
    assert proc.returncode == 1, proc.stderr  # they differ
    assert d.summary() in proc.stdout
    assert "+ 4/AddmmBackward0" in proc.stdout and "+ leaf:4.weight" in proc.stdout
    page = out.read_text(encoding="utf-8")
    m = page.split('<script type="application/json" id="gs-data">', 1)[1].split("</script>", 1)[0]
    data = json.loads(m)
    assert data["diff"]["summary"] == d.summary()
    same = run_cli("diff", str(pa), str(pa))
    assert same.returncode == 0 and "0 nodes added, 0 removed, 0 changed" in same.stdout


def test_cli_diff_unusable_input_is_one_line(two_files, tmp_path: Path) -> None:
    pa, _, _ = two_files
    bad = tmp_path / "bad.json"
    bad.write_text('{"gradscope": 3, "nodes": 5}', encoding="utf-8")
    for args in ((str(pa), str(tmp_path / "missing.json")), (str(pa), str(bad))):
        proc = run_cli("diff", *args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gradscope: error:"), proc.stderr
        assert "Traceback" not in proc.stderr


def test_cli_diff_prints_names_from_the_files_as_data(tmp_path: Path) -> None:
    """A graph file is someone else's: a module named with terminal escapes and a BiDi
    override is listed with those characters written as visible escapes, never sent raw."""
    x = torch.randn(5, 3)
    small = mlp(3, 8, 8)
    hostile = "evil\x1b]0;pwned\x07\x1b[2J\u202e"
    big = nn.Sequential(*small)
    big.add_module(hostile, nn.Linear(8, 8))
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    traced(small, x).save(pa)
    traced(big, x).save(pb)
    proc = run_cli("diff", str(pa), str(pb))
    assert proc.returncode == 1, proc.stderr
    assert "evil\\x1b]0;pwned\\x07\\x1b[2J\\u202e" in proc.stdout
    assert not any(c in proc.stdout for c in "\x1b\x07\u202e")


def test_the_summary_counts_one_node_and_one_edge_in_the_singular():
    """"1 node added", "1 edge added", "on 1 edge": no "1 nodes"."""
    from gradscope.graph.graph import Edge, Graph, Node
    a = Graph([Node("n0", "SumBackward0", "op")], [], ["n0"])
    b = Graph([Node("n0", "SumBackward0", "op"), Node("n1", "MulBackward0", "op")],
              [Edge("n0", "n1")], ["n0"])
    line = gs.diff(a, b).summary()
    assert line.startswith("1 node added, 0 removed, 0 changed; 1 edge added, 0 removed"), line



def test_the_summary_counts_nan_and_zero_ratios_instead_of_hiding_them():
    """14 of 15 edges going NaN is the news, not "furthest from 1: 1" on the one left."""
    import torch

    def run(poison: float) -> gs.Graph:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        x = torch.randn(3, 4)
        x[0, 0] = poison
        return gs.trace_backward(model(x).sum(), model=model).graph

    a, b = run(1.0), run(float("nan"))
    d = gs.diff(a, b)
    nan = [r for r in d.ratios if r.ratio != r.ratio]
    assert nan, "the poisoned input makes NaN gradients in b"
    line = d.summary()
    assert f"{len(nan)} NaN of {len(d.ratios)} edge ratios" in line, line
