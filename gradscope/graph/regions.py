"""Compiled regions in a traced graph: each ``CompiledFunctionBackward`` becomes a cluster.

``torch.compile`` turns a stretch of the forward into one autograd node whose backward runs an
AOTAutograd backward graph. ``expand`` (run by ``gs.trace`` after the walk) replaces that opaque
node's edges by the graph it runs, read by ``compiled.read_region``:

- the region node itself (kind ``custom``, ``CompiledFunctionBackward``) stays: it is the node
  the engine runs and the recorders hook, and where the gradients enter. It gets ``compiled``
  (a ``Region`` record) and ``region`` (its own id);
- one node of kind ``op`` per aten op, named as the op (``aten.mm.default``), with ``region``
  set to the region node's id, its non-tensor arguments in ``attrs``, its forward line in
  ``created_at`` and the activations it reads from the forward as ``saved`` (each on the first
  op that reads it, named as the backward graph names it: ``relu``, ``primals_3``);
- module paths put the region in the module tree like a module: ``<compiled>`` (``#k`` for the
  k-th region of one scope) below the scope whose forward ran the compiled code
  (``blocks.0.<compiled>``), and each op below it at the path of the module it belongs to
  (``blocks.0.<compiled>.attn``), from the FX ``nn_module_stack``. So regions are clusters,
  and ``--depth``/``collapse`` fold a region into one box as they fold a module.

Edges keep their meaning (the gradient flows ``src`` -> ``dst``); for the region's boundary
``input_nr`` says which gradient: on an edge from the region node into the region, the index of
the node's ``grad_outputs`` (the tangent); on an edge leaving the region, the slot of the
node's ``next_functions`` that gradient is for; inside, which output of the producing op.
An op that no gradient reaches (it reads only activations the forward saved, like the
transposed weight of a linear layer, or makes a constant) hangs off the region node by an edge
of kind ``saved``, so every node stays reachable from the roots.
A region gradscope cannot read stays one opaque node with its note (``Region.note``).
"""

from __future__ import annotations

from typing import Any

import torch

from .._torch import dynamo, torchcompat
from ..backward.forward import location_text
from . import compiled
from .graph import (
    Edge,
    Graph,
    Node,
    Region,
    SavedTensor,
)
from .paths import levels, strip_calls


def find(ids: dict[Any, str]) -> list[tuple[Any, str]]:
    """The region nodes among a walk's ``grad_fn -> id`` map, in id order."""
    found = [(fn, nid) for fn, nid in ids.items() if type(fn).__name__ == compiled.REGION_NODE]
    found.sort(key=lambda item: int(item[1][1:]))
    return found


def expand(graph: Graph, regions: list[tuple[Any, str]], walker: Any, model: Any) -> None:
    """Expand every region node of ``graph`` (see the module docstring), in place."""
    names = _Names(model)
    seen_in_scope: dict[str | None, int] = {}
    outgoing: dict[str, list[Edge]] = {nid: [] for _, nid in regions}
    keep: list[Edge] = []
    for e in graph.edges:
        if e.src in outgoing and e.kind == "grad":
            outgoing[e.src].append(e)
        else:
            keep.append(e)
    added: list[Edge] = []
    expanded: set[str] = set()
    for fn, nid in regions:
        region = compiled.read_region(fn)
        node = graph.node(nid)
        node.compiled = Region(region.aot_id, len(region.ops), region.note)
        if region.opaque:  # drawn as a custom Function (the walk read its saved tensors)
            continue
        scope = node.module
        k = seen_in_scope.get(scope, 0)
        seen_in_scope[scope] = k + 1
        part = compiled.REGION_PART + (f"#{k}" if k else "")
        path = f"{scope}.{part}" if scope else part
        builder = _Builder(graph, node, region, path, names, walker)
        added.extend(builder.build(fn, outgoing[nid]))
        expanded.add(nid)
    if not expanded:
        return  # opaque regions only: the edges stay exactly as the walk made them
    graph.edges = keep + added + [e for nid in outgoing if nid not in expanded
                                  for e in outgoing[nid]]
    order = {n.id: i for i, n in enumerate(graph.nodes)}
    graph.edges.sort(key=lambda e: (order[e.src], e.kind != "grad"))


