"""The plain-data model: JSON schema, round trips, equality, summaries."""

from __future__ import annotations

import json

import pytest
from graphs import ALL

import gradscope as gs
from gradscope.graph.graph import format_bytes


@pytest.mark.parametrize("name", sorted(ALL))
def test_json_round_trip_is_exact(name):
    g = gs.trace(*ALL[name]())
    text = g.to_json()
    back = gs.Graph.from_json(text)
    assert back == g
    assert back.to_json() == text


def test_round_trip_after_backward_and_with_annotations():
    outputs, params = ALL["mlp"]()
    outputs.backward()
    g = gs.trace(outputs, params=params)
    g.nodes[1].order = 0
    g.edges[0].grad_norm = float("nan")
    g.edges[1].grad_norm = 1.25e-3
    g.edges[2].count = 4
    text = g.to_json()
    back = gs.Graph.from_json(text)
    assert back == g  # NaN norms compare equal to NaN norms
    assert back.edges[0].grad_norm != back.edges[0].grad_norm  # nan survives as nan

    def no_constants(name):
        raise AssertionError(f"non-standard JSON constant {name}")

    json.loads(text, parse_constant=no_constants)  # strict JSON: no NaN/Infinity literals


def test_schema_matches_the_design():
    g = gs.trace(*ALL["mlp"]())
    d = json.loads(g.to_json())
    assert d["gradscope"] == 4 and d["kind"] == "graph"
    assert set(d) == {"gradscope", "kind", "roots", "nodes", "edges"}
    node = next(n for n in d["nodes"] if n["saved"])
    assert set(node) == {"id", "name", "kind", "module", "attrs", "saved", "tensor"}
    assert set(node["saved"][0]) == {
        "name",
        "shape",
        "dtype",
        "device",
        "nbytes",
        "storage",
        "freed",
    }
    assert set(d["edges"][0]) == {"src", "dst", "input_nr"}
    assert all(isinstance(v, str) for n in d["nodes"] for v in n["attrs"].values())


def test_model_holds_no_torch_objects():
    g = gs.trace(*ALL["custom_saved_none"]())
    allowed = (str, int, float, bool, type(None), list, dict)

    def check(obj):
        if isinstance(obj, (list, tuple)):
            for v in obj:
                check(v)
        elif isinstance(obj, dict):
            for v in obj.values():
                check(v)
        else:
            assert isinstance(obj, allowed), type(obj)

    check(g.to_dict())
    for n in g.nodes:
        for v in vars(n.tensor).values() if hasattr(n.tensor, "__dict__") else []:
            check(v)
        assert "torch" not in type(n).__module__


def test_equality_by_value():
    a = gs.trace(*ALL["lstm_cell"]())
    b = gs.trace(*ALL["lstm_cell"]())
    assert a == b
    b.nodes[3].attrs["x"] = "1"
    assert a != b


def test_from_json_rejects_other_documents():
    with pytest.raises(gs.GradscopeError, match="not a gradscope graph"):
        gs.Graph.from_json('{"nodes": []}')
    with pytest.raises(gs.GradscopeError, match="not valid JSON"):
        gs.Graph.from_json("{")
    with pytest.raises(gs.GradscopeError, match="missing key"):
        gs.Graph.from_json('{"gradscope": 1, "roots": []}')


def test_summary_and_bytes():
    g = gs.trace(*ALL["mlp"]())
    s = g.summary()
    assert s.startswith(f"{len(g.nodes)} nodes (")
    assert "saved tensors" in s
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 1024**3) == "3.0 GiB"
