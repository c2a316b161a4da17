"""DOT text from a ``Graph``: torchviz's colours and shapes, built as a string (fast, and
byte-identical on every run because node ids are stable).

When nodes carry module paths (``gs.scopes``), each module is a nested ``subgraph cluster_*``
labelled ``name: Class`` (a list item such as ``layers.3`` is one level, as in
``gradscope.model.paths.levels``); root-level ops and nodes with no module stay at the top
level. Clustered pictures are kept compact: a node's saved tensors and a parameter's
``leaf -> AccumulateGrad`` chain sit on the rank of the op that uses them (``rank=same``), so a
module spans only its ops' ranks and consecutive modules stack instead of spreading sideways
(torchviz's layout, with clusters, was 1.4-2.5x its area). A fold that keeps its first member
(``fold(keep_first=True)``) is a cluster holding that member's clusters and one box for the
others. A graph without module paths gives exactly the DOT it gave before clusters existed.
"""

from __future__ import annotations

import math
import os
import re
import textwrap
from dataclasses import dataclass, field

from ..model.formats import FormatKind, OutputFormat, register_format
from ..model.graph import Edge, Graph, Node, SavedTensor, format_bytes
from ..model.nodes import format_split, plural
from ..model.transforms import levels, node_paths
from .style import (
    BAD_COLOR,
    BASE_COLOR,
    CLUSTER_ATTR,
    CUSTOM_COLOR,
    FOLDED_COLOR,
    FREED_COLOR,
    LEAF_COLOR,
    MODULE_COLOR,
    NORM_BANDS,
    OUTPUT_COLOR,
    SAVED_COLOR,
    clean_text,
    format_norm,
    norm_color,
    size_to_str,
    var_label,
)

BAD_OTHER_COLOR = "lightcoral"  # a later node whose gradient was also non-finite
OP_COLOR = "lightgrey"  # what Graphviz fills a style=filled node with when given no colour

NODE_ATTR = (
    'style=filled shape=box align=left fontsize=10 ranksep=0.1 height=0.2 fontname=monospace'
)


#: The longest string written in DOT, in characters: Graphviz's reader stops at 16,384 bytes, and
#: a character takes at most 4 (a backslash 2, escaped).
MAX_QUOTED = 3800
_DOT_SPECIAL = re.compile('[\\\\"\n]')


def quote(s: str) -> str:
    """A DOT double-quoted string that Graphviz reads as text only: ``\\`` and ``"`` escaped
    (so no ``\\N``-style label escape and no end of the string), a newline written as DOT's
    line break, and control characters, bidirectional marks and lone surrogates as visible
    escapes (``clean_text``): Graphviz stops at NUL, and a surrogate cannot be written as
    UTF-8."""
    s = clean_text(s, newlines=True)
    if len(s) > MAX_QUOTED:  # Graphviz refuses a string longer than 16 KiB: keep the start
        s = s[:MAX_QUOTED] + f"… ({len(s) - MAX_QUOTED} more characters)"
    if _DOT_SPECIAL.search(s):
        s = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + s + '"'


#: An id DOT reads as one token without quotes; DOT's keywords (any case) are not.
_BARE_ID = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DOT_KEYWORDS = frozenset({"node", "edge", "graph", "digraph", "subgraph", "strict"})


class _Ids:
    """The DOT id of every node and saved-tensor box: the node's own id when DOT reads it as
    one token (``n0``: what every captured graph has), else that id quoted, its unsafe
    characters made visible; one that would name an id already taken (two ids alike once
    cleaned, or a node called ``n0_s0`` beside the saved box of ``n0``) gets a ``~k`` suffix,
    so every node is its own box whatever the ids say."""

    def __init__(self, nodes: list[Node]) -> None:
        self.used: set[str] = set()
        self.tok: dict[str, str] = {}
        for n in nodes:
            if n.id not in self.tok:
                self.tok[n.id] = self.new(n.id)

    def new(self, want: str) -> str:
        text = clean_text(want)
        key, k = text, 1
        while key in self.used:
            key = f"{text}~{k}"
            k += 1
        self.used.add(key)
        return key if _BARE_ID.match(key) and key.lower() not in _DOT_KEYWORDS else quote(key)

    def of(self, nid: str) -> str:
        tok = self.tok.get(nid)
        if tok is None:  # an edge to a node the graph does not hold
            tok = self.tok[nid] = self.new(nid)
        return tok


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