class _Names:
    """``str(id(module))`` -> its plain name in ``model`` (the key FX's module stacks use),
    built the first time a region needs it (most never do)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.names: dict[str, str] | None = None

    def get(self, key: str) -> str | None:
        if self.model is None:
            return None
        if self.names is None:
            self.names = {
                str(id(mod)): dynamo.plain_name(name)
                for name, mod in self.model.named_modules(remove_duplicate=False)
            }
        return self.names.get(key)


class _Builder:
    """Builds one region's nodes and edges."""

    def __init__(self, graph: Graph, node: Node, region: compiled.RegionGraph, path: str,
                 names: _Names, walker: Any) -> None:
        self.graph = graph
        self.node = node
        self.region = region
        self.path = path
        self.names = names
        self.walker = walker
        scope = node.module
        self.scope = strip_calls(scope) if scope else ""
        outer = node.module_classes
        if outer is None:
            outer = ("",) + ("",) * len(levels(scope or ""))
        self.outer_classes = (*outer, compiled.REGION_CLASS)
        self.placed: dict[tuple[Any, ...], tuple[str, tuple[str, ...]]] = {}

    def build(self, fn: Any, outgoing: list[Edge]) -> list[Edge]:
        graph, node, region = self.graph, self.node, self.region
        node.module = self.path
        node.module_classes = self.outer_classes
        node.region = node.id
        want_saved = self.walker.want_saved
        ids = []
        base = len(graph.nodes)
        for i, op in enumerate(region.ops):
            path, classes = self.place(op)
            ids.append("n%d" % (base + i))
            graph.nodes.append(Node(
                ids[-1], op.name, "op", module=path,
                attrs=dict(op.attrs) if want_saved else {},
                module_classes=classes,
                created_at=location_text(*op.location) if op.location else None,
                region=node.id,
            ))
        if want_saved:
            self.attach_saved(fn, ids)
        edges: list[Edge] = []
        entered: set[tuple[str, int]] = set()
        for i, op in enumerate(region.ops):
            for ref in op.inputs:
                if ref.kind == "op":
                    edges.append(Edge(ids[ref.index], ids[i], ref.slot))
                elif ref.kind == "tangent":
                    slot = region.tangents[ref.index][1]
                    if (ids[i], slot) not in entered:
                        entered.add((ids[i], slot))
                        edges.append(Edge(node.id, ids[i], slot))
        # an op no gradient reaches (it reads only saved activations, or makes a constant)
        # hangs off the region node by a "saved" edge, so every node is reachable from a root
        fed = {e.dst for e in edges}
        for i in range(len(region.ops)):
            if ids[i] not in fed:
                edges.append(Edge(node.id, ids[i], 0, "saved"))
        for e in outgoing:  # one edge per next_functions slot, as autograd holds them
            out = region.outputs[e.input_nr] if e.input_nr < len(region.outputs) else None
            if out is None:  # the graph returns no gradient there: the edge stays the node's
                edges.append(e)
            else:
                src = ids[out.index] if out.kind == "op" else node.id
                edges.append(Edge(src, e.dst, e.input_nr))
        return edges

    def place(self, op: compiled.RegionOp) -> tuple[str, tuple[str, ...]]:
        """The op's module path (below the region's) and the class names along it (the ops
        of one module share a stack: computed once per stack)."""
        hit = self.placed.get(op.modules)
        if hit is None:
            hit = self.placed[op.modules] = self._place(op)
        return hit

    def _place(self, op: compiled.RegionOp) -> tuple[str, tuple[str, ...]]:
        rel_of = {}  # rel path of each module on the op's stack -> its class
        for key, dpath, cls in op.modules:
            rel_of[self.relative(key, dpath)] = cls
        rel = self.relative(*op.modules[-1][:2]) if op.modules else ""
        path = f"{self.path}.{rel}" if rel else self.path
        classes = list(self.outer_classes)
        lv = levels(rel)
        for d in range(len(lv)):
            classes.append(rel_of.get(".".join(lv[: d + 1]), ""))
        return path, tuple(classes)

    def relative(self, key: str, dpath: str) -> str:
        """A module of the op's stack, relative to the region's scope. Dynamo's own source of
        the module comes first: one compiled graph may serve several modules of one class
        (the blocks of a model compiled one by one), and only the first one's ids are in the
        graph's metadata. A module the compiled code reached through another variable (a
        model called by a compiled function) is named by the model passed to ``trace``."""
        rel = compiled.compiled_relative(dpath)
        if rel is not None:
            return rel
        name = self.names.get(key)
        if name is None:
            return compiled.dynamo_path(dpath)
        scope = self.scope
        if not scope:
            return name
        if name == scope:
            return ""
        if name.startswith(scope + "."):
            return name[len(scope) + 1:]
        return name

    def attach_saved(self, fn: Any, ids: list[str]) -> None:
        """Each saved activation on the first op that reads it (the region node otherwise)."""
        live = _saved_tensors(fn)
        first_reader: dict[int, int] = {}
        for i, op in enumerate(self.region.ops):
            for ref in op.inputs:
                if ref.kind == "saved":
                    first_reader.setdefault(ref.index, i)
        record = self.walker.saved_record
        graph = self.graph
        for k, slot in enumerate(self.region.saved):
            t = live[k] if live is not None and k < len(live) else None
            if isinstance(t, torch.Tensor):
                saved = record(slot.name, t)
            else:
                saved = SavedTensor(slot.name, slot.shape, slot.dtype, None, 0, None, freed=True)
            reader = first_reader.get(k)
            owner = graph.node(ids[reader]) if reader is not None else self.node
            owner.saved.append(saved)


