"""The DOT writer's quoting fast paths (issue 33): strings quoted once per distinct value
(``_Quoted``), saved boxes' tooltips joined from pieces checked once (``_Plain``). Every box
must read exactly as ``quote`` of its whole text would write it, whatever the pieces hold."""

from __future__ import annotations

import re

from gradscope.graph.graph import (
    Edge,
    Graph,
    Node,
    SavedTensor,
)
from gradscope.graph.nodes import format_bytes
from gradscope.output.style import var_label
from gradscope.render.dot import to_dot
from gradscope.render.dot_tokens import (
    MAX_QUOTED,
    _Plain,
    _Quoted,
    quote,
)

HOSTILE = ["float32", "cpu", "s0", 'a"b', "x\\N", "\x1b[31m", "\u202e", "\ud800", "n\nl",
           "\x00", "\x85", "é", "<b>", "a" * (MAX_QUOTED - 20), "b" * (MAX_QUOTED + 5), ""]


def test_caches_agree_with_quote() -> None:
    quoted, plain = _Quoted(), _Plain()
    for s in HOSTILE + HOSTILE:  # the second pass reads the caches
        assert quoted[s] == quote(s)
        assert plain[s] == (quote(s) == '"' + s + '"')


def _graph() -> Graph:
    nodes = [Node("n0", "out", "output")]
    edges = []
    k = 1
    for dtype in HOSTILE[::3]:
        for device in HOSTILE[1::4]:
            for storage in HOSTILE[2::2]:
                nid = f"n{k}"
                k += 1
                saved = [SavedTensor(storage, [2, None], dtype, device, 5000 * k, storage),
                         SavedTensor("mat1", [4], dtype, device, 16, storage)]
                nodes.append(Node(nid, "MulBackward0", "op", saved=saved))
                edges.append(Edge("n0", nid))
    return Graph(nodes, edges, ["n0"])


def test_saved_boxes_read_as_quote_writes_them() -> None:
    g = _graph()
    lines = to_dot(g).splitlines()
    want = []
    for n in g.nodes:
        for i, s in enumerate(n.saved):
            tip = f"{s.dtype} on {s.device}, {format_bytes(s.nbytes)}, storage {s.storage}"
            want.append(f'\t{n.id}_s{i} [label={quote(var_label(s.name, s.shape))} '
                        f'fillcolor="orange" tooltip={quote(tip)}]')
    got = [ln for ln in lines if re.match(r"\tn\d+_s\d+ \[", ln)]
    assert got == want
    # and the same strings again (every cache warm) give the same text
    assert to_dot(g).splitlines() == lines


def test_long_pieces_that_are_plain_alone_are_cut_together() -> None:
    # storage and the tooltip's head are each plain, but together past MAX_QUOTED: quote cuts
    long = "s" * (MAX_QUOTED - 10)
    g = Graph([Node("n0", "MulBackward0", "op",
                    saved=[SavedTensor("self", [1], "float32", "cpu", 4, long)])], [], ["n0"])
    tip = f"float32 on cpu, 4 B, storage {long}"
    assert len(tip) > MAX_QUOTED
    assert f"tooltip={quote(tip)}]" in to_dot(g)
    assert "more characters)" in quote(tip)