_LOCATION = re.compile(r"^(?P<path>.*?):(?P<line>\d+): ?(?P<code>.*)$", re.S)


def short_location(where: str, root: str | os.PathLike[str] | None = None) -> str:
    """A forward location ``path:line: code`` with the path made short: relative to ``root``
    (the model file's folder) when it lies inside it, else its last two components.

    Example:
        >>> short_location("/home/u/proj/models/net.py:12: x = f(x)", "/home/u/proj")
        'models/net.py:12: x = f(x)'
        >>> short_location("/opt/lib/python3/site/pkg/mod.py:3: y()")
        '…/pkg/mod.py:3: y()'
    """
    m = _LOCATION.match(where)
    if not m:
        return where
    path = m["path"]
    short = None
    if root is not None:
        try:
            rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
        except ValueError:  # another drive on Windows
            rel = ".."
        if not rel.startswith(".."):
            short = rel
    if short is None:
        parts = path.replace("\\", "/").split("/")
        short = path if len(parts) <= 2 else "…/" + "/".join(parts[-2:])
    return f"{short}:{m['line']}: {m['code']}"


def wrap_location(where: str, width: int = 40) -> list[str]:
    """A location as label lines: ``path:line:`` and the code, wrapped at ``width``."""
    m = _LOCATION.match(where)
    if not m:
        return textwrap.wrap(where, width) or [where]
    code = textwrap.wrap(m["code"], width, break_long_words=True) or [""]
    return [f"{m['path']}:{m['line']}:", *code]


def annotate(
    node: Node, label: str, extra: dict[str, str], root: str | os.PathLike[str] | None = None
) -> str:
    """Backward annotations (``gs.record_backward``): execution order, non-finite marks, and for
    a non-finite node its forward line (path shortened against ``root``, code wrapped)."""
    if node.order is not None:
        label = f"#{node.order} {label}"
    if node.forward_nonfinite:  # where the forward first went non-finite
        label += f"\n{node.forward_nonfinite} first made here, in the forward"
        extra["color"] = BAD_COLOR
        extra["penwidth"] = "3"
    bad = node.nonfinite
    if bad:
        first = node.first_nonfinite
        extra["fillcolor"] = BAD_COLOR if first else BAD_OTHER_COLOR
        label += f"\n{'first ' if first else ''}{bad} gradient"
        where = node.created_at
        if where:
            label += "\n" + "\n".join(wrap_location(short_location(where, root)))
    return label


def _box_bytes(node: Node) -> str:
    """A module box's saved bytes, activations apart from parameter/input (and output)
    aliases: ``126.9 KiB activations + 4.5 KiB params/inputs``."""
    box = node.box
    if box is None:
        return format_bytes(node.saved_bytes)
    return format_split(box.activation_bytes, box.leaf_bytes, box.output_bytes)


def node_style(
    node: Node, attrs: bool, max_attr_chars: int, root: str | os.PathLike[str] | None = None
) -> tuple[str, dict[str, str]]:
    """Label and extra DOT attributes of one node."""
    label, extra = _base_style(node, attrs, max_attr_chars)
    return annotate(node, label, extra, root), extra


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
        nodes = plural(count, "node") if isinstance(count, int) else f"{count} nodes"
        label = f"{node.name}\n{cls} · {nodes}\nsaved {_box_bytes(node)}"
        if box is not None and box.shown and node.module:  # fold(keep_first=True)
            rest = _others_label(node.module, box.repeat or 0)
            like = levels(box.shown)[-1]
            label = f"{rest}\nlike {like} · {nodes}\nsaved {_box_bytes(node)}"
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


def _others_label(run_path: str, repeat: int) -> str:
    """``encoder.layers.0-63``, 64 -> ``layers.1-63 x63``: the members a fold box stands for
    when it keeps the first one drawn."""
    last = levels(run_path)[-1]
    m = re.match(r"^(.*?)(\d+)-(\d+)(.*)$", last)
    if not m:
        return f"{last} x{max(repeat - 1, 0)}"
    a, b = int(m[2]) + 1, int(m[3])
    span = f"{a}" if a == b else f"{a}-{b}"
    return f"{m[1]}{span}{m[4]} x{max(repeat - 1, 0)}"


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
    root: str | os.PathLike[str] | None = None  # forward lines are shown relative to it
    compact: bool = False  # saved tensors and parameter chains on their node's rank
    ids: _Ids = field(default_factory=lambda: _Ids([]), compare=False)
    # Attribute lists of plain backward nodes, by everything they depend on: a deep model
    # repeats the same few (1,000 identical AddmmBackward0 labels), so each is built once.
    memo: dict[tuple[object, ...], str] = field(default_factory=dict, compare=False)


