"""Capture: walk a live autograd graph into the plain-data model.

This is the only place (with the hook-based recorders) that touches autograd nodes. The walk is
iterative (an explicit stack), visits each node once, and costs O(nodes + edges): a graph a
million nodes deep never meets Python's recursion limit.

The walk loop itself runs in C (``gradscope/graph/_cwalk.c``, built by pip when a C compiler is
present): it builds the ``Node``/``Edge`` objects and leaf ``TensorInfo``s, and calls back into
``_Walker`` for the per-node reads that stay in Python (saved tensors, module paths, storage
ids). ``_Walker.walk_py`` is the same walk in pure Python; it runs when the extension is missing
or ``GRADSCOPE_PURE_PYTHON=1``, and ``tests/graph/test_cwalk.py`` checks that both give equal
graphs. What the walk reads of one tensor (its shape, bytes and storage id) is in
``tensor_facts``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

import torch

from .._torch import dynamo, torchcompat
from .._torch.stamps import MODULE_CLASSES_KEY, MODULE_KEY
from ..errors import GradscopeError, NoGradError
from . import compiled
from .gcpause import collector_paused
from .graph import (
    Edge,
    Graph,
    Node,
    SavedTensor,
    TensorInfo,
)
from .nest import iter_tensors
from .tensor_facts import (
    _dim,
    _nbytes,
    _shape,
    _storage_key,
    _Storages,
)

_SAVED = "_saved_"
_RAW = "_raw_saved_"



@dataclass(frozen=True, slots=True)
class _ClassInfo:
    """What a backward node class saves; computed once per class (``dir()`` is the slow part)."""

    kind: str
    saved: tuple[str, ...]  # every `_saved_*` name, without the prefix, sorted as dir() sorts
    tensors: frozenset[str]  # the names that hold tensors (they have a `_raw_saved_*` twin)
    # (name, attribute to read, is a tensor): `_raw_saved_x` for tensors, else `_saved_x`
    reads: tuple[tuple[str, str, bool], ...] = ()
    # `_saved_x` per entry of `reads` (the unpacked value, read when a tensor was not saved)
    unpacked: tuple[str, ...] = ()


_CLASS_INFO: dict[type, _ClassInfo] = {}
_CUSTOM_BASE = torchcompat.CUSTOM_BASE


#: Set once a compiled region's node class has been seen (a cache private to this file): until
#: then ``trace`` does not look for regions among the walked nodes (a plain graph pays nothing).
_REGIONS_SEEN = False


def _class_info(cls: type) -> _ClassInfo:
    info = _CLASS_INFO.get(cls)
    if info is None:
        global _REGIONS_SEEN
        if cls.__name__ == compiled.REGION_NODE:
            _REGIONS_SEEN = True
        names = dir(cls)
        if issubclass(cls, _CUSTOM_BASE):
            kind = "custom"
        elif cls.__name__ == "AccumulateGrad":
            kind = "accumulate"
        else:
            kind = "op"
        saved = tuple(a[len(_SAVED):] for a in names if a.startswith(_SAVED))
        tensors = frozenset(a[len(_RAW):] for a in names if a.startswith(_RAW))
        reads = tuple(
            (n, (_RAW if n in tensors else _SAVED) + n, n in tensors) for n in saved
        )
        info = _ClassInfo(kind, saved, tensors, reads, tuple(_SAVED + n for n in saved))
        _CLASS_INFO[cls] = info
    return info


def _class_entry(
    cls: type,
) -> tuple[str, str, bool, bool, tuple[tuple[str, str, bool], ...], tuple[str, ...]]:
    """What the compiled walk keeps per autograd node class (it caches the tuple): the class
    name, the node kind, whether the class is AccumulateGrad, whether it is a custom Function's
    node, and the saved fields to read (``_ClassInfo.reads`` and ``.unpacked``)."""
    info = _class_info(cls)
    kind = info.kind
    return cls.__name__, kind, kind == "accumulate", kind == "custom", info.reads, info.unpacked


_DTYPE_NAMES: dict[torch.dtype, str] = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype).removeprefix("torch.")
    return name


#: The ``Node`` fields the compiled walk fills itself; the fields after them get their defaults.
_NODE_FILLED = ("id", "name", "kind", "module", "attrs", "saved", "tensor", "order")


def _node_defaults() -> tuple[Any, ...]:
    """The defaults of ``Node``'s fields past ``_NODE_FILLED``: immutable values the compiled
    walk may share between nodes (a field with a default factory needs C code of its own)."""
    out = []
    for f in fields(Node)[len(_NODE_FILLED):]:
        if f.default is MISSING or not isinstance(f.default, (type(None), bool, int, float, str)):
            raise RuntimeError(
                f"Node.{f.name} needs an immutable default for the compiled walk "
                "(gradscope/graph/_cwalk.c fills only the first fields)"
            )
        out.append(f.default)
    return tuple(out)


def _load_cwalk() -> Any:
    """The compiled walk (``gradscope/graph/_cwalk.c``), configured; None when the build
    skipped it (no C compiler) or ``GRADSCOPE_PURE_PYTHON=1`` asks for the Python walker."""
    if os.environ.get("GRADSCOPE_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from . import _cwalk
    except ImportError:
        return None
    layouts: list[Any] = []
    for cls in (Node, Edge, TensorInfo, SavedTensor):
        layouts += [cls, tuple(f.name for f in fields(cls))]
        if cls is Node:
            layouts.append(_node_defaults())
    # raises if a dataclass's fields no longer match what the C code fills
    _cwalk.configure(
        *layouts, _class_entry, _DTYPE_NAMES, _dtype_name, torch.Tensor, _storage_key
    )
    return _cwalk


#: The compiled walk, or None for the pure-Python one (tests switch it to compare the two).
CWALK = _load_cwalk()


def _param_names(params: Any) -> dict[int, str]:
    if params is None:
        return {}
    if isinstance(params, torch.nn.Module):
        # a torch.compile wrapper names its parameters as its module does (no `_orig_mod.`)
        return {id(p): dynamo.plain_name(name) for name, p in params.named_parameters()}
    if isinstance(params, Mapping):
        # a dict of str -> tensor (every parameter of a big model: the common case, on every
        # trace) in one pass of C; anything else (or no compiled walk) below
        if CWALK is not None:
            found = CWALK.param_names(params)
            if found is not None:
                return found
        # map() keeps the per-entry work in C
        if not all(issubclass(t, torch.Tensor) for t in set(map(type, params.values()))):
            name, p = next((k, v) for k, v in params.items() if not isinstance(v, torch.Tensor))
            raise GradscopeError(
                f"params[{name!r}] is a {type(p).__name__}, not a tensor; pass a dict of "
                "name -> tensor, or the nn.Module itself (params=model)"
            )
        return dict(zip(map(id, params.values()), map(str, params.keys())))
    raise GradscopeError(
        f"params must be a dict of name -> tensor or an nn.Module, got {type(params).__name__}; "
        "try params=dict(model.named_parameters())"
    )


class _Walker:
    """One walk. Hot loops bind attributes to locals: this code runs once per autograd node."""

    def __init__(
        self, names: dict[int, str], saved: bool, read_modules: bool, regions: bool = False
    ) -> None:
        self.names = names
        self.want_saved = saved
        self.regions = regions  # compiled regions are expanded: capture/regions reads them
        self.read_modules = read_modules
        self.storages = _Storages()
        self.nodes: list[Node] = []
        self.ids: dict[Any, str] = {}  # grad_fn object -> node id (the dict keeps them alive)
        self.tensor_ids: dict[int, str] = {}  # id(tensor) -> node id for output/base tensors
        self.keep: list[torch.Tensor] = []  # keeps those tensors alive so id() stays unique
        # in src order: (src id, dst grad_fn or dst id, input_nr) tuples, and (compiled walk)
        # finished Edges; `finish` turns the tuples into Edges
        self.raw_edges: list[Any] = []
        self.view_edges: list[Edge] = []

    def new_id(self) -> str:
        return "n%d" % len(self.nodes)

    # -------------------------------------------------------------- tensors
    def tensor_info(self, t: torch.Tensor, name: str | None) -> TensorInfo:
        return TensorInfo(
            name=name,
            shape=_shape(t),
            dtype=_dtype_name(t.dtype),
            device="cpu" if t.is_cpu else str(t.device),
            # storage ids serve memory accounting, which needs saved tensors too
            storage=self.storages.id_of(t) if self.want_saved else None,
        )

    def saved_record(self, name: str, t: torch.Tensor) -> SavedTensor:
        sid, size = self.storages.record_of(t)
        dtype = _DTYPE_NAMES.get(t.dtype) or _dtype_name(t.dtype)
        return SavedTensor(
            name,
            _shape(t),
            dtype,
            "cpu" if t.is_cpu else str(t.device),
            _nbytes(t),
            sid,
            False,
            size,
        )

    # -------------------------------------------------------------- roots
    def add_output(self, path: str, t: torch.Tensor) -> None:
        """Add an output tensor (and, if it is a view, its base) and walk its graph."""
        chain: list[tuple[torch.Tensor, str, bool]] = [(t, path, False)]
        prev: str | None = None
        while chain:
            tensor, name, is_base = chain.pop()
            known = self.tensor_ids.get(id(tensor))
            if known is not None:
                if prev is not None:
                    self.view_edges.append(Edge(prev, known, 0, "view"))
                break
            nid = self.new_id()
            label = self.names.get(id(tensor), name)
            node = Node(nid, label, "output", tensor=self.tensor_info(tensor, label))
            if is_base:
                node.view_base = True
            self.nodes.append(node)
            self.tensor_ids[id(tensor)] = nid
            self.keep.append(tensor)
            if prev is not None:
                self.view_edges.append(Edge(prev, nid, 0, "view"))
            if tensor.grad_fn is not None:
                self.raw_edges.append((nid, tensor.grad_fn, 0))
                self.walk(tensor.grad_fn)
            if tensor._is_view() and tensor._base is not None:
                chain.append((tensor._base, f"{name}._base", True))
            prev = nid

    # -------------------------------------------------------------- the walk
    def walk(self, start: Any) -> None:
        """Depth-first preorder from ``start``; ids are given when a node is first popped."""
        if CWALK is not None:
            # everything the compiled walk works on or falls back to, by name
            CWALK.walk(
                start,
                nodes=self.nodes,
                ids=self.ids,
                raw_edges=self.raw_edges,
                names=self.names,
                storage_ids=self.storages.by_key,
                want_saved=self.want_saved,
                read_modules=self.read_modules,
                record_of=self.storages.record_of,
                visit_modules=self.visit_modules,
                custom_saved=self.custom_saved,
                read_saved=self.read_saved,
                read_saved_seq=self.read_saved_seq,
                saved_record=self.saved_record,
                shape_of=self.shape_of,
            )
        else:
            self.walk_py(start)

    def visit_modules(self, fn: Any, node: Node) -> None:
        """The module path ``gs.scopes`` stamped into the node's metadata."""
        meta = fn.metadata
        node.module = meta.get(MODULE_KEY)
        classes = meta.get(MODULE_CLASSES_KEY)
        if classes is not None:
            node.module_classes = tuple(classes.split("/"))

    def walk_py(self, start: Any) -> None:
        """The pure-Python walk (the reference the compiled one is tested against)."""
        ids = self.ids
        nodes = self.nodes
        stack = [start]
        pop, push = stack.pop, stack.append
        add_node, add_edge = nodes.append, self.raw_edges.append
        infos = _CLASS_INFO
        want_saved, read_modules = self.want_saved, self.read_modules
        node_cls = Node
        while stack:
            fn = pop()
            if fn in ids:
                continue
            nid = "n%d" % len(nodes)
            ids[fn] = nid
            cls = type(fn)
            info = infos.get(cls) or _class_info(cls)
            node = node_cls(nid, cls.__name__, info.kind)
            add_node(node)
            if read_modules:
                self.visit_modules(fn, node)
            if want_saved:
                if info.kind == "custom":
                    self.custom_saved(fn, node)
                elif info.saved:
                    self.builtin_saved(fn, info, node)
            if info.kind == "accumulate":
                self.add_leaf(nid, fn)
            nf = fn.next_functions
            if nf:
                k = 0
                for nxt, _ in nf:
                    if nxt is not None:
                        add_edge((nid, nxt, k))
                    k += 1
                for i in range(len(nf) - 1, -1, -1):
                    nxt = nf[i][0]
                    if nxt is not None and nxt not in ids:
                        push(nxt)

    def add_leaf(self, acc_id: str, fn: Any) -> None:
        var = fn.variable
        lid = self.new_id()
        name = self.names.get(id(var), "")
        self.nodes.append(Node(lid, name, "leaf", tensor=self.tensor_info(var, name or None)))
        self.raw_edges.append((acc_id, lid, 0))

    # Saved tensors are read through their `SavedTensor` handles (`_raw_saved_*`, `.data`)
    # rather than by unpacking them (`_saved_*`): unpacking runs saved_tensors_hooks' unpack
    # hooks, and for torch.utils.checkpoint that recomputes the forward. Reading `.data` has
    # no side effects and is cheaper.
    def builtin_saved(self, fn: Any, info: _ClassInfo, node: Node) -> None:
        attrs, saved = node.attrs, node.saved
        record, tensor_type = self.saved_record, torch.Tensor
        for name, attr, is_tensor in info.reads:
            if not is_tensor:
                attrs[name] = str(getattr(fn, attr))
                continue
            try:
                raw = getattr(fn, attr)
            except RuntimeError:
                # a saved list (`indices` of x[idx], index_put...) that backward freed: torch
                # raises instead of handing out its entries, and keeps neither count nor sizes
                self.read_saved_seq(fn, name, None, node)
                continue
            if isinstance(raw, (list, tuple)):
                self.read_saved_seq(fn, name, raw, node)
                continue
            data = raw.data
            if isinstance(data, tensor_type):  # the common case, inline
                saved.append(record(name, data))
            else:
                self.read_saved(fn, name, None, raw, node)

    #: ``_shape`` for the compiled walk, which calls it for shapes that are not plain ints
    shape_of = staticmethod(_shape)

    def read_saved_seq(self, fn: Any, name: str, raws: Any, node: Node) -> None:
        """A saved list of (optional) tensors (``_raw_saved_indices`` of ``x[idx]``...); None
        when reading it raised because backward freed it: one freed record stands for the
        list, as torch no longer says how many entries it had."""
        if raws is None:
            node.saved.append(SavedTensor(name, None, None, None, 0, None, freed=True))
            return
        if not raws:
            node.attrs[name] = "()"
        for i, r in enumerate(raws):
            self.read_saved(fn, name, i, r, node)

    def read_saved(self, fn: Any, name: str, index: int | None, raw: Any, node: Node) -> None:
        label = name if index is None else f"{name}[{index}]"
        data = raw.data
        if isinstance(data, torch.Tensor):
            node.saved.append(self.saved_record(label, data))
            return
        if data is not None:  # packed by a saved_tensors_hooks pack hook (e.g. checkpoint)
            node.saved.append(
                SavedTensor(label, self.saved_shape(fn, name, index), None, None, 0, None)
            )
            node.attrs[f"{label}.packed"] = (
                f"held as {type(data).__name__} by a saved_tensors_hooks pack hook, not as a tensor"
            )
            return
        # No data: backward freed it, or it is an optional tensor that was never saved.
        try:
            val = getattr(fn, _SAVED + name)
        except RuntimeError:
            shape = self.saved_shape(fn, name, index)
            node.saved.append(SavedTensor(label, shape, None, None, 0, None, freed=True))
            return
        if index is None:
            node.attrs[label] = str(val)

    @staticmethod
    def saved_shape(fn: Any, name: str, index: int | None) -> list[int | None] | None:
        """The shape torch keeps as `<name>_sym_sizes` (it survives backward), if any."""
        if index is not None:
            return None
        try:
            return [_dim(s) for s in getattr(fn, f"{_SAVED}{name}_sym_sizes")]
        except (AttributeError, RuntimeError, TypeError, ValueError):
            return None

    def custom_saved(self, fn: Any, node: Node) -> None:
        if (self.regions and type(fn).__name__ == compiled.REGION_NODE
                and not compiled.read_region(fn).opaque):
            return  # capture/regions reads them, under the names its backward graph gives them
        self.function_saved(fn, node)

    def function_saved(self, fn: Any, node: Node) -> None:
        """A custom Function's saved tensors and ``ctx`` attributes."""
        try:
            raws = fn._raw_saved_tensors
        except RuntimeError:  # freed by backward: torch no longer knows what there was
            node.saved.append(SavedTensor("saved_tensors", None, None, None, 0, None, freed=True))
            raws = ()
        for i, raw in enumerate(raws):
            data = raw.data
            if isinstance(data, torch.Tensor):
                node.saved.append(self.saved_record(f"saved_tensors[{i}]", data))
            elif data is not None:
                self.read_saved(fn, "saved_tensors", i, raw, node)
            # data None: the Function saved None; nothing is held
        # Attributes the user's forward set on ctx (ctx.clip_val = ...). Tensors stored on ctx
        # instead of save_for_backward are held by the graph too, so they are counted as saved.
        for key, val in sorted(getattr(fn, "__dict__", {}).items()):
            if key.startswith("_"):
                continue
            if isinstance(val, torch.Tensor):
                node.saved.append(self.saved_record(f"ctx.{key}", val))
            else:
                node.attrs[key] = str(val)

    def finish(self, roots: list[str]) -> Graph:
        if CWALK is not None:
            edges = CWALK.make_edges(self.raw_edges, self.ids)
        else:
            get = self.ids.get
            edges = [Edge(src, get(dst) or dst, k) for src, dst, k in self.raw_edges]
        if self.view_edges:  # rare: merge them in src order (grad edges first)
            order = {n.id: i for i, n in enumerate(self.nodes)}
            edges.extend(self.view_edges)
            edges.sort(key=lambda e: (order[e.src], e.kind != "grad"))
        return Graph(nodes=self.nodes, edges=edges, roots=roots)


