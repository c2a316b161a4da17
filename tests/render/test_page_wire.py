"""The page's rows travel as columns with each distinct name and node info once
(``views.page_wire``, issue 33 item 4): what the page reads back is ``graph_data``'s rows, the
tables are as small as the graph's variety, and the browser draws a graph whose ids are not
``gs.trace``'s with its own ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from viewer_page import Page, chain, embedded_data, launch_browser

import gradscope as gs
from gradscope.render import page_wire
from gradscope.render.html import graph_data


@pytest.fixture(scope="module")
def browser():
    yield from launch_browser()


def _mlp_graph() -> gs.Graph:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with gs.scopes(model):
        loss = model(torch.randn(5, 3)).square().mean()
    return gs.trace(loss, params=dict(model.named_parameters()))


def _renamed(graph: gs.Graph) -> gs.Graph:
    """``graph`` with ids of its own (not "n" and an index), edges with norms and counts."""
    d = json.loads(graph.to_json())
    new = {n["id"]: f"node-{len(d['nodes']) - k}.x" for k, n in enumerate(d["nodes"])}
    for n in d["nodes"]:
        n["id"] = new[n["id"]]
    for k, e in enumerate(d["edges"]):
        e["src"], e["dst"] = new[e["src"]], new[e["dst"]]
        e["grad_norm"] = 0.5 * k
    d["roots"] = [new[r] for r in d["roots"]]
    return gs.Graph.from_json(json.dumps(d))


@pytest.mark.parametrize("make", [_mlp_graph, lambda: _renamed(_mlp_graph()),
                                  lambda: chain(12_000)], ids=["mlp", "own-ids", "chain"])
def test_the_page_carries_graph_datas_rows(make, tmp_path: Path) -> None:
    graph = make()
    page = graph.save(tmp_path / "g.html").read_text(encoding="utf-8")
    want = json.loads(json.dumps(graph_data(graph)))  # as JSON reads it back
    got = embedded_data(page)
    assert got["nodes"] == want["nodes"] and got["edges"] == want["edges"]


def test_a_chain_is_a_few_names_and_infos() -> None:
    graph = chain(12_000)
    data = graph_data(graph)
    blocks = page_wire.encode(data["nodes"], data["edges"])
    kinds = [k for k, _ in blocks]
    assert kinds == sorted(kinds, key=page_wire.KINDS.index)  # tables before the rows
    names = [v for k, b in blocks if k == "names" for v in b]
    infos = [v for k, b in blocks if k == "infos" for v in b]
    # output, MulBackward0, AccumulateGrad, x; the output's, the ops' and the leaf's info
    assert sorted(names) == sorted({n.name for n in graph.nodes}) and len(names) == 4
    assert len(infos) <= 4
    nodes = [b for k, b in blocks if k == "nodes"]
    assert len(nodes) == 3 and all(b[0] is None for b in nodes)  # the ids: "n" + index
    assert sum(len(b[2]) for b in nodes) == 12_000


def test_own_ids_and_norms_in_the_browser(browser, tmp_path: Path) -> None:
    graph = _renamed(_mlp_graph())
    p = Page(browser, graph.save(tmp_path / "own.html", full=True))
    assert p.js("gradscope.visible()") >= len(graph.nodes)
    leaf = next(n for n in graph.nodes if n.kind == "leaf" and n.name == "0.weight")
    p.js("(id) => gradscope.select(id)", leaf.id)
    assert p.js("gradscope.selected()") == leaf.id and "0.weight" in p.js("gradscope.details()")
    assert p.js(f"gradscope.boxAt('{leaf.id}')") is not None
    p.close()