def _op_key(node: Node) -> tuple[object, ...] | None:
    """Cache key of an un-annotated backward node's attribute list, else None."""
    if node.kind not in ("op", "accumulate", "custom") or node.order is not None:
        return None
    attrs = node.attrs
    if node.nonfinite or node.forward_nonfinite:
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
        label, extra = node_style(node, opt.attrs, opt.max_attr_chars, opt.root)
        if note:
            label += "\n" + note
        attr_list = _attr_list(label, extra)
        if key is not None:
            opt.memo[key] = attr_list
    ids = opt.ids
    nid = ids.of(node.id)
    lines = [f"{indent}{nid} [{attr_list}]"]
    if opt.saved and node.kind != "module":
        sids = []
        for i, s in enumerate(node.saved):
            sid = ids.new(f"{node.id}_s{i}")
            sids.append(sid)
            if s.freed:
                slabel, sextra = saved_style(s)
                lines.append(f"{indent}{sid} [{_attr_list(slabel, sextra)}]")
            else:  # the common case, written directly
                tip = f"{s.dtype} on {s.device}, {format_bytes(s.nbytes)}, storage {s.storage}"
                label = quote(var_label(s.name, s.shape))
                lines.append(
                    f'{indent}{sid} [label={label} fillcolor="{SAVED_COLOR}" tooltip={quote(tip)}]'
                )
            lines.append(f"{indent}{nid} -> {sid} [dir=none]")
        if opt.compact and sids:  # beside their node, not on a rank of their own
            lines.append(f"{indent}{{rank=same; {'; '.join([nid, *sids])}}}")
    return lines


#: Deeper clusters are written with this many tabs: indentation stays linear in the input.
MAX_INDENT = 32
#: A cluster's tooltip names its module path; a longer one keeps its end (a path thousands of
#: levels deep would otherwise make the DOT text grow with the square of its depth).
MAX_TOOLTIP = 200


@dataclass
class _Cluster:
    """One drawn cluster: its parent's index, its level (``layers.3``), the module it shows
    (a module trie index; -1 for a fold), the fold box it stands for, if any, and its depth in
    real module levels."""

    parent: int
    level: str
    module: int
    fold: Node | None
    depth: int


@dataclass
class _Clusters:
    """Where each node is drawn: ``of`` (node id -> cluster index; 0 is the top level), the
    clusters as a trie of interned prefixes (so a path thousands of levels deep costs its
    length, not its length squared), and the modules they show (trie indices)."""

    of: dict[str, int]
    clusters: list[_Cluster]
    box_module: dict[str, int]  # a module box's node id -> its module's trie index

    module_tail: list[str]  # module trie index -> its path's last MAX_TOOLTIP characters
    module_size: list[int]  # ... and its full length

    def module_path(self, m: int) -> str:
        """The dotted path of module ``m``; a longer one than ``MAX_TOOLTIP`` keeps its end."""
        tail = self.module_tail[m]
        return tail if self.module_size[m] <= MAX_TOOLTIP else "…" + tail[1:]


