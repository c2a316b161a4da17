"""The JSON schema: version 2 round trips, version-1 files written by the previous code, and
validation of hostile documents (each refused with a SchemaError naming the JSON path)."""

from __future__ import annotations

import copy
import io
import json
import random
from pathlib import Path

import pytest
from graphs import ALL

import gradscope as gs
from gradscope.graph.schema_write import MAX_DEPTH, SCHEMA_VERSION

V1 = Path(__file__).resolve().parent.parent / "golden" / "v1"
#: what version 1 kept in attrs, now typed fields
V1_KEYS = {"nonfinite", "first_nonfinite", "created_at", "view_base", "module_classes",
           "class", "nodes", "saved_bytes", "repeat"}


def v1(name: str) -> gs.Graph:
    return gs.Graph.from_json((V1 / name).read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------- version 1
@pytest.mark.parametrize("name", sorted(p.name for p in V1.glob("*.json")))
def test_version_1_files_load_and_move_annotations_to_typed_fields(name):
    g = v1(name)
    assert g.nodes
    for n in g.nodes:
        assert not (set(n.attrs) & V1_KEYS), (n.id, n.attrs)
        assert (n.box is not None) == (n.kind == "module")
    again = gs.Graph.from_json(g.to_json())  # now written as version 2
    assert again == g
    assert json.loads(g.to_json())["gradscope"] == SCHEMA_VERSION


def test_version_1_backward_annotations():
    g = v1("nan_backward.json")
    first = [n for n in g.nodes if n.first_nonfinite]
    assert [n.name for n in first] == ["SqrtBackward0"]
    assert first[0].nonfinite == "nan"
    assert "nan_backward.py:" in (first[0].created_at or "")
    assert any(n.order is not None for n in g.nodes)
    assert any(e.grad_norm is not None for e in g.edges)


def test_version_1_boxes_and_class_chains():
    folded = v1("folded.json")
    box = next(n for n in folded.nodes if n.kind == "module")
    assert box.box is not None and box.box.repeat == 5 and box.box.cls == "Block"
    assert box.box.nodes > 5 and box.name.endswith("x5")
    collapsed = v1("transformer_depth2.json")
    boxes = [n for n in collapsed.nodes if n.kind == "module"]
    assert boxes and all(b.box and b.box.cls == "TransformerEncoderLayer" for b in boxes)
    chains = [n.module_classes for n in collapsed.nodes if n.module_classes]
    # version 1 chains had no class for the model itself: it reads as unknown
    assert chains and all(c[0] == "" for c in chains)
    assert v1("view_base.json").nodes[-1].view_base or any(
        n.view_base for n in v1("view_base.json").nodes
    )


# ---------------------------------------------------------------------------- version 2
@pytest.mark.parametrize("name", sorted(ALL))
def test_round_trip(name):
    g = gs.trace(*ALL[name]())
    assert gs.Graph.from_json(g.to_json()) == g


def test_round_trip_of_every_typed_field():
    g = gs.Graph(
        nodes=[
            gs.Node("n0", "output", "output", tensor=gs.TensorInfo("out", [2], "float32", "cpu"),
                    view_base=True),
            gs.Node("n1", "LogBackward0", "op", module="enc", attrs={"self": "x"}, order=3,
                    module_classes=("Net", "Enc"), created_at="m.py:3: y = x.log()",
                    nonfinite="nan", first_nonfinite=True),
            gs.Node("m0", "enc x4", "module", module="enc",
                    box=gs.Box("Enc", 12, 4096, repeat=4)),
            gs.Node("m1", "head", "module", module="head",
                    box=gs.Box("Linear", 3, 640, leaf_bytes=512, output_bytes=64,
                               aliases={"s1": "leaf", "s2": "output"})),
        ],
        edges=[gs.Edge("n0", "n1", 0, grad_norm=float("inf")), gs.Edge("n1", "m0", 1, count=3),
               gs.Edge("m0", "m1", 0)],
        roots=["n0"],
    )
    back = gs.Graph.from_json(g.to_json())
    assert back == g
    assert back.nodes[2].box == gs.Box("Enc", 12, 4096, 4)
    assert back.nodes[3].box.activation_bytes == 64
    assert '"aliases": {"s1": "leaf", "s2": "output"}' in g.to_json()
    assert '"leaf_bytes"' not in g.to_json().splitlines()[4]  # optional keys: only when set


def test_bytes_and_paths_load_too(tmp_path):
    g = gs.trace(*ALL["mlp"]())
    assert gs.Graph.from_json(g.to_json().encode()) == g


# ---------------------------------------------------------------------------- validation
def _doc() -> dict:
    return json.loads(gs.trace(*ALL["mlp"]()).to_json())


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["nodes"][3]["saved"][0].update(freed="false"),
         'nodes[3].saved[0].freed: expected true or false, got "false"'),
        (lambda d: d["nodes"][1].update(id=d["nodes"][0]["id"]),
         'nodes[1].id: "n0" is used by nodes[0] too'),
        (lambda d: d["edges"][2].update(dst="n999"), 'edges[2].dst: "n999" names no node'),
        (lambda d: d["roots"].append("nope"), 'roots[1]: "nope" names no node'),
        (lambda d: d["nodes"][3]["saved"][0].update(shape=[3, "4"]),
         'nodes[3].saved[0].shape[1]: expected an integer, got "4"'),
        (lambda d: d["nodes"][3]["saved"][0].update(shape=[3, True]),
         "nodes[3].saved[0].shape[1]: expected an integer, got true"),
        (lambda d: d["nodes"][2].update(kind="weird"), 'nodes[2].kind: expected one of'),
        (
            lambda d: d["edges"][0].update(input_nr=-1),
            "edges[0].input_nr: expected an integer >= 0",
        ),
        (lambda d: d["edges"][0].update(count=0), "edges[0].count: expected an integer >= 1"),
        (lambda d: d["edges"][0].update(grad_norm="big"), 'edges[0].grad_norm: expected a number'),
        (lambda d: d["nodes"][2]["attrs"].update(alpha=1),
         'nodes[2].attrs["alpha"]: expected a string, got 1'),
        (lambda d: d.update(gradscope=99), "unsupported schema version 99"),
        (lambda d: d.update(gradscope="2"), 'unsupported schema version "2"'),
        (lambda d: d.pop("edges"), 'missing key "edges"'),
        (lambda d: d.update(nodes={}), "nodes: expected a list, got dict"),
        (lambda d: d["nodes"].__setitem__(0, []), "nodes[0]: expected an object, got list"),
        (lambda d: d["nodes"][0].update(first_nonfinite="true"),
         'nodes[0].first_nonfinite: expected true or false, got "true"'),
        (lambda d: d["nodes"][0].update(box={"cls": "X", "nodes": "3", "saved_bytes": 0}),
         'nodes[0].box.nodes: expected an integer, got "3"'),
        (lambda d: d["nodes"][0].update(box={"cls": "X", "nodes": 3, "saved_bytes": 8,
                                             "leaf_bytes": -1}),
         "nodes[0].box.leaf_bytes: expected an integer >= 0, got -1"),
        (lambda d: d["nodes"][0].update(box={"cls": "X", "nodes": 3, "saved_bytes": 8,
                                             "leaf_bytes": 8, "output_bytes": 4}),
         "nodes[0].box: leaf_bytes + output_bytes (12) exceed saved_bytes (8)"),
        (lambda d: d["nodes"][0].update(box={"cls": "X", "nodes": 3, "saved_bytes": 8,
                                             "aliases": {"s0": "param"}}),
         'nodes[0].box.aliases["s0"]: expected "leaf" or "output", got "param"'),
        (lambda d: d["nodes"][0].update(box={"cls": "X", "nodes": 3, "saved_bytes": 8,
                                             "aliases": ["s0"]}),
         "nodes[0].box.aliases: expected an object, got list"),
    ],
)
def test_invalid_documents_name_the_json_path(mutate, message):
    d = _doc()
    mutate(d)
    with pytest.raises(gs.SchemaError) as info:
        gs.Graph.from_json(json.dumps(d))
    assert message in str(info.value)
    assert isinstance(info.value, gs.GradscopeError)


