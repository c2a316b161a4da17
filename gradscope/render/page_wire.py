"""How the page carries its rows (``page_data.graph_data``'s nodes and edges): in blocks of
columns, and each distinct node name and node info once.

A million rows of ``[id, name, kind, container, {info}]`` are a million arrays and a million
objects for the browser's ``JSON.parse`` (2.5 s of a 1M-node chain's load, and 100 MB of the
page's 115). Here a block of ``PART`` nodes is one list of columns in ``FIELDS["nodes"]`` order;
``name`` and ``info`` are indices into the ``names`` and ``infos`` tables (sent in blocks of
their own, before the nodes); a column whose every value is its default is ``null``, and the
``id`` column is ``null`` where each id is ``"n"`` and its row's index (what ``gs.trace``
writes). Edges alike: a block is a list of columns in ``FIELDS["edges"]`` order. The page
(``viewer.js``, ``loadParts``) reads the columns by the names ``FIELDS`` sends; ``decode`` here
turns the blocks back into ``graph_data``'s rows (for tests and for anyone reading a page).
"""

from __future__ import annotations

import json
from typing import Any

from .page_data import DEFAULTS, FIELDS

#: Rows per block: each block is parsed in a task of its own by the page.
PART = 5_000
#: The kinds of block, in the order the page holds them (tables before the rows that index them).
KINDS = ("names", "infos", "nodes", "edges")
#: A node with no info: its ``info`` index.
NO_INFO = -1


def encode(nodes: list[list[Any]], edges: list[list[Any]]) -> list[tuple[str, Any]]:
    """The blocks for ``graph_data``'s node and edge rows: (kind, JSON value) in page order.

    Example:
        >>> rows = [["n0", "MulBackward0", 0, 0], ["n1", "x", 3, 0, {"o": 1}]]
        >>> blocks = encode(rows, [[0, 1]])
        >>> blocks[:2]
        [('names', ['MulBackward0', 'x']), ('infos', [{'o': 1}])]
        >>> blocks[2]  # the columns id (each "n" + its index: null), name, kind, container, info
        ('nodes', [None, [0, 1], [0, 3], [0, 0], [-1, 0]])
        >>> decode(blocks) == {"nodes": rows, "edges": [[0, 1]]}
        True
    """
    nf = FIELDS["nodes"]
    at = {name: k for k, name in enumerate(nf)}
    i_id, i_name, i_info = at["id"], at["name"], at["info"]
    names: dict[str, int] = {}
    infos: dict[str, int] = {}
    info_values: list[Any] = []
    dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

    def info_index(row: list[Any]) -> int:
        value = row[i_info] if len(row) > i_info else None
        if value is None:
            return NO_INFO
        n = infos.setdefault(dumps(value), len(infos))
        if n == len(info_values):
            info_values.append(value)
        return n

    node_blocks = []
    for start in range(0, len(nodes), PART):
        part = nodes[start:start + PART]
        cols: list[Any] = []
        for k, name in enumerate(nf):
            if k == i_id:
                col: list[Any] | None = [r[k] for r in part]
                if all(v == f"n{q}" for q, v in enumerate(col, start)):  # type: ignore[arg-type]
                    col = None
            elif k == i_name:
                col = [names.setdefault(r[k], len(names)) for r in part]
            elif k == i_info:
                col = [info_index(r) for r in part]
                if all(v == NO_INFO for v in col):
                    col = None
            else:
                default = DEFAULTS["nodes"].get(name)
                col = [r[k] if len(r) > k else default for r in part]
            cols.append(col)
        node_blocks.append(cols)
    blocks: list[tuple[str, Any]] = []
    name_list = list(names)
    blocks += [("names", name_list[s:s + PART]) for s in range(0, len(name_list), PART)]
    blocks += [("infos", info_values[s:s + PART]) for s in range(0, len(info_values), PART)]
    blocks += [("nodes", cols) for cols in node_blocks]
    ef = FIELDS["edges"]
    for start in range(0, len(edges), PART):
        part = edges[start:start + PART]
        ecols: list[Any] = []
        for k, name in enumerate(ef):
            default = DEFAULTS["edges"].get(name)
            col = [row[k] if k < len(row) else default for row in part]
            optional = name in DEFAULTS["edges"]
            ecols.append(None if optional and all(v == default for v in col) else col)
        blocks.append(("edges", ecols))
    return blocks


def decode(blocks: list[tuple[str, Any]]) -> dict[str, list[list[Any]]]:
    """``graph_data``'s ``nodes`` and ``edges`` rows back from ``encode``'s blocks (trailing
    defaults left out, as ``graph_data`` writes them)."""
    names: list[str] = []
    infos: list[Any] = []
    out: dict[str, list[list[Any]]] = {"nodes": [], "edges": []}
    nf, ef = FIELDS["nodes"], FIELDS["edges"]
    for kind, value in blocks:
        if kind == "names":
            names += value
        elif kind == "infos":
            infos += value
        elif kind == "nodes":
            rows = out["nodes"]
            n = len(value[nf.index("kind")])
            for q in range(n):
                i = len(rows)
                row = []
                for k, name in enumerate(nf):
                    col = value[k]
                    if name == "id":
                        row.append(f"n{i}" if col is None else col[q])
                    elif name == "name":
                        row.append(names[col[q]])
                    elif name == "info":
                        row.append(None if col is None or col[q] == NO_INFO else infos[col[q]])
                    else:
                        row.append(DEFAULTS["nodes"].get(name) if col is None else col[q])
                rows.append(_trim("nodes", row))
        elif kind == "edges":
            n = len(value[ef.index("src")])
            for q in range(n):
                row = [DEFAULTS["edges"].get(name) if value[k] is None else value[k][q]
                       for k, name in enumerate(ef)]
                out["edges"].append(_trim("edges", row))
        else:
            raise ValueError(f"a page block of unknown kind {kind!r}")
    return out


def _trim(table: str, row: list[Any]) -> list[Any]:
    names, defaults = FIELDS[table], DEFAULTS[table]
    while row and names[len(row) - 1] in defaults and row[-1] == defaults[names[len(row) - 1]]:
        row.pop()
    return row