def _cluster_keys(graph: Graph) -> _Clusters:
    """The cluster each node is drawn in. A fold box with ``shown`` (``fold(keep_first=True)``)
    gets a cluster of its own around itself and the member it keeps: ``layers.0-63 x64`` holds
    ``layers.0`` and the ``layers.1-63`` box."""
    module_tail, module_size = [""], [0]
    mtrie: dict[tuple[int, str], int] = {}
    clusters = [_Cluster(-1, "", 0, None, 0)]
    ctrie: dict[tuple[int, str], int] = {}

    def module(parent: int, level: str) -> int:
        m = mtrie.get((parent, level))
        if m is None:
            m = mtrie[(parent, level)] = len(module_tail)
            up = module_tail[parent]
            module_tail.append((f"{up}.{level}" if parent else level)[-MAX_TOOLTIP:])
            module_size.append(module_size[parent] + (1 if parent else 0) + len(level))
        return m

    def cluster(parent: int, level: str, m: int, depth: int) -> int:
        c = ctrie.get((parent, level))
        if c is None:
            c = ctrie[(parent, level)] = len(clusters)
            clusters.append(_Cluster(parent, level, m, None, depth))
        return c

    def mwalk(lv: list[str]) -> int:
        m = 0
        for part in lv:
            m = module(m, part)
        return m

    def walk(lv: list[str]) -> int:
        """The cluster of levels ``lv``, with the level of each fold whose kept member they
        lie in inserted."""
        c = m = 0
        for depth, part in enumerate(lv, 1):
            m = module(m, part)
            box = folds.get(m)
            if box is not None:
                c = cluster(c, levels(box.module or "")[-1], -1, depth - 1)
                clusters[c].fold, clusters[c].module = box, -1
            c = cluster(c, part, m, depth)
        return c

    folds: dict[int, Node] = {}  # module trie index of the member a fold keeps -> the fold box
    for n in graph.nodes:
        if n.kind == "module" and n.box is not None and n.box.shown and n.module:
            folds[mwalk(levels(n.box.shown))] = n
    of: dict[str, int] = {}
    box_module: dict[str, int] = {}
    for nid, path in node_paths(graph).items():
        lv = levels(path) if path else []
        node = graph.node(nid)
        if node.kind == "module" and node.module is not None:
            box_module[nid] = mwalk(levels(node.module))
            # the box of a fold's others sits in its fold's cluster (its path's last level);
            # any other box stands for its module: drawn inside the module's parent
            if not (node.box is not None and node.box.shown) and lv:
                lv = lv[:-1]
        of[nid] = walk(lv)
    return _Clusters(of, clusters, box_module, module_tail, module_size)


def _param_chains(graph: Graph, of: dict[str, int], ids: _Ids) -> dict[str, str]:
    """AccumulateGrad id -> ``{rank=same; leaf; AccumulateGrad; consumer}`` for a parameter
    drawn on the rank of the op that uses it (both in one cluster): a module's parameters then
    add no rank above it, and consecutive modules stack instead of spreading sideways."""
    kinds = {n.id: n.kind for n in graph.nodes}
    leaf: dict[str, str] = {}
    users: dict[str, list[str]] = {}
    for e in graph.edges:
        if kinds.get(e.src) == "accumulate" and kinds.get(e.dst) == "leaf":
            leaf[e.src] = e.dst
        elif kinds.get(e.dst) == "accumulate" and e.kind == "grad":
            users.setdefault(e.dst, []).append(e.src)
    out = {}
    for acc, lf in leaf.items():
        chain = [lf, acc]
        use = users.get(acc, [])
        if len(use) == 1 and of.get(use[0]) == of.get(acc):
            chain.append(use[0])
        out[acc] = "{rank=same; " + "; ".join(ids.of(x) for x in chain) + "}"
    return out


def _cluster_lines(graph: Graph, cl: _Clusters, opt: _Options) -> list[str]:
    """Nodes nested in ``subgraph cluster_*`` blocks by module path, in first-seen order."""
    of = cl.of
    kids: dict[int, list[int]] = {}  # cluster -> child clusters, in first-seen order
    listed: set[int] = {0}
    members: dict[int, list[Node]] = {}
    knows: dict[int, Node] = {}  # cluster -> a node inside it that knows its class
    parent_of = [c.parent for c in cl.clusters]
    for node in graph.nodes:
        c = of[node.id]
        members.setdefault(c, []).append(node)
        if node.kind == "module" or node.module_classes:
            k = c
            while k > 0 and k not in knows:
                knows[k] = node
                k = parent_of[k]
        k = c
        while k not in listed:
            listed.add(k)
            kids.setdefault(parent_of[k], []).append(k)
            k = parent_of[k]
    chains = _param_chains(graph, of, opt.ids) if opt.compact else {}
    out: list[str] = []
    counter = 0
    # (cluster, depth, opening?): iterative, so deep module trees meet no recursion limit
    stack: list[tuple[int, int, bool]] = [(0, 0, True)]
    while stack:
        c, depth, opening = stack.pop()
        indent = "\t" * min(depth, MAX_INDENT)
        if not opening:
            out.append(f"{indent}}}")
            continue
        if depth:
            out.append(f"{indent}subgraph cluster_{counter} {{")
            label, tip = _cluster_label(c, cl, knows)
            head = f"label={quote(label)} tooltip={quote(tip)}"
            out.append(f"{indent}\tgraph [{head} {CLUSTER_ATTR}]")
            counter += 1
            stack.append((c, depth, False))
        for node in members.get(c, ()):
            out.extend(_node_lines(node, opt, indent + "\t"))
            if node.id in chains:
                out.append(f"{indent}\t{chains[node.id]}")
        stack.extend((child, depth + 1, True) for child in reversed(kids.get(c, [])))
    return out


