"""Nothing in a graph is code (issue 20, item 2): generated hostile strings in every text field
of the model, and every output format checked for being well-formed and inert.

The strings are built by a seeded generator from pieces that each target one output: DOT
(quotes, backslashes, ``]``, attribute syntax such as ``URL="javascript:..."`` and
``image="/etc/passwd"``, keywords), HTML (``</script>``, ``<!--``, the page template's
placeholders), the terminal (Rich markup ``[b]`` ``[/]``, ESC sequences, control characters,
bidirectional marks) and every encoder (NUL, lone surrogates), plus very long strings.
"""

from __future__ import annotations

import copy
import dataclasses
import html
import io
import json
import random
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest
import torch
from rich.cells import cell_len
from rich.console import Console
from torch import nn

import gradscope as gs
from gradscope.graph.graph import Box, Graph
from gradscope.output.style import UNSAFE_CHARS, clean_text, terminal_text
from gradscope.render import html as render_html
from gradscope.render import page_wire
from gradscope.render.html import graph_data

PIECES = [
    '"', "'", "\\", "\\\\", "]", "[", "[b]", "[/]", "[bold red]", "[link=http://x]",
    "{{DATA}}", "{{TITLE}}", "/*{{VIEWER}}*/", "<!--{{PARTS}}-->", "</script>", "</SCRIPT ",
    "<!--", "<script>alert(1)</script>", 'URL="javascript:alert(1)"',
    '" URL="javascript:alert(1)', '"] [URL="javascript:alert(1)"', 'image="/etc/passwd"',
    '" image="/etc/passwd" x="', 'shapefile="/etc/passwd"', "href=javascript:alert(1)",
    "\n", "\r", "\t", "\x00", "\x07", "\x08", "\x1b[31m", "\x1b]8;;http://x\x07", "\x1b[2J",
    "\x7f", "\x9b", "\ud800", "\udfff", "\u202e", "\u200f", "\u2066", "\u2028", "&amp;",
    "&#60;", "<b>", "<<TABLE>>", "\\N", "\\G", "\\l", "{", "}", ";", "->", "--", "node",
    "digraph", "subgraph", ":smile:", "%s", "%n", "é", "日本", "😀", "\u0301",
]


def hostile(rng: random.Random) -> str:
    """A string of 1-4 hostile pieces and some letters; now and then a very long one."""
    if rng.random() < 0.05:
        return rng.choice(PIECES) * rng.choice((500, 2000))
    parts = [rng.choice(PIECES) for _ in range(rng.randint(1, 4))]
    if rng.random() < 0.5:
        parts.insert(rng.randint(0, len(parts)), "ab")
    return "".join(parts)


def _base_graphs() -> list[Graph]:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 4), nn.Tanh()),
                        nn.Linear(4, 2))
    x = torch.randn(2, 3, requires_grad=True)
    with gs.scopes(net):
        out = net(x).pow(2).mean()
    scoped = gs.trace(out, model=net)
    with gs.record_backward(out) as rec:
        out.backward(retain_graph=True)
    return [scoped, rec.graph, scoped.collapse(1)]


BASES = _base_graphs()


def hostile_graph(rng: random.Random) -> Graph:
    """A copy of a real graph with hostile strings in every text field but the ids."""
    g = copy.deepcopy(rng.choice(BASES))
    h = lambda: hostile(rng)  # noqa: E731
    for n in g.nodes:
        n.name = h()
        if n.module is not None or rng.random() < 0.3:
            n.module = ".".join(h() for _ in range(rng.randint(1, 3)))
        n.attrs = {h(): h() for _ in range(rng.randint(0, 3))}
        n.module_classes = tuple(h() for _ in range(rng.randint(0, 4))) or None
        n.created_at = h() if rng.random() < 0.5 else None
        if rng.random() < 0.2:
            n.nonfinite = "nan"
            n.first_nonfinite = rng.random() < 0.5
        for s in n.saved:
            s.name, s.dtype, s.device, s.storage = h(), h(), h(), h()
            s.freed = rng.random() < 0.2
        if n.tensor is not None:
            t = n.tensor
            t.name, t.dtype, t.device, t.storage = h(), h(), h(), h()
        if n.box is not None:
            n.box.cls = h()
    return g


def _saved_boxes(g: Graph) -> int:
    return sum(len(n.saved) for n in g.nodes if n.kind != "module")


needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz not installed")

#: Node and edge attributes gradscope's DOT may set; nothing else (URL, href, image...).
_DOT_ATTRS = {"label", "fillcolor", "tooltip", "shape", "peripheries", "style", "color",
              "penwidth", "fontcolor", "fontsize", "dir", "align", "fontname", "ranksep",
              "height"}


