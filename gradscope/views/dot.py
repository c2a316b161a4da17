"""DOT text from a ``Graph``: torchviz's colours and shapes, built as a string (fast, and
byte-identical on every run because node ids are stable).

When nodes carry module paths (``gs.scopes``), each module is a nested ``subgraph cluster_*``
labelled ``name: Class`` (a list item such as ``layers.3`` is one level, as in
``gradscope._views.levels``); root-level ops and nodes with no module stay at the top level.
A graph without module paths gives exactly the DOT it gave before clusters existed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..model.formats import OutputFormat, register_format
from ..model.graph import Edge, Graph, Node, SavedTensor, format_bytes
from .style import (
    BAD_COLOR,
    BASE_COLOR,
    CLUSTER_ATTR,
    CUSTOM_COLOR,
    FOLDED_COLOR,
    FREED_COLOR,
    LEAF_COLOR,
    MODULE_COLOR,
    OUTPUT_COLOR,
    SAVED_COLOR,
    format_norm,
    norm_color,
    size_to_str,
    var_label,
)
from ..model.transforms import levels, module_class, node_paths

NODE_ATTR = (
    'style=filled shape=box align=left fontsize=10 ranksep=0.1 height=0.2 fontname=monospace'
)


def quote(s: str) -> str:
    """A DOT double-quoted string."""
    if "\\" in s or '"' in s or "\n" in s:
        s = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + s + '"'


def attr_entries(node: Node) -> dict[str, str]:
    """A built-in node's saved names and attributes as torchviz's ``show_attrs`` lists them:
    sorted by name, saved tensors shown as ``[saved tensor]`` / ``[saved tensors]``."""
    entries: dict[str, str] = {}
    for s in node.saved:
        base, _, index = s.name.partition("[")
        if s.freed:
            entries[base] = "[freed]"
        else:
            entries[base] = "[saved tensors]" if index else "[saved tensor]"
    for k, v in node.attrs.items():
        if not k.endswith(".packed"):
            entries[k] = v
    return dict(sorted(entries.items()))


def attr_table(name: str, entries: dict[str, str], max_attr_chars: int) -> str:
    """torchviz's ``get_fn_name`` layout: name, a rule, then ``key: value`` rows."""
    if not entries:
        return name
    max_attr_chars = max(max_attr_chars, 3)
    col1 = max(len(k) for k in entries)
    col2 = min(max(len(v) for v in entries.values()), max_attr_chars)
    sep = "-" * max(col1 + col2 + 2, len(name))
    fmt = "%-" + str(col1) + "s: %" + str(col2) + "s"

    def truncate(s: str) -> str:
        return s[: col2 - 3] + "..." if len(s) > col2 else s

    rows = "\n".join(fmt % (k, truncate(v)) for k, v in entries.items())
    return name + "\n" + sep + "\n" + rows


def annotate(node: Node, label: str, extra: dict[str, str]) -> str:
    """Backward annotations (``gs.record_backward``): execution order, non-finite marks."""
    if node.order is not None:
        label = f"#{node.order} {label}"
    bad = node.nonfinite
    if bad:
        first = node.first_nonfinite
        extra["fillcolor"] = BAD_COLOR if first else "lightcoral"
        label += f"\n{'first ' if first else ''}{bad} gradient"
        where = node.created_at
        if where:
            label += f"\n{where}"
    return label


def node_style(node: Node, attrs: bool, max_attr_chars: int) -> tuple[str, dict[str, str]]:
    """Label and extra DOT attributes of one node."""
    label, extra = _base_style(node, attrs, max_attr_chars)
    return annotate(node, label, extra), extra


def _base_style(node: Node, attrs: bool, max_attr_chars: int) -> tuple[str, dict[str, str]]:
    extra: dict[str, str] = {}
    if node.kind in ("leaf", "output"):
        t = node.tensor
        label = var_label(node.name, t.shape if t else None)
        if node.kind == "leaf":
            extra["fillcolor"] = LEAF_COLOR
        else:
            extra["fillcolor"] = BASE_COLOR if node.view_base else OUTPUT_COLOR
        if t is not None:
            extra["tooltip"] = f"{t.dtype} on {t.device}, storage {t.storage}"
        return label, extra
    if node.kind == "module":  # a collapsed group (Graph.collapse) or folded run (Graph.fold)
        box = node.box
        cls, count = (box.cls, box.nodes) if box is not None else ("", "?")
        nbytes = box.saved_bytes if box is not None else node.saved_bytes
        label = f"{node.name}\n{cls} · {count} nodes\nsaved {format_bytes(nbytes)}"
        extra["fillcolor"] = FOLDED_COLOR if box is not None and box.repeat else MODULE_COLOR
        extra["shape"] = "box3d"
        extra["tooltip"] = f"{node.module}: expand with --depth or --no-fold"
        return label, extra
    if node.kind == "custom":
        entries = dict(node.attrs) if attrs else {}
        label = attr_table(node.name, entries, max_attr_chars) + "\n(custom Function)"
        extra["fillcolor"] = CUSTOM_COLOR
        extra["peripheries"] = "2"
    else:
        label = attr_table(node.name, attr_entries(node) if attrs else {}, max_attr_chars)
    if node.module:
        extra["tooltip"] = node.module
    return label, extra