def _cluster_label(c: int, cl: _Clusters, knows: dict[int, Node]) -> tuple[str, str]:
    """(label, tooltip) of a cluster: ``name: Class``; a fold's says what it folds."""
    cluster = cl.clusters[c]
    box = cluster.fold
    if box is not None:
        assert box.box is not None and box.box.shown is not None
        cls = box.box.cls
        first = levels(box.box.shown)[-1]
        name = f"{cluster.level} x{box.box.repeat}"
        label = f"{name}: {cls}".rstrip(": ") + f" ({first} drawn, the others alike)"
        return label, f"{_tail(box.module or '')}: draw every repeat with --no-fold"
    cls = ""
    sample = knows.get(c)
    if sample is not None and sample.module is not None:  # as paths.module_class, but O(1)
        depth = cluster.depth
        if (sample.box is not None and sample.box.cls
                and cl.box_module.get(sample.id) == cluster.module):
            cls = sample.box.cls
        else:
            chain = sample.module_classes
            if chain and len(chain) > depth and chain[depth]:
                cls = chain[depth]
    return f"{cluster.level}: {cls}".rstrip(": "), cl.module_path(cluster.module)


def _tail(path: str, limit: int = MAX_TOOLTIP) -> str:
    return path if len(path) <= limit else "…" + path[-limit:]


def to_dot(
    graph: Graph,
    *,
    saved: bool = True,
    attrs: bool = False,
    max_attr_chars: int = 50,
    clusters: bool = True,
    notes: dict[str, str] | None = None,
    legend: bool = False,
    root: str | os.PathLike[str] | None = None,
) -> str:
    """Render ``graph`` as DOT text.

    Args:
        graph: the graph to draw.
        saved: draw each saved tensor as an orange box joined to its node.
        attrs: list each node's non-tensor saved attributes in its label.
        max_attr_chars: truncate attribute values to this many characters.
        clusters: when nodes carry module paths (``gs.scopes``), draw each module as a
            nested ``subgraph cluster_*`` labelled ``name: Class``; saved tensors and
            parameters then sit on the rank of their op, so modules stack compactly.
        notes: an extra label line per node id, e.g. ``Graph.memory().node_labels()``.
        legend: add a compact legend (what the colours, boxes and lines mean) under the graph,
            listing only what the picture uses.
        root: the model file's folder: forward lines are shown relative to it.

    Arrows point in the forward direction (input -> op), as torchviz draws them.

    Example:
        >>> from gradscope.model.graph import Graph, Node
        >>> to_dot(Graph([Node("n0", "MulBackward0", "op")], roots=["n0"])).splitlines()[0]
        'digraph {'
    """
    # A cheap test first: graphs traced without scopes have no module and skip the grouping.
    cl = _cluster_keys(graph) if clusters and any(n.module for n in graph.nodes) else None
    clustered = cl is not None and any(cl.of.values())
    ids = _Ids(graph.nodes)
    opt = _Options(saved, attrs, max_attr_chars, notes, root, compact=clustered, ids=ids)
    # clustered pictures are tighter than torchviz's defaults: clusters add their own margins
    head = "\tgraph [rankdir=TB nodesep=0.12 ranksep=0.2]" if clustered else "\tgraph [rankdir=TB]"
    out = ["digraph {", f"\tnode [{NODE_ATTR}]", head]
    if clustered and cl is not None:
        out.extend(_cluster_lines(graph, cl, opt))
    else:
        for node in graph.nodes:
            out.extend(_node_lines(node, opt, "\t"))
    tok = ids.of
    for e in graph.edges:
        if e.kind in ("view", "saved"):
            out.append(f"\t{tok(e.dst)} -> {tok(e.src)} [style=dotted]")
        elif e.grad_norm is not None or e.count != 1:
            out.append(f"\t{tok(e.dst)} -> {tok(e.src)} [{_edge_attrs(e)}]")
        else:
            out.append(f"\t{tok(e.dst)} -> {tok(e.src)}")
    if legend:
        out.append(legend_line(graph, saved=saved, clustered=clustered))
    out.append("}")
    return "\n".join(out) + "\n"


