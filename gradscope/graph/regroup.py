"""Regrouping a graph: each group of nodes replaced by one node of kind ``module`` (a box),
the edges between groups merged. ``collapse``, ``fold`` and ``nearest`` are built on it.

A box's ``Box`` has its module's class name, how many original nodes it stands for and the
bytes of its saved tensors (each storage counted once; the part that aliases
parameters/inputs and outputs apart from activations); its ``saved`` keeps the members'
saved-tensor records, so ``Graph.saved_bytes()`` and the total node count are the same before
and after. Edges between groups are merged into one ``Edge`` whose ``count`` says how many it
stands for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from .nodes import (
    Box,
    Edge,
    GraphLike,
    Node,
    SavedTensor,
    storage_sizes,
)
from .paths import inside, levels, module_class


class _GraphClass(GraphLike, Protocol):
    """A graph that its class builds from the three lists (``Graph(nodes, edges, roots)``)."""

    def __init__(self, nodes: list[Node], edges: list[Edge], roots: list[str]) -> None: ...


#: A graph type: the views return graphs of the class they were given (``Graph``).
G = TypeVar("G", bound=_GraphClass)


_KIND_INDEX = {"leaf": 1, "output": 2}


def _box(
    nid: str,
    name: str,
    path: str,
    members: list[Node],
    repeat: int | None = None,
    kinds: dict[str, str] | None = None,
) -> Node:
    """A module node standing for ``members``; ``kinds`` (``alias_kinds`` of the whole graph)
    splits its saved bytes into activations and aliases of leaves and outputs."""
    saved = [
        SavedTensor(f"{m.name}.{s.name}" if m.kind != "module" else s.name, s.shape, s.dtype,
                    s.device, s.nbytes, s.storage, s.freed, s.storage_nbytes)
        for m in members
        for s in m.saved
    ]
    kinds = kinds or {}
    sizes = storage_sizes([Node("", "", "op", saved=saved)])
    split = [0, 0, 0]
    for sid, size in sizes.items():
        split[_KIND_INDEX.get(kinds.get(sid, ""), 0)] += size
    box = Box(
        module_class(path, members),
        sum(m.count for m in members),
        sum(sizes.values()),
        repeat,
        leaf_bytes=split[1],
        output_bytes=split[2],
        aliases={sid: kinds[sid] for sid in sizes if sid in kinds},
    )
    return Node(
        nid, name, "module", module=path, saved=saved, module_classes=_chain_prefix(path, members),
        box=box,
    )


def _chain_prefix(path: str, members: list[Node]) -> tuple[str, ...] | None:
    """The ``module_classes`` chain of ``path`` itself, cut from a member's longer chain."""
    want = len(levels(path))
    for n in members:
        chain = n.module_classes
        if chain and inside(n.module, path) and len(chain) > want:
            return chain[: want + 1]
    return None


def _regroup(
    graph: G, key_of: dict[str, str], make: Callable[[str, str, list[Node]], Node]
) -> G:
    """Replace each set of nodes sharing a key by ``make(id, key, members)``; merge edges."""
    members: dict[str, list[Node]] = {}
    for n in graph.nodes:
        key = key_of.get(n.id)
        if key is not None:
            members.setdefault(key, []).append(n)
    new_id: dict[str, str] = {}
    nodes: list[Node] = []
    boxes: dict[str, str] = {}
    for n in graph.nodes:
        key = key_of.get(n.id)
        if key is None:
            nodes.append(n)
            new_id[n.id] = n.id
            continue
        if key not in boxes:
            group = members[key]
            only = group[0]
            box = only if len(group) == 1 and only.kind == "module" and only.module == key else None
            box = box or make(f"m{len(boxes)}", key, group)
            boxes[key] = box.id
            nodes.append(box)
        new_id[n.id] = boxes[key]
    edges = _merge_edges(graph.edges, new_id)
    # the input's own class (a Graph): this module never imports Graph, which imports it
    return type(graph)(nodes=nodes, edges=edges, roots=_dedup(new_id[r] for r in graph.roots))


def _merge_edges(edges: list[Edge], new_id: dict[str, str]) -> list[Edge]:
    merged: dict[tuple[str, str, str], Edge] = {}
    for e in edges:
        src, dst = new_id[e.src], new_id[e.dst]
        if src == dst:
            continue  # inside one group
        if src == e.src and dst == e.dst:
            merged.setdefault((src, dst, f"{e.kind}:{e.input_nr}"), e)
            continue
        key = (src, dst, e.kind)
        old = merged.get(key)
        if old is None:
            merged[key] = Edge(src, dst, e.input_nr, e.kind, e.grad_norm, e.count)
        else:  # one norm stands for one edge only: a merged edge has none
            merged[key] = Edge(src, dst, old.input_nr, e.kind, None, old.count + e.count)
    return list(merged.values())


def _dedup(ids: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(ids))