def trace(
    outputs: Any,
    params: Any = None,
    *,
    saved: bool = True,
    model: Any = None,
    regions: bool = True,
    inputs: Any = None,
) -> Graph:
    """Walk the autograd graph behind ``outputs`` into a plain-data ``Graph``.

    Args:
        outputs: a tensor, or any nest (tuple/list/dict/dataclass/namedtuple/``ModelOutput``)
            of tensors. Other values in the nest (None, numbers, caches) are skipped, and so are
            tensors that do not require grad.
        params: names for leaf tensors: a dict of name -> tensor, or an ``nn.Module`` whose
            ``named_parameters()`` are used.
        saved: record saved tensors and non-tensor attributes of every node (set False for the
            fastest walk when only the structure is needed).
        model: an ``nn.Module``; its parameter names label the leaves (like ``params=model``),
            and module paths recorded by ``gs.scopes(model)`` (or ``gs.saved_memory(model)``)
            during the forward are read into ``Node.module``. Without ``model`` no module path
            is read.
        regions: expand each ``torch.compile`` region (a ``CompiledFunctionBackward`` node)
            into the aten ops of the AOTAutograd backward graph it runs, as a cluster
            ``<compiled>`` (see ``gradscope.graph.regions``); False keeps it one node, as
            torchviz draws it.
        inputs: what the forward was given (any nest of tensors). Saved tensors on the storage
            of an input, or of a parameter or buffer of ``model`` (BatchNorm's running
            statistics), are marked ``SavedTensor.alias = "leaf"``: alive without the graph,
            ``Graph.memory()`` counts them with the parameters/inputs, not as activations.

    Returns:
        The graph, with stable ids ``n0, n1, ...`` in walk order (depth first from each output).

    Raises:
        NoGradError: when no tensor in ``outputs`` has an autograd graph.

    Example:
        >>> import torch, gradscope as gs
        >>> lin = torch.nn.Linear(3, 2)
        >>> g = gs.trace(lin(torch.randn(4, 3)), params=lin)
        >>> sorted(n.name for n in g.nodes if n.kind == "leaf")
        ['bias', 'weight']
    """
    return trace_with_ids(
        outputs, params, saved=saved, model=model, regions=regions, inputs=inputs
    )[0]