def _html(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def legend_line(graph: Graph, *, saved: bool = True, clustered: bool = False) -> str:
    """The compact legend, as a DOT graph label (an HTML-like table under the graph) listing
    only what this picture uses: node kinds, saved tensors, module frames and boxes, folds,
    view-base edges, merged-edge counts and, when the graph has gradient norms, their scale."""
    kinds = {n.kind for n in graph.nodes}
    cells: list[tuple[str, str]] = []  # (fill colour, text)
    if kinds & {"op", "accumulate"}:
        cells.append((OP_COLOR, "op"))
    if "custom" in kinds:
        cells.append((CUSTOM_COLOR, "custom Function"))
    if "leaf" in kinds:
        cells.append((LEAF_COLOR, "leaf (parameter, input)"))
    if "output" in kinds:
        cells.append((OUTPUT_COLOR, "output"))
    if any(n.view_base for n in graph.nodes):
        cells.append((BASE_COLOR, "view base"))
    if saved and any(n.saved and n.kind != "module" for n in graph.nodes):
        cells.append((SAVED_COLOR, "saved tensor"))
    boxes = [n for n in graph.nodes if n.kind == "module"]
    if any(b.box is None or not b.box.repeat for b in boxes):
        cells.append((MODULE_COLOR, "collapsed module"))
    if any(b.box is not None and b.box.repeat for b in boxes):
        cells.append((FOLDED_COLOR, "repeated layers"))
    if any(n.nonfinite for n in graph.nodes):
        cells.append((BAD_COLOR, "first NaN/Inf"))
    notes = []
    if clustered:
        notes.append("dashed frame: module")
    if any(e.kind == "view" for e in graph.edges):
        notes.append("dotted: view → base")
    if any(e.count != 1 for e in graph.edges):
        notes.append("xN: N edges merged")
    if any(n.order is not None for n in graph.nodes):
        notes.append("#N: backward order")
    rows = []
    if cells:
        swatches = "".join(
            f'<TD BGCOLOR="{c}" BORDER="1" WIDTH="12" HEIGHT="9" FIXEDSIZE="TRUE"> </TD>'
            f'<TD ALIGN="LEFT">{_html(t)}  </TD>'
            for c, t in cells
        )
        rows.append(f'<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="1" CELLPADDING="1">'
                    f"<TR>{swatches}</TR></TABLE>")
    if any(e.grad_norm is not None for e in graph.edges):
        bands = "  ".join(
            f'<FONT COLOR="{b.color}">{_html(b.name + _band_range(i))}</FONT>'
            for i, b in enumerate(NORM_BANDS)
        )
        bad = f'<FONT COLOR="{BAD_COLOR}">NaN/Inf</FONT>'
        rows.append(f"edge colour, gradient norm: {bands}  {bad}")
    if notes:
        rows.append(_html("  ·  ".join(notes)))
    if not rows:
        return ""
    body = "".join(f'<TR><TD ALIGN="LEFT">{r}</TD></TR>' for r in rows)
    table = f'<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">{body}</TABLE>>'
    return f"\tgraph [label={table} labelloc=b labeljust=l fontsize=9 fontname=monospace]"


def _band_range(i: int) -> str:
    lower = NORM_BANDS[i - 1].upper if i else None
    upper = NORM_BANDS[i].upper
    if lower is None:
        return f" <{upper:g}"
    if math.isinf(upper):
        return f" ≥{lower:g}"
    return f" {lower:g}–{upper:g}"


#: The options of ``to_dot``, which every Graphviz-based format takes.
DOT_OPTIONS = frozenset(
    {"saved", "attrs", "max_attr_chars", "clusters", "notes", "legend", "root"}
)


def _render_dot(graph: Graph, **options: object) -> bytes:
    return to_dot(graph, **options).encode("utf-8")  # type: ignore[arg-type]


register_format(
    OutputFormat("dot", _render_dot, DOT_OPTIONS, "DOT text (no Graphviz needed)",
                 kind=FormatKind.PICTURE)  # a picture's source: the same bounded view
)