@pytest.mark.parametrize(
    "text",
    ["", "{", "[1, 2]", "null", '"x"', "1e999999", "[" * 100_000 + "]" * 100_000,
     '{"gradscope": 2, "roots": [], "nodes": [], "edges": [' + "[" * 5000 + "]" * 5000 + "]}",
     b"\xff\xfe", '{"gradscope": 1, "roots": []}'],
)
def test_non_documents_are_refused_cleanly(text):
    with pytest.raises(gs.SchemaError):
        gs.Graph.from_json(text)


def test_nesting_bound():
    """Nesting is bounded by the JSON parser's own recursion guard (no scan of the text first):
    a document nested far deeper than a graph ever is gets one SchemaError, and nesting in a
    key the reader does not know is ignored like the key."""
    for deep in ("[" * 100_000 + "]" * 100_000,
                 '{"gradscope": 3, "roots": [], "nodes": [], "edges": [], "x": '
                 + "[" * 50_000 + "]" * 50_000 + "}"):
        with pytest.raises(gs.SchemaError, match="nests too deeply"):
            gs.Graph.from_json(deep)
    shallow = '{"gradscope": 3, "roots": [], "nodes": [], "edges": [], "x": ' + "[" * (
        MAX_DEPTH + 5) + "]" * (MAX_DEPTH + 5) + "}"
    assert gs.Graph.from_json(shallow) == gs.Graph()