def trace_with_ids(
    outputs: Any,
    params: Any = None,
    *,
    saved: bool = True,
    model: Any = None,
    regions: bool = True,
    inputs: Any = None,
) -> tuple[Graph, dict[Any, str]]:
    """``trace``, also returning its map from each live ``grad_fn`` to its node id, so that
    ``gs.record_backward`` can hook the very nodes it drew. The map holds the nodes alive:
    drop it when done."""
    names = _param_names(params)  # a new dict: a copy only when a model names leaves too
    if model is not None:
        names = {**_param_names(model), **names}
    found = list(iter_tensors(outputs))
    with_grad = [(p, t) for p, t in found if t.requires_grad]
    if not with_grad:
        if found:
            which = ("the output tensor does not require" if len(found) == 1
                     else f"none of the {len(found)} output tensors requires")
            raise NoGradError(
                f"{which} grad, so there is no autograd graph to walk; did the forward run "
                "under torch.no_grad() or inference_mode(), or on parameters with "
                "requires_grad=False?"
            )
        raise NoGradError(
            f"found no tensor in the outputs (got {type(outputs).__name__}); pass a tensor or a "
            "tuple/list/dict/dataclass of tensors"
        )
    # module stamps are read only for a model: ``grad_fn.metadata`` allocates a dict on every
    # node it is read from, which would cost a plain walk a third of its time
    walker = _Walker(names, saved, model is not None, regions)
    roots: list[str] = []
    # a few objects per node, none freed: the collector's passes over that growing heap cost
    # a 100,000-node chain 2.5x (model/gcpause.py)
    with collector_paused():
        for path, t in with_grad:
            if id(t) in walker.tensor_ids:
                nid = walker.tensor_ids[id(t)]
            else:
                nid = walker.new_id()
                walker.add_output(path, t)
            if nid not in roots:
                roots.append(nid)
        graph = walker.finish(roots)
        if regions and _REGIONS_SEEN:
            from . import regions as _regions

            region_nodes = _regions.find(walker.ids)
            if region_nodes:
                _regions.expand(graph, region_nodes, walker, model)
        if saved and (model is not None or inputs is not None):
            _mark_held(graph, walker.storages, model, inputs)
        return graph, walker.ids


def _mark_held(graph: Graph, storages: _Storages, model: Any, inputs: Any) -> None:
    """Mark the saved tensors on a storage of ``model``'s parameters and buffers or of
    ``inputs`` as ``leaf`` aliases: they are alive without the graph, as ``activation_report``
    counts them. Only storages the walk saw are looked up (``storages.by_key``)."""
    tensors = [t for _, t in iter_tensors(inputs)]
    if isinstance(model, torch.nn.Module):
        tensors += model.parameters()
        tensors += model.buffers()
    by_key = storages.by_key
    held: set[str] = set()
    for t in tensors:
        try:
            found = by_key.get(_storage_key(t))
        except (RuntimeError, NotImplementedError, AttributeError):
            continue  # no storage (sparse, nested...): nothing saved can share it
        if found is not None:
            held.add(found[0])
    if held:
        for node in graph.nodes:
            for s in node.saved:
                if s.storage in held:
                    s.alias = "leaf"