def _graphviz_json(dot: str) -> dict:
    proc = subprocess.run(["dot", "-Tjson"], input=dot.encode("utf-8"), capture_output=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")[-500:]
    return json.loads(proc.stdout)


@needs_dot
def test_dot_and_svg_of_hostile_graphs_are_well_formed_and_inert():
    rng = random.Random(2020)
    for case in range(12):
        g = hostile_graph(rng)
        dot = g.to_dot(attrs=True, legend=True)
        dot.encode("utf-8")  # no lone surrogate got through
        assert "\x00" not in dot and "\x1b" not in dot
        parsed = _graphviz_json(dot)
        subgraphs = parsed.get("_subgraph_cnt", 0)
        nodes = parsed["objects"][subgraphs:]
        assert len(nodes) == len(g.nodes) + _saved_boxes(g), case
        for obj in nodes + parsed.get("edges", []):
            extra = {k for k in obj if not k.startswith("_") and k not in (
                "name", "head", "tail", "pos", "width", "height", "bb", "lp", "nodes", "edges",
                "subgraphs", "xlabel", "xlp")}
            assert extra <= _DOT_ATTRS, extra - _DOT_ATTRS
        assert len(parsed.get("edges", [])) == len(g.edges) + _saved_boxes(g)
        svg = subprocess.run(["dot", "-Tsvg"], input=dot.encode("utf-8"), capture_output=True,
                             timeout=120, check=True).stdout
        root = ET.fromstring(svg)  # well-formed XML
        tags = {el.tag.rsplit("}", 1)[-1] for el in root.iter()}
        assert not tags & {"script", "image", "foreignObject", "iframe"}, tags  # <a>: tooltips
        for el in root.iter():
            for key, value in el.attrib.items():
                assert "href" not in key, (key, value)
                assert not value.strip().lower().startswith("javascript:"), (key, value)
        drawn = [el for el in root.iter() if el.get("class") == "node"]
        assert len(drawn) == len(g.nodes) + _saved_boxes(g)


@needs_dot
def test_dot_ids_that_are_not_names_are_quoted_and_kept_apart():
    """A graph built in Python can have any id: each is still its own node, and no id is DOT
    syntax (the saved box of ``n0`` and a node called ``n0_s0`` stay two boxes)."""
    rng = random.Random(7)
    for _ in range(6):
        g = copy.deepcopy(BASES[0])
        ids = {n.id: h for n in g.nodes
               for h in [rng.choice(['a" URL="javascript:alert(1)', "node", "x;y", "\x00",
                                     "\ud800", "n0_s0", "cluster_0", "a b", "-1", "é"])
                         + str(len(n.id)) + n.id]}
        ids[g.nodes[1].id] = g.nodes[0].id + "_s0"  # the name of a saved box
        ids[g.nodes[2].id] = "a\x00"
        ids[g.nodes[3].id] = "a\\x00"  # the same once the NUL is made visible
        for n in g.nodes:
            n.id = ids[n.id]
        for e in g.edges:
            e.src, e.dst = ids[e.src], ids[e.dst]
        g.roots = [ids[r] for r in g.roots]
        parsed = _graphviz_json(g.to_dot())
        nodes = parsed["objects"][parsed.get("_subgraph_cnt", 0):]
        assert len(nodes) == len(g.nodes) + _saved_boxes(g)
        assert len(parsed.get("edges", [])) == len(g.edges) + _saved_boxes(g)
        for obj in nodes:
            assert {k for k in obj if not k.startswith("_")} <= _DOT_ATTRS | {
                "name", "pos", "width", "height"}


def test_hostile_ids_are_refused_on_load():
    g = BASES[0]
    for bad in ['a" URL="javascript:x', "n 0", "", "\ud800", "a\x00", "[b]", "x" * 201, "n0\n"]:
        d = json.loads(g.to_json())
        old = d["nodes"][1]["id"]
        d["nodes"][1]["id"] = bad
        for e in d["edges"]:
            e["src"] = bad if e["src"] == old else e["src"]
            e["dst"] = bad if e["dst"] == old else e["dst"]
        with pytest.raises(gs.SchemaError, match=r"nodes\[1\]\.id: expected an id") as err:
            Graph.from_json(json.dumps(d))
        assert "\n" not in str(err.value)
    for good in ("n0", "m12", "more", "a-b.c_d"):
        d = json.loads(g.to_json())
        d["nodes"][0]["id"] = good
        d["roots"] = [good]
        d["edges"] = [e for e in d["edges"] if g.nodes[0].id not in (e["src"], e["dst"])]
        assert Graph.from_json(json.dumps(d)).nodes[0].id == good


def _page_data(page: str) -> tuple[dict, list, list]:
    m = re.search(r'<script type="application/json" id="gs-data">(.*?)</script>', page, re.S)
    assert m is not None
    data = json.loads(m.group(1))
    blocks = [(kind, json.loads(block)) for kind, block in re.findall(
        r'<script type="application/json" class="gs-part" data-kind="(\w+)">(.*?)</script>',
        page, re.S,
    )]
    rows = page_wire.decode(blocks)
    return data, rows["nodes"], rows["edges"]


def test_html_of_hostile_graphs_carries_the_data_inert():
    rng = random.Random(11)
    template = render_html._asset("viewer.html")
    scripts = template.count("<script")
    for _ in range(10):
        g = hostile_graph(rng)
        title = hostile(rng) + "{{DATA}}{{TITLE}}/*{{VIEWER}}*/"
        page = g.to_html(title=title)
        page.encode("utf-8")
        data, nodes, edges = _page_data(page)
        want = json.loads(json.dumps(graph_data(g)))  # the same data, as JSON reads it back
        want_nodes, want_edges = want.pop("nodes"), want.pop("edges")
        data.pop("n_nodes"), data.pop("n_edges")
        assert data == want
        assert nodes == want_nodes and edges == want_edges
        # the data opened no tag: the page has the template's scripts and the data blocks
        assert page.count("<script") == scripts + len(re.findall('class="gs-part"', page))
        assert page.lower().count("</script") == page.count("<script")
        # the title is text, once in <title> and once in the header, the placeholders in it
        # left as they are (one pass over the template)
        shown = html.escape(clean_text(title))
        assert page.count(f"<title>{shown}</title>") == 1
        assert page.count(f"<h1>{shown}</h1>") == 1
        assert page.count(render_html._asset("viewer.js")) == 1  # not pulled into the title
        assert page.count('id="gs-data"') == 1


_PAIR = re.compile(r"\\ud[89ab][0-9a-f]{2}\\ud[c-f][0-9a-f]{2}")


def test_json_of_hostile_graphs_round_trips_and_saves(tmp_path):
    rng = random.Random(5)
    for i in range(20):
        g = hostile_graph(rng)
        text = g.to_json()
        text.encode("utf-8")
        back = Graph.from_json(text)
        if _PAIR.search(text):  # JSON reads a high and a low surrogate as the pair they make
            assert Graph.from_json(back.to_json()) == back
        else:
            assert back == g
        g.save(tmp_path / f"g{i}.json")
        assert Graph.from_json((tmp_path / f"g{i}.json").read_bytes()) == back
        g.save(tmp_path / f"g{i}.html")
        g.save(tmp_path / f"g{i}.dot")


def _terminal(renderable, width: int = 100_000) -> str:
    buf = io.StringIO()
    Console(file=buf, force_terminal=True, color_system=None, width=width,
            legacy_windows=False).print(renderable)
    return buf.getvalue()


def test_tree_of_hostile_graphs_shows_names_as_text():
    rng = random.Random(3)
    for _ in range(15):
        g = hostile_graph(rng)
        out = _terminal(gs.render_tree(g))
        out.encode("utf-8")
        assert not UNSAFE_CHARS.search(out.replace("\n", "")), repr(
            UNSAFE_CHARS.search(out.replace("\n", "")))
        for n in g.nodes:  # every name shown as written, markup and all (a long one cut)
            if n.kind in ("op", "custom") and n.name:
                assert terminal_text(n.name) in out, n.name
        narrow = _terminal(gs.render_tree(g), width=60)
        assert max(cell_len(line) for line in narrow.splitlines()) <= 60


def test_monitor_report_shows_hostile_parameter_names_as_text():
    names = ["[b]w", "[/]", "x\x1b[31my", "\u202eevil", "{{DATA}}", "a]b[", "s\ud800"]

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for i, name in enumerate(names):
                self.register_parameter(name, nn.Parameter(torch.full((2,), float(i + 1))))

        def forward(self, x):
            return sum(p * x for p in self.parameters()).sum()

    net = Net()
    with gs.GradMonitor(net) as mon:
        for _ in range(2):
            net.zero_grad()
            net(torch.ones(2)).backward()
    for width in (200, 80):
        out = _terminal(mon.report(), width=width)
        out.encode("utf-8")
        assert "\x1b" not in out and "\ud800" not in out and "\u202e" not in out
        flat = out.replace("\n", "").replace(" ", "").replace("│", "")
        for name in names:
            assert clean_text(name).replace(" ", "") in flat, name
        assert max(cell_len(line) for line in out.splitlines()) <= width


def test_hostile_module_boxes_and_folds_render(tmp_path):
    """Box classes and fold paths from data go through the same escaping."""
    rng = random.Random(9)
    g = copy.deepcopy(BASES[0]).collapse(1)
    for n in g.nodes:
        if n.kind == "module":
            n.name = hostile(rng)
            n.box = Box(hostile(rng), 3, 12, repeat=2, shown=hostile(rng))
    g.to_dot().encode("utf-8")
    g.to_html().encode("utf-8")
    _terminal(gs.render_tree(g)).encode("utf-8")


# ------------------------------------------------------------ terminal escapes in every table
#: Names a model can give its modules (no dot): markup that would crash (``[/]``), restyle or
#: link, and escape sequences that retitle or clear the terminal (issue 29 items 3-4, 27).
TERMINAL_NAMES = ["[/]", "[bold red]x", "[link=http://evil:8/]y", "a\x1b]0;title\x07b",
                  "c\x1b[2Jd", "e\u202ef", ":smile:"]


def _named_net() -> tuple[nn.Module, torch.Tensor]:
    net = nn.Sequential()
    for i, name in enumerate(TERMINAL_NAMES):
        net.add_module(name, nn.Linear(4, 4) if i % 2 == 0 else nn.Tanh())
    return net, torch.randn(3, 4, requires_grad=True)


def _inert(out: str, names: list[str]) -> None:
    out.encode("utf-8")
    flat = out.replace("\n", "")
    assert not UNSAFE_CHARS.search(flat), repr(UNSAFE_CHARS.search(flat))
    for name in names:  # markup shown as written, escapes as visible text
        assert clean_text(name) in flat, name


def test_every_memory_table_shows_module_names_as_text():
    """tree's memory table (Graph.memory().render()), the same of a graph read from JSON,
    gradscope memory's table and its plan: markup literal, no ESC reaches the terminal."""
    net, x = _named_net()
    with gs.scopes(net):
        y = net(x).pow(2).sum()
    g = gs.trace(y, model=net)
    back = Graph.from_json(g.to_json())
    for graph in (g, back):
        for depth in (None, 1):
            _inert(_terminal(graph.memory().render(depth=depth)), TERMINAL_NAMES[::2])
    report = gs.activation_report(net, torch.randn(3, 4), batch_scale=2)
    _inert(_terminal(report.render()), TERMINAL_NAMES)
    plan = gs.plan_checkpoints(net, torch.randn(3, 4), budget="100%", report=report)
    _terminal(plan.render()).encode("utf-8")
    forced = dataclasses.replace(plan, modules=tuple(TERMINAL_NAMES))
    _inert(_terminal(forced.render()), TERMINAL_NAMES)


def test_check_and_explain_tables_show_names_as_text():
    def wrong(x):
        return x * 2 + 0.5 * x.detach()

    wrong.__name__ = "[/]bad\x1b[2J"
    result = gs.check(wrong, torch.randn(2, 3, dtype=torch.float64, requires_grad=True),
                      double=False)
    assert not result.ok
    result.notes.append("[link=http://x]note\x1b]0;t\x07")
    _inert(_terminal(result.render()), [wrong.__name__, result.notes[-1]])

    class Hostile(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view(2, 2)

        @staticmethod
        def backward(ctx, g):
            return g.reshape(4)

    Hostile.__name__ = "[/]F\x1b[31m"
    t = Hostile.apply(torch.randn(4, requires_grad=True))
    e = gs.explain(t)
    _inert(_terminal(e.render()), [type(t.grad_fn).__name__])


def test_a_50_mb_name_is_cut_in_every_terminal_view():
    """A huge string from a file is shown cut, with its length said, not printed whole."""
    from gradscope.output.style import MAX_SHOWN

    huge = "[/]" + "x" * 5_000_000
    g = copy.deepcopy(BASES[0])
    for n in g.nodes:
        if n.kind == "op":
            n.name = huge
            n.module = huge
    for renderable in (gs.render_tree(g), g.memory().render()):
        out = _terminal(renderable, width=200)
        assert len(out) < 100 * MAX_SHOWN
        assert f"(+{len(huge) - MAX_SHOWN} characters)" in out
    text = gs.diff(BASES[0], g).to_text(labels=("a", "b"))
    assert len(text) < 200 * MAX_SHOWN and "characters)" in text
