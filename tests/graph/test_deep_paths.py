"""Linear, bounded work on any input (issue 20, item 3), and folds of consecutive calls only
(item 6): module paths of any depth, ``from_json`` against ``json.loads``, ``auto_depth``
against counting, and reused modules whose calls are apart."""

from __future__ import annotations

import io
import random
import sys
from pathlib import Path

import pytest
import torch
from rich.console import Console
from torch import nn

import gradscope as gs
from gradscope.graph.graph import (
    Edge,
    Graph,
    Node,
    SavedTensor,
    TensorInfo,
)
from gradscope.graph.paths import ModuleTrie, levels
from gradscope.graph.transforms import auto_depth, collapsed_size, fold_runs

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from schema import big_graph, deep_graph  # noqa: E402


def _all_views(g: Graph) -> None:
    g.to_dot()
    g.to_html()
    g.fold()
    g.collapse(3)
    assert Graph.from_json(g.to_json()) == g
    Console(file=io.StringIO(), width=120).print(gs.render_tree(g))


@pytest.mark.timeout(120)
def test_a_path_100k_levels_deep_renders_every_view():
    """Four nodes, a module path 100,000 levels deep (under 1 MB of JSON): every view,
    within the test's timeout (it was quadratic: 20,000 levels took
    50 s and 5.3 GiB in to_dot, and to_html raised RecursionError at 1,000)."""
    big = deep_graph(100_000)
    # no clock here (a ratio of two timings fails on a loaded machine): the memory test below
    # is the linear one, and quadratic work at 100,000 levels (20,000 took 50 s) would run
    # far past this test's timeout
    _all_views(big)


def test_a_deep_path_takes_memory_linear_in_its_depth():
    """Peak Python allocations of every view (tracemalloc) at 2,000 and 20,000 levels: 10x
    the depth, about 10x the memory (20,000 levels took 5.3 GiB in to_dot before)."""
    import tracemalloc

    peaks = []
    for depth in (2_000, 20_000):
        g = deep_graph(depth)
        tracemalloc.start()
        try:
            _all_views(g)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
    small, big = peaks
    assert big < 20 * small, (small, big)  # quadratic would be 100x
    assert big < 300 * 2**20, big  # 20,000 levels: 5.3 GiB in to_dot before


def test_deep_dot_keeps_its_clusters_and_bounds_what_repeats():
    g = deep_graph(5_000)
    dot = g.to_dot()
    assert dot.count("subgraph cluster_") == 5_000
    cluster_lines = [line for line in dot.splitlines() if line.lstrip().startswith("graph [")]
    assert max(len(line) for line in cluster_lines) < 600  # no full path per cluster
    assert max(len(line) for line in dot.splitlines()) < 4_200  # a node's own path: capped
    assert len(dot) < 600 * 5_000  # linear: a few hundred bytes per cluster


@pytest.mark.timeout(60)
def test_levels_of_long_numeric_runs_are_linear():
    path = "a." + ".".join(["0"] * 200_000)
    assert levels(path) == [path]  # quadratic would run past the test's timeout
    assert levels("encoder.layers.3.self_attn") == ["encoder", "layers.3", "self_attn"]


def test_module_trie():
    t = ModuleTrie()
    ids = t.prefixes("enc.layers.3.attn")
    assert [t.level[i] for i in ids] == ["enc", "layers.3", "attn"]
    assert t.path(ids[-1]) == "enc.layers.3.attn" and t.find("enc.layers.3") == ids[1]
    assert t.find("enc.layers.4") is None and t.add("") == 0


def test_auto_depth_agrees_with_counting():
    """``auto_depth`` counts every depth in one pass; ``collapsed_size`` counts one depth by
    building the keys: they agree on random module trees."""
    rng = random.Random(0)
    for _ in range(30):
        nodes = [Node(f"n{i}", "op", "op", module=rng.choice(
            [None, "", *(".".join(rng.choice("ab") for _ in range(rng.randint(1, 6)))
                         for _ in range(5))])) for i in range(rng.randint(5, 60))]
        g = Graph(nodes, [], [])
        cap = rng.randint(1, len(nodes))
        want = None
        if len(nodes) > cap:
            deepest = max((len(levels(n.module)) for n in nodes if n.module is not None),
                          default=0)
            want = next((d for d in range(deepest, -1, -1) if collapsed_size(g, d) <= cap), 0)
        assert auto_depth(g, cap) == want


def test_from_json_of_a_generated_3_mb_file_round_trips(tmp_path):
    """A generated file of ~3 MB (the records ``from_json`` checks inline, no pre-scan) reads
    back equal. Its speed against ``json.loads`` is ``benchmarks/schema.py``'s (300 MB; about
    1.0-1.6x): a ratio timed here failed CI at 3.2x on a loaded machine."""
    g = big_graph(2_500)
    text = g.to_json()
    assert len(text) > 2_000_000
    assert Graph.from_json(text) == g


# ---------------------------------------------------------------------- consecutive folds
class _Block(nn.Module):
    """A ResNet basic block: ``relu`` is called before and after ``conv2``/``bn2``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Linear(4, 4), nn.LayerNorm(4)
        self.conv2, self.bn2 = nn.Linear(4, 4), nn.LayerNorm(4)
        self.relu = nn.ReLU()

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + x)


class _Stack(nn.Module):
    """T5's stack: ``dropout`` on the embeddings and again after the last layer."""

    def __init__(self) -> None:
        super().__init__()
        self.dropout = nn.Dropout(0.1)
        self.block = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))
        self.final = nn.LayerNorm(4)

    def forward(self, x):
        x = self.dropout(x)
        for layer in self.block:
            x = layer(x)
        return self.dropout(self.final(x))


class _Loop(nn.Module):
    """One layer called three times in a row (a non-module op between calls is fine)."""

    def __init__(self) -> None:
        super().__init__()
        self.f = nn.Linear(4, 4)

    def forward(self, x):
        for _ in range(3):
            x = torch.tanh(self.f(x))
        return x


def _runs(model: nn.Module) -> list[str]:
    torch.manual_seed(0)
    model.train()
    x = torch.randn(2, 4, requires_grad=True)
    with gs.scopes(model):
        out = model(x)
    return [r.name for r in fold_runs(gs.trace(out.sum(), model=model), inside="all")]


@pytest.mark.parametrize(
    ("model", "want"),
    [
        (_Block, []),  # relu, relu#1 are apart: no "relu#0-1 x2"
        (_Stack, ["block.0-2 x3"]),  # dropout, dropout#1 are apart
        (_Loop, ["f#0-2 x3"]),
        (lambda: nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)]), ["0-3 x4"]),
    ],
)
def test_folds_only_consecutive_calls(model, want):
    assert _runs(model()) == want


def test_a_fold_stops_where_another_module_comes_between():
    """Four calls of one layer with another module between the 2nd and 3rd: two runs."""

    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.f, self.g = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x):
            x = self.f(self.f(x))
            return self.f(self.f(self.g(x)))

    assert _runs(Two()) == ["f#0-1 x2", "f#2-3 x2"]


def test_saved_tensor_records_survive_a_deep_round_trip():
    g = deep_graph(2_000)
    g.nodes[1].saved.append(SavedTensor("other", [2], "float32", "cpu", 8, "s9"))
    g.nodes[0].tensor = TensorInfo("y", [2], "float32", "cpu", "s1")
    g.edges.append(Edge("n1", "n4", 1))
    assert Graph.from_json(g.to_json()) == g
