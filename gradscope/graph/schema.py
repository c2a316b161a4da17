"""The JSON form of a ``Graph``, written by ``Graph.to_json`` and read back, validated, by
``Graph.from_json``: ``Graph.from_json(g.to_json()) == g`` for every graph.

Schema version 4 (written now), in the envelope every gradscope document shares
(``gradscope.output.envelope``: the version, then the kind)::

    {"gradscope": 4, "kind": "graph",
     "roots": ["n0"],
     "nodes": [{"id": "n0", "name": "MeanBackward0", "kind": "op", "module": null,
                "attrs": {"self_sym_numel": "15"},
                "saved": [{"name": "self", "shape": [3, 5], "dtype": "float32",
                           "device": "cpu", "nbytes": 60, "storage": "s0", "freed": false}],
                "tensor": null,
                ...optional keys, present only when set:
                "order": 0, "module_classes": ["Net", "Linear"],
                "created_at": "model.py:7: y = x.log()", "nonfinite": "nan",
                "first_nonfinite": true, "view_base": true, "forward_nonfinite": "nan",
                "box": {"cls": "Linear", "nodes": 5, "saved_bytes": 64, "repeat": 4,
                        "leaf_bytes": 48, "output_bytes": 0, "aliases": {"s3": "leaf"}},
                "region": "n4", "compiled": {"graph": 0, "ops": 21, "note": "..."}}],
     "edges": [{"src": "n0", "dst": "n1", "input_nr": 0,
                ...optional: "kind": "view", "grad_norm": 0.5 (or "nan"/"inf"/"-inf"),
                "count": 3}]}

Shapes are lists of integers; a dimension that has no single size is ``null``. That is how
nested tensors (``torch.nested``) are written: the number of components, then per dimension
the size all components share, or ``null`` where they differ (a ragged dimension; a jagged
tensor's ragged dimension is always ``null``). Two components of shapes (2, 3) and (4, 3) give
``[2, null, 3]``, which renderers draw as ``(2, *, 3)``. Their ``nbytes`` count the buffer that
holds the components.

Version 1 (before gradscope's annotations were typed) kept
them as strings in ``attrs`` (``nonfinite``, ``first_nonfinite``, ``created_at``,
``view_base``, ``module_classes``, and ``class``/``nodes``/``saved_bytes``/``repeat`` on module
boxes); it still loads, and those keys become the typed fields.

Version 3 added ``region`` and ``compiled`` on nodes and the edge kind ``saved`` (torch.compile
regions); a version 2 document is a version 3 document without them and loads as it is.
Version 4 is version 3 in the envelope (``"kind": "graph"``); 1 to 3 have no ``"kind"``.

A module box's ``saved_bytes`` counts each storage once; ``leaf_bytes`` and ``output_bytes``
(optional, 0 when absent) are the parts of it that alias a leaf (a parameter or an input) or an
output, and ``aliases`` names those storages (optional keys: a box written without them, in
any version, reads as all activations). A saved tensor's optional ``alias`` (``"leaf"``) says
its storage is alive without the graph though no leaf node holds it (a parameter, buffer or
input of the traced model); without it the storage counts as the graph's own.

Reading validates structure and types and raises ``SchemaError`` naming the JSON path of the
first problem (``nodes[3].saved[0].freed: expected true or false, got "false"``).
"""

from __future__ import annotations

import json
from typing import Any, Literal, overload

from ..errors import SchemaError
from .gcpause import collector_paused
from .nodes import (
    KINDS,
    Box,
    Edge,
    Node,
    Region,
    SavedTensor,
    TensorInfo,
)
from .schema_write import (
    ALIAS_KINDS,
    EDGE_KINDS,
    MAX_DEPTH,
    MAX_INT,
    NODE_ID,
    NONFINITE_KINDS,
    READABLE_VERSIONS,
    SCHEMA_VERSION,
)

_V1_BOX = ("class", "nodes", "saved_bytes", "repeat")


# ---------------------------------------------------------------------------- reading
#: What a document holds: the nodes, edges and roots of a ``Graph``.
Parts = tuple[list[Node], list[Edge], list[str]]