def _saved_tensors(fn: Any) -> list[Any] | None:
    """The tensors a region node holds, in the order its backward graph takes them (None once
    backward freed them). Read through the ``SavedVariable`` handles: no unpack hook runs."""
    try:
        return torchcompat.region_raw_saved(fn)
    except RuntimeError:
        return None


# ---------------------------------------------------------------------------- the recorder
class Watch:
    """What ``record_backward`` keeps of compiled regions to name the aten op behind a NaN/Inf.

    A pre-hook on each expanded region node holds what the node is about to use (its saved
    activations, symints, and the gradients it received: references, no copies) until its
    post-hook sees whether the gradients it returned are finite; only a region that returned
    a NaN/Inf keeps them, and only the first bad one is re-run (``locate``) when the block ends.
    """

    def __init__(self, fns: dict[str, Any]) -> None:
        self.fns = fns  # region node id -> its live CompiledFunctionBackward
        self.pending: dict[str, tuple[Any, list[Any]]] = {}
        self.kept: dict[str, tuple[Any, list[Any]]] = {}

    def install(self, handle: Any) -> None:
        for nid, fn in self.fns.items():
            handle.add(fn.register_prehook(self._pre(nid, fn)))
            handle.add(fn.register_hook(self._post(nid)))
        handle.add(self.pending.clear)

    def _pre(self, nid: str, fn: Any) -> Any:
        def hook(grad_outputs: Any) -> None:
            if nid not in self.kept:
                self.pending[nid] = (compiled.capture_inputs(fn), list(grad_outputs))
            return None

        return hook

    def _post(self, nid: str) -> Any:
        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            entry = self.pending.pop(nid, None)
            if entry is not None and entry[0] is not None and _any_nonfinite(grad_inputs):
                self.kept.setdefault(nid, entry)
            return None

        return hook

    def locate(self, graph: Graph, nid: str) -> tuple[Node, str] | None:
        """The aten op node inside region ``nid`` that first produced its NaN/Inf, with the
        kind, by re-running the region's backward graph on what the node received."""
        entry = self.kept.get(nid)
        fn = self.fns.get(nid)
        if entry is None or fn is None:
            return None
        inputs, grads = entry
        found = compiled.first_nonfinite_op(fn._forward_cls, inputs, grads)
        if found is None:
            return None
        index, kind = found
        members = [n for n in graph.nodes if n.region == nid and n.id != nid]
        return (members[index], kind) if index < len(members) else None

    def clear(self) -> None:
        self.pending.clear()
        self.kept.clear()
        self.fns = {}


def _any_nonfinite(grads: Any) -> bool:
    for g in grads:
        if isinstance(g, torch.Tensor) and (g.is_floating_point() or g.is_complex()):
            if not bool(torch.isfinite(g).all()):
                return True
    return False