def saved_style(s: SavedTensor) -> tuple[str, dict[str, str]]:
    if s.freed:
        shape = f" {size_to_str(s.shape)}" if s.shape is not None else ""
        return f"{s.name}\n{shape} freed", {"fillcolor": FREED_COLOR, "style": "filled,dashed"}
    tip = f"{s.dtype} on {s.device}, {format_bytes(s.nbytes)}, storage {s.storage}"
    return var_label(s.name, s.shape), {"fillcolor": SAVED_COLOR, "tooltip": tip}


def _attr_list(label: str, extra: dict[str, str]) -> str:
    parts = ["label=" + quote(label)]
    parts.extend(f"{k}={quote(v)}" for k, v in extra.items())
    return " ".join(parts)


def _edge_attrs(e: Edge) -> str:
    parts = []
    label = []
    if e.count != 1:
        label.append(f"x{e.count}")
    if e.grad_norm is not None:
        label.append(format_norm(e.grad_norm))
        color = norm_color(e.grad_norm)
        parts.append(f"color={quote(color)} fontcolor={quote(color)}")
        if not math.isfinite(e.grad_norm):
            parts.append("penwidth=2.5")
    parts.insert(0, f"label={quote(' '.join(label))} fontsize=8")
    return " ".join(parts)


@dataclass(frozen=True)
class _Options:
    saved: bool
    attrs: bool
    max_attr_chars: int
    notes: dict[str, str] | None  # node id -> an extra label line (e.g. memory held)
    # Attribute lists of plain backward nodes, by everything they depend on: a deep model
    # repeats the same few (1,000 identical AddmmBackward0 labels), so each is built once.
    memo: dict[tuple[object, ...], str] = field(default_factory=dict, compare=False)


def _op_key(node: Node) -> tuple[object, ...] | None:
    """Cache key of an un-annotated backward node's attribute list, else None."""
    if node.kind not in ("op", "accumulate", "custom") or node.order is not None:
        return None
    attrs = node.attrs
    if node.nonfinite:
        return None
    saved = tuple((s.name, s.freed) for s in node.saved)
    return (node.name, node.kind, node.module, tuple(attrs.items()) if attrs else (), saved)


def _node_lines(node: Node, opt: _Options, indent: str) -> list[str]:
    """The node's own line, and its saved tensors' boxes (none for a module box: it stands
    for many nodes, its label already sums their saved bytes)."""
    note = opt.notes.get(node.id) if opt.notes else None
    key = None if note else _op_key(node)
    attr_list = opt.memo.get(key) if key is not None else None
    if attr_list is None:
        label, extra = node_style(node, opt.attrs, opt.max_attr_chars)
        if note:
            label += "\n" + note
        attr_list = _attr_list(label, extra)
        if key is not None:
            opt.memo[key] = attr_list
    lines = [f"{indent}{node.id} [{attr_list}]"]
    if opt.saved and node.kind != "module":
        nid = node.id
        for i, s in enumerate(node.saved):
            sid = f"{nid}_s{i}"
            if s.freed:
                slabel, sextra = saved_style(s)
                lines.append(f"{indent}{sid} [{_attr_list(slabel, sextra)}]")
            else:  # the common case, written directly: nothing in it needs escaping but the name
                tip = f"{s.dtype} on {s.device}, {format_bytes(s.nbytes)}, storage {s.storage}"
                label = quote(var_label(s.name, s.shape))
                lines.append(
                    f'{indent}{sid} [label={label} fillcolor="{SAVED_COLOR}" tooltip="{tip}"]'
                )
            lines.append(f"{indent}{nid} -> {sid} [dir=none]")
    return lines


def _cluster_keys(graph: Graph) -> dict[str, list[str]]:
    """Node id -> the module levels of the cluster it is drawn in ([] for the top level)."""
    out: dict[str, list[str]] = {}
    for nid, path in node_paths(graph).items():
        lv = levels(path) if path else []
        if lv and graph.node(nid).kind == "module":
            lv = lv[:-1]  # a box stands for its module: drawn inside the module's parent
        out[nid] = lv
    return out