def read_json(s: str | bytes) -> Parts:
    """Parse and validate JSON written by ``graph_to_json`` (any readable version).

    Raises:
        SchemaError: not JSON, nested too deeply, or not a valid gradscope graph.
    """
    if isinstance(s, (bytes, bytearray)):
        try:
            s = s.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SchemaError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not isinstance(s, str):
        raise SchemaError(f"expected JSON text (str or bytes), got {type(s).__name__}")
    with collector_paused():  # millions of containers, none freed (model/gcpause.py)
        return _read_text(s)


def _read_text(s: str) -> Parts:
    try:
        data = json.loads(s)
    except json.JSONDecodeError as exc:
        raise SchemaError(
            f"not valid JSON ({exc}); expected the output of Graph.to_json()"
        ) from None
    except RecursionError:
        raise SchemaError(
            f"the JSON nests too deeply to read; a gradscope graph nests at most {MAX_DEPTH} "
            "levels (expected the output of Graph.to_json())"
        ) from None
    except (ValueError, OverflowError) as exc:
        raise SchemaError(f"not valid JSON ({type(exc).__name__}: {exc})") from None
    return read_dict(data, _consume=True)


def read_dict(d: Any, *, _consume: bool = False) -> Parts:
    """The nodes, edges and roots in the dict of any readable schema version, validated.

    ``_consume`` (``read_json``, which owns the parsed document) drops each record of ``d`` once
    read, so the parsed dicts and the built records are not all alive at once.

    Raises:
        SchemaError: the first problem found, with its JSON path.
    """
    if not isinstance(d, dict) or "gradscope" not in d:
        raise SchemaError(
            'not a gradscope graph: expected a JSON object with "gradscope": '
            f'{SCHEMA_VERSION}, "kind": "graph" (write one with Graph.to_json() or gradscope '
            "render -o graph.json)"
        )
    version, kind = d["gradscope"], d.get("kind")
    if kind != "graph" and (kind is not None or version == SCHEMA_VERSION):
        raise SchemaError(
            f"not a gradscope graph: a {json.dumps(kind)} document (a graph is "
            f'{{"gradscope": {SCHEMA_VERSION}, "kind": "graph", ...}}: write one with '
            "Graph.to_json() or gradscope render -o graph.json)"
        )
    if type(version) is not int or version not in READABLE_VERSIONS:
        raise SchemaError(
            f"gradscope: unsupported schema version {json.dumps(version)}; this gradscope "
            f"reads versions {', '.join(map(str, READABLE_VERSIONS))} (a newer gradscope wrote "
            "it? upgrade gradscope)"
        )
    r = _Reader(version)
    nodes_raw = r.list_of(d, "nodes", "")
    fast = version != 1
    nodes: list[Node] = []
    append = nodes.append
    for i, raw in enumerate(nodes_raw):
        # the common record is checked inline (no JSON path built); anything unusual, or
        # wrong, goes the careful way, which names the path of the first problem
        node = _fast_node(raw) if fast else None
        append(node if node is not None else r.node(raw, f"nodes[{i}]"))
        if _consume:
            nodes_raw[i] = None
    ids: dict[str, int] = {}
    for i, n in enumerate(nodes):
        if n.id in ids:
            other = ids[n.id]
            raise SchemaError(f"nodes[{i}].id: {json.dumps(n.id)} is used by nodes[{other}] too")
        ids[n.id] = i
    for i, n in enumerate(nodes):
        if n.region is not None and n.region not in ids:
            raise SchemaError(f"nodes[{i}].region: {json.dumps(n.region)} names no node")
    edges_raw = r.list_of(d, "edges", "")
    edges: list[Edge] = []
    add_edge = edges.append
    for i, raw in enumerate(edges_raw):
        edge = _fast_edge(raw, ids)
        add_edge(edge if edge is not None else r.edge(raw, f"edges[{i}]", ids))
        if _consume:
            edges_raw[i] = None
    roots_raw = r.list_of(d, "roots", "")
    roots = []
    for i, root in enumerate(roots_raw):
        at = f"roots[{i}]"
        r.expect_str(root, at)
        if root not in ids:
            raise SchemaError(f"{at}: {json.dumps(root)} names no node")
        roots.append(root)
    return nodes, edges, roots


