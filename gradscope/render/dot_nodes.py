"""A node's DOT statements: its label and colours (torchviz's, plus gradscope's annotations),
its saved tensors' boxes, and the label helpers the other views share (``attr_table``,
``short_location``).

``node_style`` and ``saved_style`` give a box's label and extra attributes; ``_node_lines``
writes a node's statement and its saved boxes, with the attribute lists of plain backward nodes
built once per distinct node (``_Options.memo``).
"""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..graph.graph import Node, SavedTensor, format_bytes
from ..graph.nodes import format_split, plural
from ..graph.paths import levels
from ..output.style import (
    BAD_COLOR,
    BASE_COLOR,
    CUSTOM_COLOR,
    FOLDED_COLOR,
    FREED_COLOR,
    LEAF_COLOR,
    MODULE_COLOR,
    OUTPUT_COLOR,
    SAVED_COLOR,
    size_to_str,
    var_label,
)
from .dot_tokens import (
    MAX_QUOTED,
    _Ids,
    _Plain,
    _Quoted,
    quote,
)

BAD_OTHER_COLOR = "lightcoral"  # a later node whose gradient was also non-finite
OP_COLOR = "lightgrey"  # what Graphviz fills a style=filled node with when given no colour


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
    forward = node.forward_nonfinite
    if forward:  # where the forward first went non-finite: the first NaN of the run
        label += f"\n{forward} first made here, in the forward"
        extra["color"] = BAD_COLOR
        extra["penwidth"] = "3"
        extra["fillcolor"] = BAD_COLOR
    bad = node.nonfinite
    if bad:
        first = node.first_nonfinite
        if not forward:
            extra["fillcolor"] = BAD_COLOR if first else BAD_OTHER_COLOR
        label += f"\n{'first ' if first else ''}{bad} gradient"
    where = node.created_at
    if where and (forward or bad):  # the line that made it
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


def _attr_list(label: str, extra: dict[str, str], quoted: _Quoted | None = None) -> str:
    # colours repeat thousands of times (cached); a tooltip names a storage or module path
    q = quote if quoted is None else quoted.__getitem__
    parts = ["label=" + quote(label)]
    parts.extend([f"{k}={quote(v) if k == 'tooltip' else q(v)}" for k, v in extra.items()])
    return " ".join(parts)


def _saved_attrs(s: SavedTensor, opt: _Options, label: str | None = None) -> str:
    """A saved box's attribute list. The common box's label is quoted once per distinct name
    and shape, and its tooltip joined from pieces ``quote`` leaves as they are (each checked
    once, ``_Plain``); anything else is quoted whole."""
    if s.freed:
        slabel, sextra = saved_style(s)
        return _attr_list(slabel, sextra)
    if label is None:
        name, shape = s.name, s.shape
        try:
            key = (type(name), name, None if shape is None else tuple(shape))
            label = opt.labels.get(key)
            if label is None:
                label = opt.labels[key] = quote(var_label(name, shape))
        except TypeError:  # unhashable parts (a hand-built graph): no memo
            label = quote(var_label(name, shape))
    dtype, device, storage, plain = s.dtype, s.device, s.storage, opt.plain
    head: str | None = ""
    if type(dtype) is str and type(device) is str and type(storage) is str and plain[storage]:
        hkey = (dtype, device, s.nbytes)
        head = opt.tips.get(hkey)
        if head is None:
            text = f"{dtype} on {device}, {format_bytes(s.nbytes)}, storage "
            head = opt.tips[hkey] = text if plain[text] else ""
    if head and storage is not None and len(head) + len(storage) <= MAX_QUOTED:
        tip = '"' + head + storage + '"'
    else:
        tip = quote(f"{dtype} on {device}, {format_bytes(s.nbytes)}, storage {storage}")
    return f'label={label} fillcolor="{SAVED_COLOR}" tooltip={tip}'


def _box_prefix(s: SavedTensor, opt: _Options) -> tuple[str, int]:
    """A plain saved box's attribute list up to its storage id, and the length of its
    tooltip's text so far; ``("", 0)`` when the tooltip needs escaping (``_saved_attrs``
    then quotes it whole). ``s.dtype`` and ``s.device`` are ``str``."""
    head = f"{s.dtype} on {s.device}, {format_bytes(s.nbytes)}, storage "
    if not opt.plain[head]:
        return "", 0
    label = quote(var_label(s.name, s.shape))
    return f'label={label} fillcolor="{SAVED_COLOR}" tooltip="{head}', len(head)


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
    # quoted once per distinct string / name and shape / dtype, device and bytes (saved boxes)
    quoted: _Quoted = field(default_factory=_Quoted, compare=False)
    plain: _Plain = field(default_factory=_Plain, compare=False)
    labels: dict[tuple[object, ...], str] = field(default_factory=dict, compare=False)
    tips: dict[tuple[object, ...], str] = field(default_factory=dict, compare=False)
    sizes: dict[tuple[object, ...] | None, str] = field(default_factory=dict, compare=False)
    # a saved box's attribute list up to its storage id, by everything else it shows
    boxes: dict[tuple[object, ...], tuple[str, int]] = field(default_factory=dict,
                                                              compare=False)


_BACKWARD_KINDS = frozenset(("op", "accumulate", "custom"))


