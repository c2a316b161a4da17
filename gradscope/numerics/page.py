"""``gs.trace_divergence``: a ``Divergence`` drawn on the candidate's autograd graph (capture).

The link between the records and the graph is the autograd node: each op record names the
node it belongs to (``OpRecord.node``, ``OpRecord.seq``: the node's ``_sequence_nr()``, unique
per thread in a process), and ``gs.trace`` walks those very nodes, so the walk's map from each
live ``grad_fn`` to its node id (``graph.walk.trace_with_ids``) gives each sequence number its
node. A node draws the points of the ops its forward made and its backward ran (both phases),
and a leaf the points of its parameter's gradient and of its values (``input``); the node's
error is their largest.

What has no node: an op whose output needs no gradient (under ``torch.no_grad``, the inputs'
own preprocessing), the ops inside a custom Function's forward and inside a compiled region's
forward (they run without autograd), a gradient accumulated by AccumulateGrad (drawn by its
parameter's leaf instead), and any input that needs no gradient. They count as ``unmapped``.
A compiled region's backward ops all belong to its one ``CompiledFunctionBackward`` node, which
draws the worst of them; the aten ops ``gs.trace`` draws inside the region have no records.
"""

from __future__ import annotations

import math
from typing import Any

from .._torch.stamps import NO_SEQUENCE_NR
from ..graph.graph import Graph
from ..graph.walk import trace_with_ids
from .records import (
    Divergence,
    DivergenceGraph,
    DivergenceMarks,
    DivergencePoint,
    NodeError,
)


def _key(x: float) -> float:
    """An error to compare: NaN as the largest."""
    return math.inf if math.isnan(x) else x


def _node_of(p: DivergencePoint, graph: Graph, seq_ids: dict[int, str],
             leaves: dict[str, str]) -> str | None:
    """The node id that draws ``p``, or None."""
    if p.phase in ("forward", "backward"):
        if p.seq is None:
            return None
        nid = seq_ids.get(p.seq)
        if nid is None:
            return None
        # the same name as the node recorded: another process's numbers never match by chance
        if p.node is not None and graph.node(nid).name != p.node:
            return None
        return nid
    return leaves.get(p.name) if p.name is not None else None


def divergence_marks(divergence: Divergence, graph: Graph, seq_ids: dict[int, str]
                     ) -> DivergenceMarks:
    """What the page draws of ``divergence`` on ``graph``, given the graph's node id of each
    autograd sequence number (``seq_ids``).

    Example (a one-op run, by hand):
        >>> from gradscope.graph.graph import Node
        >>> p = DivergencePoint("forward", "aten.exp", None, "m.py:3", 0.5, 0.01, 50.0,
        ...                     diverged=True, node="ExpBackward0", seq=7)
        >>> d = Divergence(ok=False, first=p, points=(p,), compared=1, threshold=32.0)
        >>> g = Graph([Node("n0", "ExpBackward0", "op")], [], ["n0"])
        >>> m = divergence_marks(d, g, {7: "n0"})
        >>> m.first, m.nodes["n0"].error, m.nodes["n0"].what
        ('n0', 0.5, 'aten.exp (forward) at m.py:3')
    """
    leaves: dict[str, str] = {}
    for n in graph.nodes:
        if n.kind == "leaf" and n.tensor is not None and n.tensor.name:
            leaves.setdefault(n.tensor.name, n.id)
    drawn: dict[str, list[DivergencePoint]] = {}
    unmapped = measured = 0
    first: str | None = None
    for p in divergence.points:
        nid = _node_of(p, graph, seq_ids, leaves)
        if p.phase in ("forward", "backward"):
            measured += 1
            unmapped += nid is None
        if nid is None:
            continue
        drawn.setdefault(nid, []).append(p)
        if first is None and p == divergence.first:
            first = nid
    nodes = {}
    for nid, points in drawn.items():
        worst = max(points, key=lambda q: (_key(q.error), _key(q.amplification)))
        nodes[nid] = NodeError(
            error=worst.error, amplification=max(_key(q.amplification) for q in points),
            what=worst.where(), line=worst.line, count=len(points),
            diverged=any(q.diverged for q in points))
    return DivergenceMarks(nodes, first, divergence.summary(), divergence.ok,
                           divergence.threshold, unmapped, measured)


def trace_divergence(outputs: Any, divergence: Divergence, *, model: Any = None,
                     **trace_options: Any) -> DivergenceGraph:
    """The candidate's autograd graph with ``divergence`` drawn on it: each node coloured by
    its error against the reference, the first divergence marked; ``.save("d.html")`` writes
    the page, which opens on the first divergence.

    Args:
        outputs: the candidate's outputs (its loss), in the process that recorded it: the
            graph is walked from them (``gs.trace``; after ``backward()`` too, while they are
            alive).
        divergence: ``gs.compare_runs(reference, candidate)`` of that recorded candidate.
        model: the candidate's model: names the leaves (its parameters) and modules.
        trace_options: ``gs.trace``'s other options (``saved``, ``params``...).

    Returns:
        A ``DivergenceGraph``: ``.graph``, ``.marks`` (``DivergenceMarks``: each node's
        ``NodeError``, ``first``), ``.to_html()``, ``.save(path)``.

    Example:
        >>> import copy, torch, gradscope as gs
        >>> m = torch.nn.Linear(4, 2)
        >>> def step(model, x):
        ...     with gs.record_numerics(model) as run:
        ...         loss = model(x).exp().sum()
        ...         loss.backward()
        ...     return run, loss
        >>> ref, _ = step(copy.deepcopy(m), torch.ones(3, 4))
        >>> m64 = copy.deepcopy(m).double()
        >>> cand, loss = step(m64, torch.ones(3, 4, dtype=torch.float64))
        >>> page = gs.trace_divergence(loss, gs.compare_runs(ref, cand), model=m64)
        >>> [page.graph.node(i).name for i in page.marks.nodes], page.marks.first
        (['weight', 'bias', 'AddmmBackward0', 'ExpBackward0', 'SumBackward0'], None)
    """
    if model is not None:
        trace_options["model"] = model
    graph, ids = trace_with_ids(outputs, **trace_options)
    seq_ids = {}
    for fn, nid in ids.items():
        seq = int(fn._sequence_nr())
        if seq != NO_SEQUENCE_NR:
            seq_ids[seq] = nid
    del ids  # the map holds the autograd nodes alive
    return DivergenceGraph(graph, divergence_marks(divergence, graph, seq_ids))