_HOSTILE = [None, True, False, 0, -1, 2**70, 1.5, float("nan"), "", "n0", "false", [], {},
            [1, "a"], {"a": 1}, [[[]]]]


def _paths(obj, at=()):
    """Every (container, key) pair in a JSON document."""
    out = []
    items = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    )
    for k, v in items:
        out.append((obj, k))
        out.extend(_paths(v))
    return out


def test_fuzz_hostile_documents_only_raise_schema_errors():
    """Thousands of single and double mutations of valid documents (values replaced by hostile
    ones, keys dropped): each either loads as a valid graph or raises SchemaError, never
    anything else; what loads round-trips and can be rendered."""
    rng = random.Random(1234)
    bases = [json.loads(gs.trace(*ALL[name]()).to_json()) for name in sorted(ALL)]
    loaded = refused = 0
    for _ in range(3000):
        d = copy.deepcopy(rng.choice(bases))
        for _ in range(rng.choice((1, 1, 2))):
            container, key = rng.choice(_paths(d))
            if isinstance(container, dict) and rng.random() < 0.25:
                del container[key]
            else:
                container[key] = copy.deepcopy(rng.choice(_HOSTILE))
        try:
            text = json.dumps(d)
        except ValueError:
            continue
        try:
            g = gs.Graph.from_json(text)
        except gs.SchemaError:
            refused += 1
            continue
        loaded += 1
        assert gs.Graph.from_json(g.to_json()) == g
        g.to_dot()
        g.summary()
    assert refused > 1000 and loaded > 100