def _tensor_attr_list(node: Node, opt: _Options) -> str | None:
    """The attribute list of an un-annotated ``leaf``/``output`` node, from pieces ``quote``
    leaves as they are (each checked once per render, ``_Options.plain``): the size text of
    each distinct shape is built once. None when a piece needs escaping (then the general
    path quotes the whole text) or the node is annotated."""
    t = node.tensor
    if t is None or node.order is not None or node.nonfinite or node.forward_nonfinite:
        return None
    name, shape, plain = node.name or "", t.shape, opt.plain
    try:
        key = None if shape is None else tuple(shape)
        size = opt.sizes.get(key)
        if size is None:
            size = opt.sizes[key] = size_to_str(shape)
    except TypeError:  # unhashable parts (a hand-built graph)
        return None
    dtype, device, storage = t.dtype, t.device, t.storage
    if not (plain[name] and type(dtype) is str and type(device) is str
            and (storage is None or plain[storage])):
        return None
    head = opt.tips.get((dtype, device))
    if head is None:
        text = f"{dtype} on {device}, storage "
        head = opt.tips[(dtype, device)] = text if plain[text] else ""
    tail = "None" if storage is None else storage
    if (not head or len(name) + len(size) + 2 > MAX_QUOTED
            or len(head) + len(tail) > MAX_QUOTED):
        return None
    if node.kind == "leaf":
        fill = LEAF_COLOR
    else:
        fill = BASE_COLOR if node.view_base else OUTPUT_COLOR
    return f'label="{name}\\n {size}" fillcolor="{fill}" tooltip="{head}{tail}"'


def _node_lines(node: Node, opt: _Options, indent: str) -> list[str]:
    """The node's own line, and its saved tensors' boxes (none for a module box: it stands
    for many nodes, its label already sums their saved bytes)."""
    out: list[str] = []
    _lines_into(out, (node,), opt, indent)
    return out


def _lines_into(out: list[str], nodes: Iterable[Node], opt: _Options, indent: str) -> None:
    """``_node_lines`` of each of ``nodes``, appended to ``out``: one loop with its lookups
    bound once (it runs once per node of the picture). A plain backward node's attribute list
    is built once per distinct node (``_Options.memo``), a leaf's from plain pieces
    (``_tensor_attr_list``); anything else takes the general path (``node_style``)."""
    notes, memo, ids, compact = opt.notes, opt.memo, opt.ids, opt.compact
    want_saved, add, boxes, plain = opt.saved, out.append, opt.boxes, opt.plain
    tok, used = ids.tok, ids.used
    for node in nodes:
        nid_raw, kind = node.id, node.kind
        note = notes.get(nid_raw) if notes else None
        key = attr_list = None
        if not note:
            if kind in _BACKWARD_KINDS:
                if node.order is None and not node.nonfinite and not node.forward_nonfinite:
                    attrs = node.attrs
                    key = (node.name, kind, node.module, tuple(attrs.items()) if attrs else (),
                           tuple([(s.name, s.freed) for s in node.saved]))
                    attr_list = memo.get(key)
            elif kind == "leaf" or kind == "output":
                attr_list = _tensor_attr_list(node, opt)
        if attr_list is None:
            label, extra = node_style(node, opt.attrs, opt.max_attr_chars, opt.root)
            if note:
                label += "\n" + note
            attr_list = _attr_list(label, extra, opt.quoted)
            if key is not None:
                memo[key] = attr_list
        nid = tok.get(nid_raw)
        if nid is None:
            nid = ids.of(nid_raw)
        add(f"{indent}{nid} [{attr_list}]")
        saved = node.saved
        if want_saved and saved and kind != "module":
            sids = []
            # beside their node (compact), each saved box is linked to the one before it, the
            # first to the node: a row of short lines, where links all from the node arched
            # over the boxes between (four arcs over LayerNorm's five saved tensors)
            link = nid
            bare = nid is nid_raw or nid == nid_raw
            for i, s in enumerate(saved):
                sid = f"{nid_raw}_s{i}"
                if bare and sid not in used:  # ids.saved's common case, inline
                    used.add(sid)
                else:
                    sid = ids.saved(nid_raw, i)
                sids.append(sid)
                box = None
                storage, dtype, device = s.storage, s.dtype, s.device
                if (not s.freed and type(storage) is str and type(dtype) is str
                        and type(device) is str and plain[storage]):
                    shape, nbytes = s.shape, s.nbytes
                    try:
                        bkey = (type(s.name), s.name, None if shape is None else tuple(shape),
                                dtype, device, type(nbytes), nbytes)
                        pre = boxes.get(bkey)
                        if pre is None:
                            pre = boxes[bkey] = _box_prefix(s, opt)
                    except TypeError:  # unhashable parts (a hand-built graph): no memo
                        pre = None
                    if pre is not None and pre[0] and pre[1] + len(storage) <= MAX_QUOTED:
                        box = pre[0] + storage + '"'
                if box is None:
                    box = _saved_attrs(s, opt)
                add(f"{indent}{sid} [{box}]")
                add(f"{indent}{link} -> {sid} [dir=none]")
                if compact:
                    link = sid
            if compact:  # beside their node, not on a rank of their own
                add(f"{indent}{{rank=same; {'; '.join([nid, *sids])}}}")