def _cluster_lines(graph: Graph, keys: dict[str, list[str]], opt: _Options) -> list[str]:
    """Nodes nested in ``subgraph cluster_*`` blocks by module path, in first-seen order."""
    tree: dict[str, list[str]] = {}  # cluster path -> child cluster paths, in first-seen order
    members: dict[str, list[Node]] = {}
    knows: dict[str, Node] = {}  # cluster path -> a node inside it that knows its class
    for node in graph.nodes:
        lv = keys[node.id]
        path = ".".join(lv)
        members.setdefault(path, []).append(node)
        if node.kind == "module" or node.module_classes:
            for d in range(1, len(lv) + 1):
                knows.setdefault(".".join(lv[:d]), node)
        for d in range(len(lv), 0, -1):
            child, parent = ".".join(lv[:d]), ".".join(lv[: d - 1])
            kids = tree.setdefault(parent, [])
            if child in kids:
                break
            kids.append(child)
    out: list[str] = []
    counter = 0
    # (cluster path, depth, opening?): iterative, so deep module trees meet no recursion limit
    stack: list[tuple[str, int, bool]] = [("", 0, True)]
    while stack:
        path, depth, opening = stack.pop()
        indent = "\t" * depth
        if not opening:
            out.append(f"{indent}}}")
            continue
        group = members.get(path, [])
        if depth:
            sample = [knows[path]] if path in knows else []
            label = f"{levels(path)[-1]}: {module_class(path, sample)}".rstrip(": ")
            out.append(f"{indent}subgraph cluster_{counter} {{")
            head = f"label={quote(label)} tooltip={quote(path)}"
            out.append(f"{indent}\tgraph [{head} {CLUSTER_ATTR}]")
            counter += 1
            stack.append((path, depth, False))
        for node in group:
            out.extend(_node_lines(node, opt, indent + "\t"))
        stack.extend((child, depth + 1, True) for child in reversed(tree.get(path, [])))
    return out


def to_dot(
    graph: Graph,
    *,
    saved: bool = True,
    attrs: bool = False,
    max_attr_chars: int = 50,
    clusters: bool = True,
    notes: dict[str, str] | None = None,
) -> str:
    """Render ``graph`` as DOT text.

    Args:
        graph: the graph to draw.
        saved: draw each saved tensor as an orange box joined to its node.
        attrs: list each node's non-tensor saved attributes in its label.
        max_attr_chars: truncate attribute values to this many characters.
        clusters: when nodes carry module paths (``gs.scopes``), draw each module as a
            nested ``subgraph cluster_*`` labelled ``name: Class``.
        notes: an extra label line per node id, e.g. ``Graph.memory().node_labels()``.

    Arrows point in the forward direction (input -> op), as torchviz draws them.

    Example:
        >>> import torch, gradscope as gs
        >>> x = torch.ones(2, requires_grad=True)
        >>> to_dot(gs.trace(x * 2)).splitlines()[0]
        'digraph {'
    """
    opt = _Options(saved, attrs, max_attr_chars, notes)
    out = ["digraph {", f"\tnode [{NODE_ATTR}]", '\tgraph [rankdir=TB]']
    # A cheap test first: graphs traced without scopes have no module and skip the grouping.
    keys = _cluster_keys(graph) if clusters and any(n.module for n in graph.nodes) else {}
    if any(keys.values()):
        out.extend(_cluster_lines(graph, keys, opt))
    else:
        for node in graph.nodes:
            out.extend(_node_lines(node, opt, "\t"))
    for e in graph.edges:
        if e.kind == "view":
            out.append(f"\t{e.dst} -> {e.src} [style=dotted]")
        elif e.grad_norm is not None or e.count != 1:
            out.append(f"\t{e.dst} -> {e.src} [{_edge_attrs(e)}]")
        else:
            out.append(f"\t{e.dst} -> {e.src}")
    out.append("}")
    return "\n".join(out) + "\n"


#: The options of ``to_dot``, which every Graphviz-based format takes.
DOT_OPTIONS = frozenset({"saved", "attrs", "max_attr_chars", "clusters", "notes"})


def _render_dot(graph: Graph, **options: object) -> bytes:
    return to_dot(graph, **options).encode("utf-8")  # type: ignore[arg-type]


register_format(OutputFormat("dot", _render_dot, DOT_OPTIONS, "DOT text (no Graphviz needed)"))