def test_fast_reader_agrees_with_the_careful_one():
    """``from_json`` checks the common records inline and hands anything else to the careful
    reader: on thousands of mutated records, the inline check accepts exactly what the careful
    reader accepts, and builds the same record (else the careful reader's error is what the
    user sees)."""
    from gradscope.errors import SchemaError
    from gradscope.graph.schema import _fast_edge, _fast_node, _Reader

    rng = random.Random(20)
    docs = [json.loads(gs.trace(*ALL[name]()).to_json()) for name in sorted(ALL)]
    node_recs = [n for d in docs for n in d["nodes"]]
    edge_recs = [e for d in docs for e in d["edges"]]
    ids = {n["id"]: i for i, n in enumerate(node_recs)}
    reader = _Reader(3)
    fast_taken = 0
    for _ in range(4000):
        is_node = rng.random() < 0.6
        rec = copy.deepcopy(rng.choice(node_recs if is_node else edge_recs))
        for _ in range(rng.choice((0, 1, 1, 2))):
            container, key = rng.choice(_paths(rec) or [(rec, "id")])
            if isinstance(container, dict) and rng.random() < 0.25:
                container.pop(key, None)
            else:
                container[key] = copy.deepcopy(rng.choice(_HOSTILE + ["n0.x", "a b", "\x1b"]))
        try:
            want = reader.node(rec, "x") if is_node else reader.edge(rec, "x", ids)
        except SchemaError:
            want = None
        got = _fast_node(rec) if is_node else _fast_edge(rec, ids)
        if got is not None:
            fast_taken += 1
            assert got == want, rec
    assert fast_taken > 500


# ------------------------------------------------------------ bounds (issue 29 items 20, 24)
def _doc() -> dict:
    name = next(n for n in sorted(ALL) if any(x.saved for x in gs.trace(*ALL[n]()).nodes))
    return json.loads(gs.trace(*ALL[name]()).to_json())


@pytest.mark.parametrize("where", ["nbytes", "storage_nbytes", "shape", "box", "input_nr"])
def test_integers_past_a_64_bit_count_are_refused_on_load(where):
    """``nbytes: 10**400`` used to load, then every view raised OverflowError."""
    big = 10**400
    doc = _doc()
    if where in ("nbytes", "storage_nbytes", "shape"):
        node = next(n for n in doc["nodes"] if n.get("saved"))
        saved = node["saved"][0]
        if where == "shape":
            saved["shape"] = [big]
        else:
            saved[where] = big
    elif where == "box":
        doc["nodes"][0]["kind"] = "module"
        doc["nodes"][0]["box"] = {"cls": "X", "nodes": 3, "saved_bytes": big}
    else:
        doc["edges"][0]["input_nr"] = big
    with pytest.raises(gs.SchemaError, match="2\\*\\*63 - 1|9223372036854775807"):
        gs.Graph.from_json(json.dumps(doc))
    doc_ok = _doc()
    doc_ok["nodes"][0]["saved"] = [dict(next(n for n in doc_ok["nodes"] if n.get("saved"))
                                        ["saved"][0], nbytes=2**63 - 1)]
    g = gs.Graph.from_json(json.dumps(doc_ok))
    assert gs.Graph.from_json(g.to_json()) == g
    from rich.console import Console  # the largest figure still renders

    buf = io.StringIO()
    Console(file=buf, width=120).print(g.memory().render())
    assert "8388608.0 TiB" in buf.getvalue()


@pytest.mark.parametrize("figure,value", [("nodes", "-3"), ("saved_bytes", "-1"),
                                          ("repeat", "0"), ("nodes", " 5"), ("nodes", "1_0"),
                                          ("saved_bytes", "9" * 400)])
def test_version_1_box_figures_that_would_not_round_trip_are_refused(figure, value):
    doc = json.loads((V1 / "folded.json").read_text(encoding="utf-8"))
    box = next(n for n in doc["nodes"] if n["kind"] == "module")
    box["attrs"][figure] = value
    with pytest.raises(gs.SchemaError, match=f'attrs\\["{figure}"\\]'):
        gs.Graph.from_json(json.dumps(doc))


def test_version_1_boxes_that_load_round_trip():
    for name in sorted(p.name for p in V1.glob("*.json")):
        g = v1(name)
        assert gs.Graph.from_json(g.to_json()) == g, name
