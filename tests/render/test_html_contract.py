"""One data contract for the page (issue 19, item 3): the rows' fields, the node info's keys and
the kinds are named in Python (``views.page_data``: ``FIELDS``, ``INFO``, ``CONTAINER_KINDS``;
``model.nodes.KINDS``, ``model.schema_write.EDGE_KINDS``) and sent with the data; ``viewer.js``
reads them by name and spells no key of its own. Checked from the script's source, and in
Chromium: a field added to the schema's table of optional node keys reaches the page's details
panel with no change to the page's code."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from viewer_page import Page, embedded_data, launch_browser

import gradscope as gs
from gradscope.graph import schema_write
from gradscope.graph.nodes import KINDS, Node
from gradscope.graph.schema_write import EDGE_KINDS, NODE_OPTIONAL
from gradscope.render import page_wire
from gradscope.render.html import ASSETS
from gradscope.render.page_data import (
    CONTAINER_KINDS,
    FIELDS,
    INFO,
    NOT_PER_NODE,
    PAGE_COLORS,
    graph_data,
)

VIEWER = (ASSETS / "viewer.js").read_text(encoding="utf-8")
#: viewer.js's names for the row tables: its const -> the table of FIELDS it indexes.
ROW_CONSTS = {"NF": "nodes", "EF": "edges", "CF": "containers", "SF": "saved", "TF": "tensor",
              "BF": "box", "RF": "region"}


@pytest.fixture(scope="module")
def browser():
    yield from launch_browser()


def test_the_tables_are_sent_with_the_data() -> None:
    data = graph_data(gs.Graph([Node("n0", "MulBackward0", "op")], roots=["n0"]))
    assert data["fields"] == {k: list(v) for k, v in FIELDS.items()}
    assert data["kinds"] == list(KINDS) and data["edge_kinds"] == list(EDGE_KINDS)
    assert data["container_kinds"] == CONTAINER_KINDS
    assert data["info"] == [[f.name, f.key, f.label] for f in INFO]


def test_info_keys_are_one_table_with_the_schema() -> None:
    names = [f.name for f in INFO]
    keys = [f.key for f in INFO]
    assert len(set(names)) == len(names) and len(set(keys)) == len(keys)
    # every optional key the schema writes is a field of the page, or deliberately not per node
    assert set(NODE_OPTIONAL) <= set(names) | NOT_PER_NODE
    assert NOT_PER_NODE <= set(NODE_OPTIONAL)


def test_viewer_js_spells_no_key_of_its_own() -> None:
    """No info key, container-kind letter, row position or colour name is written in the
    script: each name it reads is one the Python tables send."""
    info_names = {f.name for f in INFO}
    # the node info only through K.<name>, never info.s / info["s"]
    assert not re.findall(r"(?<![.\w])(?:info|nodeInfo\[[^\]]+\])\s*\.\s*\w+", VIEWER)
    assert not re.findall(r"""(?<![.\w])(?:info|nodeInfo\[[^\]]+\])\s*\[\s*["']""", VIEWER)
    used = set(re.findall(r"\bK\.(\w+)", VIEWER))
    assert used and used <= info_names, used - info_names
    # kinds compared by name, every name one of a table's (KINDS, CONTAINER_KINDS) or the data
    # blocks' own ("nodes", "edges")
    compared = set(re.findall(r"""kind(?:\])?\s*[!=]==\s*["'](\w*)["']""", VIEWER))
    allowed = set(KINDS) | set(CONTAINER_KINDS) | set(page_wire.KINDS)
    assert compared and compared <= allowed, compared - allowed
    assert not set(CONTAINER_KINDS.values()) & compared  # no letter r/m/f/k
    # row fields by name, each a name of its table
    for const, table in ROW_CONSTS.items():
        got = set(re.findall(rf"\b{const}\.(\w+)", VIEWER))
        assert got <= set(FIELDS[table]), (table, got - set(FIELDS[table]))
    assert set(re.findall(r"D\.edge_kinds\.indexOf\(\"(\w+)\"\)", VIEWER)) <= set(EDGE_KINDS)
    colors = set(re.findall(r"\bCOLORS\.(\w+)", VIEWER))
    assert colors <= set(PAGE_COLORS), colors - set(PAGE_COLORS)


@dataclass(slots=True)
class _Stamped(Node):
    """A node with a field the page has no code for (what a new ``Node`` field looks like)."""

    checksum: str | None = None


def test_a_new_node_field_reaches_the_panel(browser, tmp_path: Path, monkeypatch) -> None:
    """A new field in the schema's table of optional node keys is written by ``to_json`` and
    shown in the page's details panel, with no change to page_data's INFO or to viewer.js."""
    monkeypatch.setitem(schema_write.NODE_OPTIONAL, "checksum", str.upper)
    leaf = _Stamped("n1", "x", "leaf", checksum="c0ffee")
    graph = gs.Graph([_Stamped("n0", "MulBackward0", "op"), leaf], [gs.Edge("n0", "n1", 0)],
                     roots=["n0"])
    written = json.loads(graph.to_json())["nodes"]
    assert written[1]["checksum"] == "C0FFEE" and "checksum" not in written[0]
    path = graph.save(tmp_path / "new.html")
    data = embedded_data(path.read_text(encoding="utf-8"))
    assert ["checksum", "checksum", "checksum"] in data["info"]
    p = Page(browser, path)
    p.js("gradscope.select('n1')")
    details = p.js("gradscope.details()")
    assert re.search(r"checksum\s+C0FFEE", details), details
    p.js("gradscope.select('n0')")
    assert "checksum" not in p.js("gradscope.details()")  # only where it is set
    p.close()
