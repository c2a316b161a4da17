"""Graphviz gave no picture of Hugging Face Whisper under ``render --loss --backward`` (found by
``benchmarks/outside_models.py``): ``dot`` stopped with ``Error: trouble in init_rank`` and the
command exited 2 with ``Graphviz failed: \\t%0 2``, the last line of the node dump Graphviz
prints after its error. The cause is Graphviz's ranker (2.43): a node in two ``rank=same``
groups inside nested clusters, with a labelled edge (the gradient norm) from a member of each
group to it. ``run_dot`` now lays such a graph out again without the rank groups (they only
place saved tensors and parameters beside their op), and a failure names Graphviz's own error
line. Checked against the real ``dot`` binary."""

from __future__ import annotations

import shutil
import subprocess
import textwrap

import pytest

import gradscope as gs
from gradscope.errors import LayoutError
from gradscope.render.dot import to_dot
from gradscope.render.graphviz import run_dot

pytestmark = pytest.mark.skipif(shutil.which("dot") is None, reason="needs the Graphviz binary")

#: What delta debugging left of the 1,000-line DOT text of the Whisper picture.
INIT_RANK = textwrap.dedent("""\
    digraph {
        subgraph cluster_1 {
            subgraph cluster_23 {
                subgraph cluster_24 {
                    n101 -> n101_s1
                    n101 -> n101_s2
                    n101 -> n101_s4
                }
                subgraph cluster_25 {
                    n103 [label="#136 AddBackward0"]
                    subgraph cluster_26 {
                        n127 -> n127_s0
                        n127 -> n127_s1
                    }
                    subgraph cluster_35 {
                        {rank=same; n181; n180; n179}
                        {rank=same; n183; n182; n179}
                    }
                }
            }
        }
        n146 -> n145 [label="1.01e-05" fontsize=8]
        n150 -> n149 [label="1.11e-06" fontsize=8]
        n152 -> n151 [label="6.75e-05" fontsize=8]
        n177 -> n176 [label="3.06e-03" fontsize=8]
        n103 -> n179 [label="1.55e-04" fontsize=8]
        n180 -> n179 [label="2.69e-04" fontsize=8]
        n182 -> n179 [label="3.29e-04" fontsize=8]
    }
    """)
NODES = ["n101", "n101_s1", "n103", "n127_s1", "n145", "n176", "n179", "n180", "n181", "n182",
         "n183"]


def plain_dot(source: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["dot", "-Tsvg"], input=source.encode(), capture_output=True,
                          timeout=60, check=False)


def test_a_graph_graphviz_cannot_rank_is_drawn_without_the_rank_groups():
    raw = plain_dot(INIT_RANK)
    if raw.returncode == 0:
        pytest.skip("this Graphviz lays the graph out as it is")
    assert b"trouble in init_rank" in raw.stderr

    svg = run_dot(INIT_RANK, "svg").decode()
    assert svg.rstrip().endswith("</svg>")
    for node in NODES:
        assert f"<title>{node}</title>" in svg, node
    for label in ("1.55e-04", "2.69e-04", "3.29e-04"):  # the gradient norms stay on the edges
        assert label.replace("-", "&#45;") in svg  # (the SVG writes a minus as &#45;)


def test_the_rank_groups_stay_when_graphviz_takes_them():
    source = "digraph {\n  a -> b [label=\"1.0\"]\n  {rank=same; b; c}\n  b -> c\n}\n"
    svg = run_dot(source, "svg").decode()
    # default ellipses: the centre's y of each node, after its <title>
    y = {n: svg.split(f"<title>{n}</title>", 1)[1].split(' cy="', 1)[1].split('"', 1)[0]
         for n in ("a", "b", "c")}
    assert y["b"] == y["c"] != y["a"]  # b and c on one rank: the group was kept


def test_a_graphviz_failure_names_its_error_line():
    with pytest.raises(LayoutError) as info:
        run_dot("digraph { a -> ; }", "svg")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("Graphviz failed: Error:"), message
    assert "syntax error" in message
    assert "-o graph.dot" in message


def _backward_dot(layers: int) -> str:
    """A --backward picture of ``layers`` Linear modules: two parameter chains each, their edges
    labelled with gradient norms."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(3, 3) for _ in range(layers)])
    with gs.scopes(net):
        out = net(torch.randn(2, 3)).sum()
    with gs.record_backward(out, model=net) as rec:
        out.backward()
    return to_dot(rec.graph)


def test_many_parameter_chains_put_their_flat_labels_in_xlabel():
    """DenseNet-121 --backward: 364 chains, labels on their flat edges, and Graphviz's ranker
    ran past the 60 s timeout; a small picture keeps its labels as they were."""
    from gradscope.render.dot import XLABEL_CHAINS

    small, big = _backward_dot(4), _backward_dot(XLABEL_CHAINS // 2 + 1)
    assert "xlabel=" not in small and small.count(" label=") + small.count("[label=") > 8
    flat = [line for line in big.splitlines() if "xlabel=" in line]
    assert len(flat) == 2 * 2 * (XLABEL_CHAINS // 2 + 1)  # leaf->acc and acc->op per chain
    assert all("AccumulateGrad" not in line for line in flat)  # edges, not nodes
