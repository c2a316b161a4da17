"""The data the HTML page embeds: a ``Graph`` as compact rows (nodes, edges, the containers of
``views.containers``) whose fields are named once, in ``FIELDS``, and sent with the data, the
page's colours and norm scale, a diff page's marks, and a numerics page's errors against a
reference run (``gs.trace_divergence``). ``views.html`` assembles the page.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..doctor.findings import DoctorReport
from ..graph.graph import (
    Graph,
    Node,
    SavedTensor,
    format_bytes,
)
from ..graph.nodes import KINDS, saved_bytes_of
from ..graph.schema_write import EDGE_KINDS, NODE_OPTIONAL, float_to_json
from ..numerics.records import DivergenceMarks
from ..output.style import (
    BAD_COLOR,
    BASE_COLOR,
    CUSTOM_COLOR,
    FOLDED_COLOR,
    FREED_COLOR,
    LEAF_COLOR,
    MODULE_COLOR,
    NONFINITE_BAND,
    NORM_BANDS,
    OUTPUT_COLOR,
    SAVED_COLOR,
)
from .containers import CHUNK, ContainerTree
from .dot_nodes import (
    BAD_OTHER_COLOR,
    OP_COLOR,
    attr_entries,
    short_location,
)

#: Items drawn in the first view when neither ``depth`` nor ``full`` is given.
BUDGET = 600
#: The longest text from the graph (a name, an attribute, a module path, a source line) the page
#: embeds; a longer one is cut, its full length said (``cut_text``). A 50 MB name drawn, wrapped
#: and searched whole took the page 40 s to open (issue 29 item 27).
PAGE_TEXT = 500


def cut_text(value: Any, limit: int = PAGE_TEXT) -> Any:
    """``value`` itself, or a string longer than ``limit`` cut to its first ``limit`` characters
    followed by its full length.

    Example:
        >>> cut_text("ab" * 6, limit=4), cut_text(7)
        ('abab… (12 chars)', 7)
    """
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}… ({len(value):,} chars)"
    return value


def _cut_all(value: Any) -> Any:
    """``cut_text`` on every string in a JSON value (the schema's fields the page has no code
    for, whatever their form)."""
    if isinstance(value, str):
        return cut_text(value)
    if isinstance(value, list):
        return [_cut_all(v) for v in value]
    if isinstance(value, dict):
        return {cut_text(k): _cut_all(v) for k, v in value.items()}
    return value

#: The page's data contract: every row of the page is a list whose positions are named here
#: (the page reads the names from ``fields`` in its data, never a position of its own), and trailing
#: fields at their default are left out. Node and edge kinds are written as indices into the
#: model's own tables (``model.nodes.KINDS``, ``model.schema_write.EDGE_KINDS``), sent with the
#: data.
#: A new field is a name here and a value where the rows are written.
FIELDS: dict[str, tuple[str, ...]] = {
    "nodes": ("id", "name", "kind", "container", "info"),
    "edges": ("src", "dst", "input_nr", "kind", "count", "grad_norm"),
    "containers": ("path", "label", "cls", "kind", "parent", "depth", "count", "saved_bytes",
                   "members", "sum_count", "sum_bytes", "range"),
    # lists inside a node's info (INFO): its saved tensors, tensor, module box, compiled region
    # (a saved tensor's storage id is the schema's, not the page's: the page shows none, and
    # one per node would make every node's info of a long chain of the same op distinct)
    "saved": ("name", "shape", "dtype", "nbytes", "freed"),
    "tensor": ("name", "shape", "dtype", "device"),
    "box": ("cls", "nodes", "saved_bytes", "repeat"),
    "region": ("ops", "note"),
    # a numerics page's error of a node against the reference (numerics.records.NodeError)
    "numerics": ("error", "amplification", "what", "count", "diverged", "line"),
}
#: Defaults of the optional (trailing) fields, left out of a row when every later one is too.
DEFAULTS: dict[str, dict[str, Any]] = {
    "nodes": {"info": None},
    "edges": {"input_nr": 0, "kind": 0, "count": 1, "grad_norm": None},
    "containers": {"members": None, "sum_count": 0, "sum_bytes": 0, "range": None},
    "saved": {}, "tensor": {}, "box": {}, "region": {},
    "numerics": {"count": 1, "diverged": 0, "line": None},
}


def _row(table: str, values: dict[str, Any]) -> list[Any]:
    """One compact row of ``table``: the values in ``FIELDS`` order, trailing defaults dropped."""
    names = FIELDS[table]
    defaults = DEFAULTS[table]
    row = [values.get(name, defaults.get(name)) for name in names]
    while row and names[len(row) - 1] in defaults and row[-1] == defaults[names[len(row) - 1]]:
        row.pop()
    return row


#: The X11 colours of the DOT views as CSS hex: the page draws with the same palette.
GRAPHVIZ_HEX = {
    "lightgrey": "#d3d3d3", "lightblue": "#add8e6", "orange": "#ffa500",
    "darkolivegreen1": "#caff70", "darkolivegreen3": "#a2cd5a", "plum1": "#ffbbff",
    "gray90": "#e5e5e5", "red": "#ff0000", "lightcoral": "#f08080", "lightyellow": "#ffffe0",
    "lightgoldenrod1": "#ffec8b",
}
PAGE_COLORS = {
    "op": OP_COLOR, "accumulate": OP_COLOR, "custom": CUSTOM_COLOR, "leaf": LEAF_COLOR,
    "output": OUTPUT_COLOR, "base": BASE_COLOR, "saved": SAVED_COLOR, "freed": FREED_COLOR,
    "bad": BAD_COLOR, "bad_other": BAD_OTHER_COLOR, "module": MODULE_COLOR,
    "folded": FOLDED_COLOR,
}


def _css(color: str) -> str:
    return color if color.startswith("#") else GRAPHVIZ_HEX[color]


def _norm_scale() -> list[list[Any]]:
    """The one gradient-norm scale (``views.style.NORM_BANDS``) as the page reads it:
    [name, upper bound or null, colour], lowest band first, then the non-finite band."""
    bands = [[b.name, None if math.isinf(b.upper) else b.upper, _css(b.color)] for b in NORM_BANDS]
    return bands + [[NONFINITE_BAND.name, None, _css(NONFINITE_BAND.color)]]


#: A numerics page's bands of relative error against the reference, each drawn in the colour
#: of the norm band at its place on the one scale (``output.style.NORM_BANDS``, lowest first:
#: blue, cyan, green, yellow, red) and the non-finite band's red for an error that is not a
#: number (only one run is non-finite there): float32's rounding, a few digits off, the
#: rounding of a half-precision dtype, a large error, a wrong result.
ERROR_BANDS: tuple[tuple[str, float], ...] = (
    ("float32 rounding", 1e-6), ("small", 1e-4), ("half-precision rounding", 1e-1),
    ("large", 1.0), ("wrong", math.inf),
)


def _error_scale() -> list[list[Any]]:
    """The error bands as the page reads them: [name, upper bound or null, colour], lowest
    first, then the non-finite band (the norm scale's colours, ``_norm_scale``)."""
    colors = [_css(b.color) for b in NORM_BANDS]
    bands = [[name, None if math.isinf(upper) else upper, colors[i]]
             for i, (name, upper) in enumerate(ERROR_BANDS)]
    return bands + [["not finite", None, _css(NONFINITE_BAND.color)]]


#: A container row's kind (``views.containers``): the root, a module, a fold of repeated layers,
#: a chunk of a long run, each written as its letter; the table is sent with the data and the
#: page reads the kinds by name.
CONTAINER_KINDS = {"root": "r", "module": "m", "fold": "f", "chunk": "k"}


@dataclass(frozen=True)
class InfoField:
    """One field of a node's info, the last field of a node's row: a dict, only the fields set.

    Attributes:
        name: what the page calls it: the schema's key (``model.schema_write.NODE_OPTIONAL``, a
            ``Node`` attribute) where ``Graph.to_json`` writes the field too.
        key: its key in the page's JSON, short: it is written once per node.
        label: the heading of a row of the details panel that shows the value as it is; ""
            where the viewer has code of its own for the field.
    """

    name: str
    key: str
    label: str = ""


#: The node info the page knows, in the order it is written. The table travels with the data
#: (``info``): the viewer reads a field by its name, never by a key of its own. A key of
#: ``model.schema_write.NODE_OPTIONAL`` not here (but in ``NOT_PER_NODE``) is written under its own
#: name, in the schema's JSON form, and shown in the panel as it is: a new ``Node`` field is a
#: change in the model, and in this table only to draw it some other way.
INFO: tuple[InfoField, ...] = (
    InfoField("saved", "s"),  # rows of FIELDS["saved"]
    InfoField("tensor", "t"),  # a row of FIELDS["tensor"]
    InfoField("attrs", "a"),  # non-tensor saved attributes, as the DOT views show them
    InfoField("box", "box"),  # a module box's row of FIELDS["box"]
    InfoField("order", "o"),
    InfoField("nonfinite", "bad"),
    InfoField("first_nonfinite", "first"),
    InfoField("forward_nonfinite", "fwd"),
    InfoField("compiled", "region"),  # a row of FIELDS["region"]
    InfoField("created_at", "at"),  # shortened: relative to the model file's folder
    InfoField("view_base", "base"),
    InfoField("module", "m"),  # the node's module path, where its container's path differs
    InfoField("shape", "sh"),  # an op's forward output shape, where the graph tells it
    InfoField("memory", "mem", "memory"),  # a --memory note
    InfoField("diff", "diff", "diff a → b"),  # added / removed / changed
    InfoField("doctor", "doc", "doctor"),  # what a doctor's finding says of this node
    InfoField("numerics", "num"),  # a row of FIELDS["numerics"]: its error vs the reference
)
#: Schema keys the page does not write per node: the module classes name the containers, and
#: a compiled region's nodes sit in its container.
NOT_PER_NODE = frozenset({"module_classes", "region"})
_KEY = {f.name: f.key for f in INFO}


def info_fields() -> list[InfoField]:
    """``INFO`` and, after it, a field for each key of ``model.schema_write.NODE_OPTIONAL`` that the
    page has no code for (its name as key and as label)."""
    known = {f.name for f in INFO} | NOT_PER_NODE
    return list(INFO) + [InfoField(k, k, k) for k in NODE_OPTIONAL if k not in known]


@dataclass
class DiffMarks:
    """What a diff page colours: node id -> ``added``/``removed``/``changed``, edge index ->
    gradient-norm ratio b/a, the diff's one-line summary, and edge index -> ``added`` or
    ``removed``."""

    marks: dict[str, str]
    ratios: dict[int, float]
    summary: str
    edges: dict[int, str] = field(default_factory=dict)


# ---------------------------------------------------------------------- nodes
def _saved(s: SavedTensor) -> list[Any]:
    return _row("saved", {"name": cut_text(s.name), "shape": s.shape, "dtype": s.dtype,
                          "nbytes": s.nbytes, "freed": 1 if s.freed else 0})


#: The forward arguments behind ``next_functions`` slots of a few common ops, from their ATen
#: signatures (``addmm(self, mat1, mat2)``...); every other op: slot 0 is ``self``/``input``.
_SLOTS = {
    "AddmmBackward0": ("self", "mat1", "mat2"),
    "MmBackward0": ("self", "mat2"),
    "BmmBackward0": ("self", "mat2"),
    "MulBackward0": ("self", "other"),
    "DivBackward0": ("self", "other"),
    "ConvolutionBackward0": ("input", "weight", "bias"),
}
_SIZES = re.compile(r"\(\s*(\d+\s*,?\s*)*\)")


def _output_shapes(graph: Graph, index: dict[str, int]) -> list[list[int | None] | None]:
    """Each node's forward output shape where the graph tells it: a tensor's own shape, an op's
    saved ``result``, or what its consumer saved of that input (the tensor, or its
    ``<name>_sym_sizes``) for the argument at the edge's slot; else None. An AccumulateGrad's is
    its parameter's."""
    shapes: list[list[int | None] | None] = [None] * len(graph.nodes)
    for i, n in enumerate(graph.nodes):
        if n.tensor is not None:
            shapes[i] = list(n.tensor.shape)
            continue
        for s in n.saved:
            if s.name == "result" and s.shape is not None:
                shapes[i] = list(s.shape)
                break
    leaf_of = {}
    for e in graph.edges:
        dst = index[e.dst]
        src = graph.nodes[index[e.src]]
        if src.kind == "accumulate" and graph.nodes[dst].kind == "leaf":
            leaf_of[index[e.src]] = dst
        if shapes[dst] is not None or src.kind != "op" or e.kind != "grad":
            continue
        slots = _SLOTS.get(src.name, ("self|input",))
        if e.input_nr >= len(slots):
            continue
        names = slots[e.input_nr].split("|")
        saved = {s.name: s.shape for s in src.saved if s.shape is not None}
        shape = next((saved[name] for name in names if name in saved), None)
        if shape is None:
            sizes = next((src.attrs[f"{name}_sym_sizes"] for name in names
                          if f"{name}_sym_sizes" in src.attrs), None)
            if sizes and _SIZES.fullmatch(sizes):
                shape = [int(v) for v in re.findall(r"\d+", sizes)]
        if shape is not None:
            shapes[dst] = list(shape)
    for acc, leaf in leaf_of.items():
        if shapes[acc] is None:
            shapes[acc] = shapes[leaf]
    return shapes


def _node_info(
    node: Node, path: str | None, cpath: str, shape: list[int | None] | None, note: str | None,
    root: str | None, plain: list[InfoField],
) -> dict[str, Any]:
    k = _KEY
    info: dict[str, Any] = {}
    if node.saved:
        info[k["saved"]] = [_saved(s) for s in node.saved]
    t = node.tensor
    if t is not None:
        info[k["tensor"]] = _row("tensor", {"name": cut_text(t.name), "shape": t.shape,
                                            "dtype": cut_text(t.dtype),
                                            "device": cut_text(t.device)})
    attrs = attr_entries(node) if node.kind in ("op", "accumulate") else {}
    if node.kind == "custom":
        attrs = dict(node.attrs)
    attrs = {a: v for a, v in attrs.items() if v not in ("[saved tensor]", "[saved tensors]")}
    if attrs:
        info[k["attrs"]] = {cut_text(a): cut_text(v) for a, v in attrs.items()}
    if node.kind == "module":
        box = node.box
        info[k["box"]] = _row("box", {"cls": cut_text(box.cls), "nodes": box.nodes,
                                      "saved_bytes": box.saved_bytes, "repeat": box.repeat or 0}
                              if box is not None else
                              {"cls": "", "nodes": 1, "saved_bytes": node.saved_bytes,
                               "repeat": 0})
    if node.order is not None:
        info[k["order"]] = node.order
    bad = node.nonfinite
    if bad:
        info[k["nonfinite"]] = bad
        if node.first_nonfinite:
            info[k["first_nonfinite"]] = 1
    if node.forward_nonfinite:
        info[k["forward_nonfinite"]] = node.forward_nonfinite
    if node.compiled is not None:
        info[k["compiled"]] = _row("region", {"ops": node.compiled.ops,
                                              "note": cut_text(node.compiled.note)})
    where = node.created_at
    if where:
        info[k["created_at"]] = cut_text(short_location(where, root))
    if node.view_base:
        info[k["view_base"]] = 1
    if path is not None and path != cpath:
        info[k["module"]] = cut_text(path)
    if shape is not None and node.kind not in ("leaf", "output"):
        info[k["shape"]] = shape
    if note:
        info[k["memory"]] = cut_text(note)
    for f in plain:  # the schema's fields the page has no code for: as the schema writes them
        value = getattr(node, f.name, None)
        if value is not None and value is not False:
            info[f.key] = _cut_all(NODE_OPTIONAL[f.name](value))
    return info


def graph_data(
    graph: Graph,
    *,
    depth: int | None = None,
    full: bool = False,
    fold: bool = True,
    saved: bool = True,
    notes: dict[str, str] | None = None,
    root: str | Path | None = None,
    budget: int = BUDGET,
    diff: DiffMarks | None = None,
    doctor: DoctorReport | None = None,
    numerics: DivergenceMarks | None = None,
) -> dict[str, Any]:
    """The JSON the page embeds (version 2: compact rows named by ``FIELDS``, node info named
    by ``INFO``, container kinds by ``CONTAINER_KINDS``, all sent with the data for
    ``viewer.js`` to read); ``diff`` colours a diff of two graphs (``views.diff``); ``doctor``
    (``gs.doctor``'s report on this graph's step) marks each finding's nodes (``Site.node``);
    ``numerics`` (``gs.trace_divergence``) gives each node its error against a reference run
    and names the first divergence."""
    marks = diff.marks if diff is not None else None
    b = ContainerTree(graph, fold)
    root_dir = None if root is None else str(root)
    shapes = _output_shapes(graph, b.index)
    index = b.index
    fields = info_fields()
    plain = fields[len(INFO):]
    said = doctor.node_notes() if doctor is not None else {}
    nodes = []
    for i, n in enumerate(graph.nodes):
        cidx = b.node_container[i]
        cpath = b.containers[cidx].path
        info = _node_info(n, b.paths[n.id], cpath, shapes[i],
                          notes.get(n.id) if notes else None, root_dir, plain)
        if marks and n.id in marks:
            info[_KEY["diff"]] = marks[n.id]
        if n.id in said:
            info[_KEY["doctor"]] = cut_text(said[n.id])
        if numerics is not None and n.id in numerics.nodes:
            ne = numerics.nodes[n.id]
            info[_KEY["numerics"]] = _row("numerics", {
                "error": float_to_json(ne.error, 4),
                "amplification": float_to_json(ne.amplification, 4),
                "what": cut_text(ne.what), "count": ne.count,
                "diverged": 1 if ne.diverged else 0, "line": cut_text(ne.line)})
        nodes.append(_row("nodes", {
            "id": n.id, "name": cut_text(n.name),
            "kind": KINDS.index(n.kind) if n.kind in KINDS else 0,
            "container": cidx, "info": info or None,
        }))
    edges = []
    for e in graph.edges:
        edges.append(_row("edges", {
            "src": index[e.src], "dst": index[e.dst], "input_nr": e.input_nr,
            "kind": EDGE_KINDS.index(e.kind) if e.kind in EDGE_KINDS else 1, "count": e.count,
            "grad_norm": None if e.grad_norm is None else float_to_json(e.grad_norm, 4),
        }))
    containers: list[list[Any]] = []
    for c in b.containers:
        values: dict[str, Any] = {
            "path": cut_text(c.path), "label": cut_text(c.label), "cls": cut_text(c.cls),
            "kind": CONTAINER_KINDS[c.kind],
            "parent": c.parent, "depth": c.depth, "count": c.count, "saved_bytes": c.saved_bytes,
            "range": b.ranges.get(len(containers)),
        }
        if c.kind == "fold":
            rest = [k for m in c.members[1:] for k in b.subtree_nodes(m)]
            values |= {"members": c.members, "sum_count": sum(graph.nodes[i].count for i in rest),
                       "sum_bytes": saved_bytes_of([graph.nodes[i] for i in rest])}
        containers.append(_row("containers", values))
    # the first NaN/Inf of the run: where the forward first made one (its gradients then
    # come from it), else the first non-finite gradient in engine order
    first = next((index[n.id] for n in graph.nodes if n.forward_nonfinite and n.id in index),
                 next((index[n.id] for n in graph.nodes if n.first_nonfinite and n.id in index),
                      -1))
    return {
        "v": 2,
        "nodes": nodes,
        "edges": edges,
        "containers": containers,
        "roots": [index[r] for r in graph.roots if r in index],
        "first": first,
        "summary": cut_text(graph.summary()),
        "total_bytes": graph.saved_bytes(),
        "total_bytes_text": format_bytes(graph.saved_bytes()),
        "options": {"depth": depth, "full": full, "saved": saved, "budget": budget,
                    "chunk": CHUNK, "memory": bool(notes),
                    "backward": any(n.order is not None for n in graph.nodes)},
        "style": {"colors": {k: _css(v) for k, v in PAGE_COLORS.items()}, "norm": _norm_scale()},
        "fields": {k: list(v) for k, v in FIELDS.items()},
        "kinds": list(KINDS),
        "edge_kinds": list(EDGE_KINDS),
        "container_kinds": CONTAINER_KINDS,
        "info": [[f.name, f.key, f.label] for f in fields],
        "doctor": None if doctor is None else _doctor_data(doctor, index),
        "numerics": None if numerics is None else _numerics_data(numerics, index),
        "diff": None if diff is None else {
            "summary": cut_text(diff.summary),
            "ratios": sorted([k, float_to_json(r, 4)] for k, r in diff.ratios.items()),
            "edges": sorted([k, m] for k, m in diff.edges.items())},
    }


# ---------------------------------------------------------------------- the doctor
def _doctor_data(report: DoctorReport, index: dict[str, int]) -> dict[str, Any]:
    """The report as the page reads it: its verdict, and per finding its title, message, fix
    and the (role, node index) of each of its nodes in this graph."""
    return {
        "verdict": cut_text(report.verdict()),
        "findings": [{"title": cut_text(f.title()), "message": cut_text(f.message),
                      "fix": cut_text(f.fix),
                      "nodes": [[role, index[nid]] for role, nid in f.nodes if nid in index]}
                     for f in report.findings],
    }


# ---------------------------------------------------------------------- numerics
def _numerics_data(marks: DivergenceMarks, index: dict[str, int]) -> dict[str, Any]:
    """A divergence as the page reads it: the verdict, the first divergence's node index (-1:
    none drawn), the threshold, how many measured ops no node draws, and the error scale."""
    first = index.get(marks.first, -1) if marks.first is not None else -1
    return {"summary": cut_text(marks.summary, 4 * PAGE_TEXT), "ok": marks.ok, "first": first,
            "threshold": float_to_json(marks.threshold, 4), "unmapped": marks.unmapped,
            "measured": marks.measured, "scale": _error_scale()}