_FAST_NODE_KEYS = frozenset(
    {"id", "name", "kind", "module", "attrs", "saved", "tensor", "order", "module_classes",
     "created_at"}
)
_FAST_SAVED_KEYS = frozenset(
    {"name", "shape", "dtype", "device", "nbytes", "storage", "freed", "storage_nbytes", "alias"}
)
_SAVED_REQUIRED = _FAST_SAVED_KEYS - {"storage_nbytes", "alias"}
_FAST_TENSOR_KEYS = frozenset({"name", "shape", "dtype", "device", "storage"})
_TENSOR_REQUIRED = _FAST_TENSOR_KEYS - {"storage"}
_FAST_EDGE_KEYS = frozenset({"src", "dst", "input_nr", "kind", "count"})


def _fast_shape(v: Any) -> bool:
    """A list of integers >= 0 (or null)."""
    if type(v) is not list:
        return False
    for x in v:
        if x is not None and (type(x) is not int or x < 0 or x > MAX_INT):
            return False
    return True


def _opt_str(v: Any) -> bool:
    return v is None or type(v) is str


def _fast_node(d: Any) -> Node | None:
    """A node of version 2 or 3 as ``Graph.to_json`` writes most of them, checked inline; None
    for anything else (the careful reader then takes it, and names what is wrong)."""
    if type(d) is not dict or not d.keys() <= _FAST_NODE_KEYS:
        return None
    nid, name, kind = d.get("id"), d.get("name"), d.get("kind")
    if (type(nid) is not str or type(name) is not str or type(kind) is not str
            or kind not in KINDS or not NODE_ID.match(nid)):
        return None
    module = d.get("module")
    attrs = d.get("attrs", {})
    if not _opt_str(module) or type(attrs) is not dict:
        return None
    for v in attrs.values():
        if type(v) is not str:
            return None
    saved_raw = d.get("saved", [])
    if type(saved_raw) is not list:
        return None
    saved = []
    for sd in saved_raw:
        if (type(sd) is not dict or not sd.keys() <= _FAST_SAVED_KEYS
                or not _SAVED_REQUIRED <= sd.keys()):
            return None
        shape, nbytes, freed = sd["shape"], sd["nbytes"], sd["freed"]
        size, alias = sd.get("storage_nbytes"), sd.get("alias")
        sname = sd["name"]
        dtype, device, storage = sd["dtype"], sd["device"], sd["storage"]
        if (type(sname) is not str or (shape is not None and not _fast_shape(shape))
                or (dtype is not None and type(dtype) is not str)
                or (device is not None and type(device) is not str)
                or type(nbytes) is not int or not 0 <= nbytes <= MAX_INT
                or (storage is not None and type(storage) is not str) or type(freed) is not bool
                or (size is not None and (type(size) is not int or not 0 <= size <= MAX_INT))
                or (alias is not None and alias not in ALIAS_KINDS)):
            return None
        saved.append(
            SavedTensor(sname, shape, dtype, device, nbytes, storage, freed, size, alias))
    t = d.get("tensor")
    tensor = None
    if t is not None:
        if (type(t) is not dict or not t.keys() <= _FAST_TENSOR_KEYS
                or not _TENSOR_REQUIRED <= t.keys()):
            return None
        tname, shape, dtype, device = t.get("name"), t.get("shape"), t.get("dtype"), t.get("device")
        storage = t.get("storage")
        if (not _opt_str(tname) or not _fast_shape(shape) or type(dtype) is not str
                or type(device) is not str or not _opt_str(storage)):
            return None
        tensor = TensorInfo(tname, shape, dtype, device, storage)  # type: ignore[arg-type]
    order = d.get("order")
    if order is not None and (type(order) is not int or not 0 <= order <= MAX_INT):
        return None
    classes = d.get("module_classes")
    if classes is not None:
        if type(classes) is not list or any(type(c) is not str for c in classes):
            return None
        classes = tuple(classes)
    created = d.get("created_at")
    if not _opt_str(created):
        return None
    return Node(nid, name, kind, module, dict(attrs), saved, tensor, order, classes, created)


def _fast_edge(d: Any, ids: dict[str, int]) -> Edge | None:
    """An edge as ``Graph.to_json`` writes most of them, checked inline; else None."""
    if type(d) is not dict or not d.keys() <= _FAST_EDGE_KEYS:
        return None
    src, dst, nr = d.get("src"), d.get("dst"), d.get("input_nr", 0)
    kind, count = d.get("kind", "grad"), d.get("count", 1)
    if (type(src) is not str or type(dst) is not str or src not in ids or dst not in ids
            or type(nr) is not int or not 0 <= nr <= MAX_INT or type(kind) is not str
            or kind not in EDGE_KINDS or type(count) is not int or not 1 <= count <= MAX_INT):
        return None
    return Edge(src, dst, nr, kind, None, count)


def _show(v: Any) -> str:
    text = json.dumps(v) if isinstance(v, (str, int, float, bool, type(None))) else type(v).__name__
    return text if len(text) <= 40 else text[:37] + "..."


class _Reader:
    """Reads one document; every method names the JSON path of what it rejects."""

    def __init__(self, version: int) -> None:
        self.version = version

    # ------------------------------------------------------------------ primitives
    @staticmethod
    def fail(at: str, want: str, got: Any) -> SchemaError:
        return SchemaError(f"{at}: expected {want}, got {_show(got)}")

    def field(self, d: dict[str, Any], key: str, at: str) -> Any:
        if key not in d:
            raise SchemaError(f"{at}: missing key {json.dumps(key)}")
        return d[key]

    def obj(self, v: Any, at: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self.fail(at, "an object", v)
        return v

    def list_of(self, d: dict[str, Any], key: str, at: str) -> list[Any]:
        path = f"{at}.{key}" if at else key
        v = self.field(d, key, at or "(document)")
        if not isinstance(v, list):
            raise self.fail(path, "a list", v)
        return v

    def expect_str(self, v: Any, at: str) -> str:
        if not isinstance(v, str):
            raise self.fail(at, "a string", v)
        return v

    def opt_str(self, v: Any, at: str) -> str | None:
        return None if v is None else self.expect_str(v, at)

    def expect_int(self, v: Any, at: str, *, low: int = 0) -> int:
        if type(v) is not int:  # bool is an int subclass: refused
            raise self.fail(at, "an integer", v)
        if v < low:
            raise self.fail(at, f"an integer >= {low}", v)
        if v > MAX_INT:
            raise self.fail(at, f"an integer <= {MAX_INT} (2**63 - 1)", v)
        return v

    def expect_bool(self, v: Any, at: str) -> bool:
        if type(v) is not bool:
            raise self.fail(at, "true or false", v)
        return v

    @overload
    def shape(self, v: Any, at: str, *, optional: Literal[False]) -> list[int | None]: ...
    @overload
    def shape(self, v: Any, at: str, *, optional: Literal[True]) -> list[int | None] | None: ...
    def shape(self, v: Any, at: str, *, optional: bool) -> list[int | None] | None:
        if v is None and optional:
            return None
        if not isinstance(v, list):
            raise self.fail(at, "a list of integers" + (" or null" if optional else ""), v)
        out: list[int | None] = []
        for i, dim in enumerate(v):
            out.append(None if dim is None else self.expect_int(dim, f"{at}[{i}]"))
        return out

    def norm(self, v: Any, at: str) -> float | None:
        if v is None:
            return None
        if isinstance(v, str):
            if v in ("nan", "inf", "-inf"):
                return float(v)
            raise self.fail(at, 'a number, "nan", "inf" or "-inf"', v)
        if type(v) not in (int, float):
            raise self.fail(at, "a number", v)
        try:
            return float(v)
        except OverflowError:
            raise self.fail(at, "a number a float can hold", v) from None

    # ------------------------------------------------------------------ records
    def saved(self, v: Any, at: str) -> SavedTensor:
        d = self.obj(v, at)
        nbytes = self.expect_int(self.field(d, "nbytes", at), f"{at}.nbytes")
        size, alias = d.get("storage_nbytes"), d.get("alias")
        if alias is not None and alias not in ALIAS_KINDS:
            raise self.fail(f"{at}.alias", '"leaf" or "output"', alias)
        return SavedTensor(
            self.expect_str(self.field(d, "name", at), f"{at}.name"),
            self.shape(self.field(d, "shape", at), f"{at}.shape", optional=True),
            self.opt_str(self.field(d, "dtype", at), f"{at}.dtype"),
            self.opt_str(self.field(d, "device", at), f"{at}.device"),
            nbytes,
            self.opt_str(self.field(d, "storage", at), f"{at}.storage"),
            self.expect_bool(self.field(d, "freed", at), f"{at}.freed"),
            None if size is None else self.expect_int(size, f"{at}.storage_nbytes"),
            alias,
        )

    def tensor(self, v: Any, at: str) -> TensorInfo | None:
        if v is None:
            return None
        d = self.obj(v, at)
        return TensorInfo(
            self.opt_str(self.field(d, "name", at), f"{at}.name"),
            self.shape(self.field(d, "shape", at), f"{at}.shape", optional=False),
            self.expect_str(self.field(d, "dtype", at), f"{at}.dtype"),
            self.expect_str(self.field(d, "device", at), f"{at}.device"),
            self.opt_str(d.get("storage"), f"{at}.storage"),
        )

    def attrs(self, v: Any, at: str) -> dict[str, str]:
        d = self.obj(v, at)
        for k, val in d.items():
            if not isinstance(val, str):
                raise self.fail(f"{at}[{json.dumps(k)}]", "a string", val)
        return dict(d)

    def box(self, v: Any, at: str) -> Box | None:
        if v is None:
            return None
        d = self.obj(v, at)
        repeat = d.get("repeat")
        shown = d.get("shown")
        aliases = self.obj(d.get("aliases", {}), f"{at}.aliases")
        for sid, kind in aliases.items():
            if kind not in ALIAS_KINDS:
                raise self.fail(f"{at}.aliases[{json.dumps(sid)}]", '"leaf" or "output"', kind)
        box = Box(
            self.expect_str(self.field(d, "cls", at), f"{at}.cls"),
            self.expect_int(self.field(d, "nodes", at), f"{at}.nodes"),
            self.expect_int(self.field(d, "saved_bytes", at), f"{at}.saved_bytes"),
            None if repeat is None else self.expect_int(repeat, f"{at}.repeat", low=1),
            self.expect_int(d.get("leaf_bytes", 0), f"{at}.leaf_bytes"),
            self.expect_int(d.get("output_bytes", 0), f"{at}.output_bytes"),
            dict(aliases),
            None if shown is None else self.expect_str(shown, f"{at}.shown"),
        )
        if box.leaf_bytes + box.output_bytes > box.saved_bytes:
            raise SchemaError(
                f"{at}: leaf_bytes + output_bytes ({box.leaf_bytes + box.output_bytes}) exceed "
                f"saved_bytes ({box.saved_bytes}); they are parts of it"
            )
        return box

    def node(self, v: Any, at: str) -> Node:
        d = self.obj(v, at)
        kind = self.expect_str(self.field(d, "kind", at), f"{at}.kind")
        if kind not in KINDS:
            raise self.fail(f"{at}.kind", f"one of {', '.join(KINDS)}", kind)
        saved_raw = d.get("saved", [])
        if not isinstance(saved_raw, list):
            raise self.fail(f"{at}.saved", "a list", saved_raw)
        attrs = self.attrs(d.get("attrs", {}), f"{at}.attrs")
        order = d.get("order")
        nid = self.expect_str(self.field(d, "id", at), f"{at}.id")
        if not NODE_ID.match(nid):
            raise self.fail(
                f"{at}.id", 'an id of letters, digits, "_", "-" and "." (at most 200 characters, '
                "as Graph.to_json writes them: n0, n1...)", nid)
        node = Node(
            id=nid,
            name=self.expect_str(self.field(d, "name", at), f"{at}.name"),
            kind=kind,
            module=self.opt_str(d.get("module"), f"{at}.module"),
            attrs=attrs,
            saved=[self.saved(s, f"{at}.saved[{i}]") for i, s in enumerate(saved_raw)],
            tensor=self.tensor(d.get("tensor"), f"{at}.tensor"),
            order=None if order is None else self.expect_int(order, f"{at}.order"),
        )
        if self.version == 1:
            _upgrade_v1(node, at)
            return node
        classes = d.get("module_classes")
        if classes is not None:
            if not isinstance(classes, list):
                raise self.fail(f"{at}.module_classes", "a list of strings", classes)
            node.module_classes = tuple(
                self.expect_str(c, f"{at}.module_classes[{i}]") for i, c in enumerate(classes)
            )
        node.created_at = self.opt_str(d.get("created_at"), f"{at}.created_at")
        bad = d.get("nonfinite")
        if bad is not None and bad not in NONFINITE_KINDS:
            raise self.fail(f"{at}.nonfinite", '"nan", "inf" or null', bad)
        node.nonfinite = bad
        node.first_nonfinite = self.expect_bool(
            d.get("first_nonfinite", False), f"{at}.first_nonfinite"
        )
        node.view_base = self.expect_bool(d.get("view_base", False), f"{at}.view_base")
        forward = d.get("forward_nonfinite")
        if forward is not None and forward not in NONFINITE_KINDS:
            raise self.fail(f"{at}.forward_nonfinite", '"nan", "inf" or null', forward)
        node.forward_nonfinite = forward
        node.box = self.box(d.get("box"), f"{at}.box")
        node.region = self.opt_str(d.get("region"), f"{at}.region")
        node.compiled = self.region(d.get("compiled"), f"{at}.compiled")
        return node

    def region(self, v: Any, at: str) -> Region | None:
        if v is None:
            return None
        d = self.obj(v, at)
        graph = d.get("graph")
        return Region(
            None if graph is None else self.expect_int(graph, f"{at}.graph"),
            self.expect_int(d.get("ops", 0), f"{at}.ops"),
            self.opt_str(d.get("note"), f"{at}.note"),
        )

    def edge(self, v: Any, at: str, ids: dict[str, int]) -> Edge:
        d = self.obj(v, at)
        ends = []
        for key in ("src", "dst"):
            end = self.expect_str(self.field(d, key, at), f"{at}.{key}")
            if end not in ids:
                raise SchemaError(f"{at}.{key}: {json.dumps(end)} names no node")
            ends.append(end)
        kind = d.get("kind", "grad")
        if kind not in EDGE_KINDS:
            raise self.fail(f"{at}.kind", '"grad", "view" or "saved"', kind)
        return Edge(
            ends[0],
            ends[1],
            self.expect_int(d.get("input_nr", 0), f"{at}.input_nr"),
            kind,
            self.norm(d.get("grad_norm"), f"{at}.grad_norm"),
            self.expect_int(d.get("count", 1), f"{at}.count", low=1),
        )


def _upgrade_v1(node: Node, at: str) -> None:
    """Move version 1's annotation strings out of ``attrs`` into the typed fields."""
    attrs = node.attrs
    bad = attrs.pop("nonfinite", None)
    if bad is not None and bad not in NONFINITE_KINDS:
        raise SchemaError(f'{at}.attrs["nonfinite"]: expected "nan" or "inf", got {_show(bad)}')
    node.nonfinite = bad
    node.first_nonfinite = attrs.pop("first_nonfinite", "") == "true"
    node.created_at = attrs.pop("created_at", None)
    node.view_base = bool(attrs.pop("view_base", ""))
    chain = attrs.pop("module_classes", None)
    if chain is not None:
        # version 1 chains had one class per depth level, without the model's own class
        node.module_classes = ("", *chain.split("/"))
    if node.kind == "module":
        box = {k: attrs.pop(k) for k in _V1_BOX if k in attrs}

        def figure(key: str, default: str, low: int) -> int:
            # digits only, as version 1 wrote them: "-3", " 5" or "1_0" would not round-trip
            text = box.get(key, default) or default
            value = int(text) if text.isascii() and text.isdigit() and len(text) <= 19 else -1
            if not low <= value <= MAX_INT:
                raise SchemaError(
                    f'{at}.attrs["{key}"]: a module box\'s {key} must be an integer from {low} '
                    f"to {MAX_INT}, got {_show(text)}"
                )
            return value

        node.box = Box(
            box.get("class", ""),
            figure("nodes", "1", 0),
            figure("saved_bytes", "0", 0),
            figure("repeat", "1", 1) if "repeat" in box else None,
        )
