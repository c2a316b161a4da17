"""Memory held by autograd graphs, as plain data: what a traced ``Graph`` holds (``graph_memory``,
``Graph.memory()``), and the records of the live accounting (``gs.saved_memory``) and the leak
detector (``gs.leak_check``) in ``gradscope.memory.saved``.

Each storage counts once; it is an *activation* when only the graph holds it, a *leaf* storage
when it aliases a leaf (a parameter or an input that requires grad), an *output* storage when it
aliases a tensor handed to ``trace``. A storage saved by several nodes belongs to the first of
them in forward order (in a ``Graph``: the first saver in a post-order walk from the roots,
which is forward order for the usual left-to-right code), so per-node and per-module figures
add up to the total.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..graph.gcpause import collector_paused
from ..graph.nodes import (
    GraphLike,
    Node,
    format_bytes,
    format_split,
    plural,
    storage_sizes,
)
from ..graph.paths import levels

ACTIVATION, LEAF, OUTPUT = "activation", "leaf", "output"


@dataclass(frozen=True, slots=True)
class StorageUse:
    """One storage held by saved tensors.

    Attributes:
        id: the storage id (``s0``...; for a ``Graph`` the ids of ``SavedTensor.storage``).
        nbytes: bytes of the storage (of the largest saved view when the size is unknown).
        kind: ``activation`` (held only by the graph), ``leaf`` or ``output`` (aliases one).
        owner: id of the node the bytes are attributed to (None for live accounting).
        module: module path the bytes are attributed to (None: outside every module).
        savers: how many saved tensors point into the storage.
    """

    id: str
    nbytes: int
    kind: str
    owner: str | None
    module: str | None
    savers: int


@dataclass(frozen=True, slots=True)
class CudaSnapshot:
    """CUDA caching-allocator figures at one moment (``torch.cuda.memory_*``), in bytes."""

    phase: str
    device: str
    allocated: int
    reserved: int
    max_allocated: int


@dataclass(frozen=True, slots=True)
class Split:
    """Bytes of some storages, by kind: ``activation`` (only the graph holds them), ``leaf``
    (they alias a parameter or an input), ``output`` (they alias an output tensor)."""

    activation: int = 0
    leaf: int = 0
    output: int = 0

    def __iter__(self) -> Iterator[int]:
        return iter((self.activation, self.leaf, self.output))

    @property
    def total(self) -> int:
        return self.activation + self.leaf + self.output

    def __str__(self) -> str:
        return format_split(self.activation, self.leaf, self.output)


def _add(acc: list[int], kind: str, nbytes: int) -> None:
    acc[1 if kind == LEAF else 2 if kind == OUTPUT else 0] += nbytes


@dataclass
class MemoryReport:
    """Bytes held by saved tensors, counted once per storage.

    Attributes:
        total: bytes of every distinct storage held (``activation + leaf + output``).
        activation_bytes: storages only the graph holds: freed when the graph goes.
        leaf_bytes: storages that alias a leaf (a parameter, or an input requiring grad).
        output_bytes: storages that alias an output tensor.
        storages: one ``StorageUse`` per storage, largest first.
        by_node: bytes attributed to each node id (graph reports only); sums to ``total``.
        node_names: the name of each node in ``by_node`` (``MulBackward0``).
        by_module: bytes attributed to each module path (None: outside every module);
            sums to ``total``.
        freed: saved tensors already released by backward (they hold nothing).
        peak: live accounting only: most bytes held at once during the forward.
        saved_total: live accounting only: bytes of every storage saved during the forward,
            including those the graph released before it ended.
        cuda: allocator snapshots (empty on the CPU).

    An input that does not require grad is no node of the graph: its storage counts as an
    activation unless the trace marked it (``gs.trace(model=..., inputs=...)`` marks the
    storages of the model's parameters and buffers, BatchNorm's running statistics, and of the
    inputs, ``SavedTensor.alias``), which then count with the parameters/inputs.

    Example:
        >>> from gradscope.graph.graph import Graph, Node, SavedTensor
        >>> result = SavedTensor("result", [4], "float32", "cpu", 16, "s0")  # 4 float32
        >>> graph_memory(Graph([Node("n1", "ExpBackward0", "op", saved=[result])])).total
        16
    """

    total: int = 0
    activation_bytes: int = 0
    leaf_bytes: int = 0
    output_bytes: int = 0
    storages: list[StorageUse] = field(default_factory=list)
    by_node: dict[str, int] = field(default_factory=dict)
    node_names: dict[str, str] = field(default_factory=dict)
    by_module: dict[str | None, int] = field(default_factory=dict)
    freed: int = 0
    peak: int | None = None
    saved_total: int | None = None
    cuda: list[CudaSnapshot] = field(default_factory=list)

    @property
    def aliased_bytes(self) -> int:
        """Bytes of storages that alias leaves or outputs (held elsewhere too)."""
        return self.leaf_bytes + self.output_bytes

    def module_bytes(self, depth: int | None = None) -> dict[str | None, int]:
        """``by_module`` with paths cut to ``depth`` levels and summed. Levels are those of
        ``Graph.collapse``: a list index stays with its container, so ``encoder.layers.3`` is
        at depth 2.

        Example:
            >>> r = MemoryReport(by_module={"enc.layers.0": 4, "enc.layers.1": 8, None: 2})
            >>> r.module_bytes(1)
            {'enc': 12, None: 2}
        """
        if depth is None:
            return dict(self.by_module)
        out: dict[str | None, int] = {}
        for path, n in self.by_module.items():
            key = path if path is None else ".".join(levels(path)[:depth])
            out[key] = out.get(key, 0) + n
        return out

    def module_split(self, depth: int | None = None) -> dict[str | None, Split]:
        """Per module path (cut to ``depth`` as ``module_bytes`` cuts it): its bytes split
        into activations, leaf aliases and output aliases. The three add up to
        ``module_bytes(depth)``.

        Example:
            >>> r = MemoryReport()
            >>> add_use(r, StorageUse("s0", 64, ACTIVATION, None, "enc.0", 1))
            >>> add_use(r, StorageUse("s1", 16, LEAF, None, "enc.1", 1))
            >>> r.module_split(1)["enc.1"], str(r.module_split(0)[""])
            (Split(activation=0, leaf=16, output=0), '64 B activations + 16 B params/inputs')
        """
        out: dict[str | None, list[int]] = {}
        for use in self.storages:
            path = use.module
            if depth is not None and path is not None:
                path = ".".join(levels(path)[:depth])
            _add(out.setdefault(path, [0, 0, 0]), use.kind, use.nbytes)
        return {k: Split(*v) for k, v in out.items()}

    def node_split(self) -> dict[str, Split]:
        """Per node id (graph reports): its bytes split as ``module_split`` splits them."""
        out: dict[str, list[int]] = {}
        for use in self.storages:
            if use.owner is not None:
                _add(out.setdefault(use.owner, [0, 0, 0]), use.kind, use.nbytes)
        return {k: Split(*v) for k, v in out.items()}

    def node_labels(self) -> dict[str, str]:
        """A short label per node that holds bytes, activations apart from aliases of
        parameters/inputs and outputs (``1.5 KiB activations + 36.0 KiB params/inputs``)."""
        return {nid: format_split(*sp) for nid, sp in self.node_split().items() if any(sp)}

    def summary(self) -> str:
        """One line: activations first (what freeing the graph gives back), then the bytes
        that alias parameters/inputs and outputs, then the total."""
        peak = f", peak {format_bytes(self.peak)}" if self.peak is not None else ""
        n_act = sum(1 for u in self.storages if u.kind == ACTIVATION)
        aliases = ""
        if self.leaf_bytes:
            aliases += f", {format_bytes(self.leaf_bytes)} aliasing parameters/inputs"
        if self.output_bytes:
            aliases += f", {format_bytes(self.output_bytes)} aliasing outputs"
        if aliases:
            aliases += " (alive without the graph too)"
        return (
            f"saved tensors hold {format_bytes(self.activation_bytes)} of activations in "
            f"{plural(n_act, 'storage')} (held only by the graph){aliases}; "
            f"{format_bytes(self.total)} in {plural(len(self.storages), 'storage')} in all{peak}"
        )

    def __str__(self) -> str:
        """The text of ``render()``: ``print(report)`` shows what the terminal would."""
        return str(self.render())

    def render(self, *, depth: int | None = None, top: int = 20) -> Any:
        """A rich renderable: summary, bytes per module cut to ``depth``, CUDA figures."""
        from ..output.formats import renderer

        return renderer("memory")(self, depth=depth, top=top)

    def __rich__(self) -> Any:
        return self.render()


def graph_memory(graph: GraphLike) -> MemoryReport:
    """Bytes held by a graph's saved tensors, per storage, node and module.

    Args:
        graph: a graph from ``gs.trace`` (module paths come from ``gs.scopes``).

    Returns:
        The ``MemoryReport``; ``Graph.memory()`` returns the same.

    Example:
        >>> from gradscope.graph.graph import Edge, Graph, Node, SavedTensor
        >>> x = SavedTensor("mat1", [4, 3], "float32", "cpu", 48, "s0")
        >>> y = SavedTensor("result", [4, 2], "float32", "cpu", 32, "s1")
        >>> relu = Node("n1", "ReluBackward0", "op", saved=[y])  # outside the model
        >>> linear = Node("n2", "AddmmBackward0", "op", module="", saved=[x])  # the model
        >>> rep = graph_memory(Graph([relu, linear], [Edge("n1", "n2")]))
        >>> rep.by_module    # Linear keeps its input; relu, outside the model, its result
        {'': 48, None: 32}
    """
    with collector_paused():  # a few objects per storage, none freed (model/gcpause.py)
        return _graph_memory(graph)


def _graph_memory(graph: GraphLike) -> MemoryReport:
    aliases = alias_kinds(graph)
    rank = _forward_rank(graph)
    sizes: dict[str, int] = {}
    owner: dict[str, str] = {}
    savers: dict[str, int] = {}
    freed = 0
    for node in sorted((n for n in graph.nodes if n.saved), key=lambda n: rank.get(n.id, -1)):
        for k, s in enumerate(node.saved):
            if s.freed:
                freed += 1
                continue
            if s.storage is None and not s.nbytes:
                continue  # a placeholder packed by hooks (checkpoint): it holds nothing
            # A saved tensor without a storage id (sparse...) is a storage of its own.
            sid = s.storage if s.storage is not None else f"{node.id}:{k}"
            size = getattr(s, "storage_nbytes", None) or s.nbytes
            sizes[sid] = max(sizes.get(sid, 0), size)
            owner.setdefault(sid, node.id)
            savers[sid] = savers.get(sid, 0) + 1
    report = MemoryReport(freed=freed)
    by_id = {n.id: n for n in graph.nodes}
    for sid, size in sizes.items():
        node = by_id[owner[sid]]
        use = StorageUse(sid, size, aliases.get(sid, ACTIVATION), node.id, node.module, savers[sid])
        add_use(report, use)
        report.by_node[node.id] = report.by_node.get(node.id, 0) + size
        report.node_names[node.id] = node.name
    report.storages.sort(key=lambda u: -u.nbytes)
    return report


def add_use(report: MemoryReport, use: StorageUse) -> None:
    """Count ``use`` in ``report`` (total, its kind's bytes, its module's bytes)."""
    report.storages.append(use)
    report.total += use.nbytes
    if use.kind == LEAF:
        report.leaf_bytes += use.nbytes
    elif use.kind == OUTPUT:
        report.output_bytes += use.nbytes
    else:
        report.activation_bytes += use.nbytes
    report.by_module[use.module] = report.by_module.get(use.module, 0) + use.nbytes


def alias_kinds(graph: GraphLike) -> dict[str, str]:
    """Storage id -> ``leaf``/``output`` for storages of leaf and output tensors (leaf wins),
    those a collapsed box recorded (``Box.aliases``: its leaves are inside it), and those of
    saved tensors marked ``alias`` (a model's parameters, buffers and inputs, ``leaf``)."""
    kinds: dict[str, str] = {}
    for n in graph.nodes:
        for s in n.saved:
            if s.alias is not None and s.storage is not None and kinds.get(s.storage) != LEAF:
                kinds[s.storage] = s.alias
        if n.kind in (LEAF, OUTPUT) and n.tensor is not None and n.tensor.storage is not None:
            if kinds.get(n.tensor.storage) != LEAF:
                kinds[n.tensor.storage] = n.kind
        elif n.box is not None:
            for sid, kind in n.box.aliases.items():
                if kinds.get(sid) != LEAF:
                    kinds[sid] = kind
    return kinds


def split_bytes(nodes: Iterable[Node], kinds: dict[str, str]) -> Split:
    """Bytes held by the saved tensors of ``nodes`` (each storage once, as ``storage_sizes``
    counts), split by ``kinds`` (``alias_kinds`` of the whole graph)."""
    acc = [0, 0, 0]
    for sid, size in storage_sizes(nodes).items():
        _add(acc, kinds.get(sid, ACTIVATION), size)
    return Split(*acc)


def _forward_rank(graph: GraphLike) -> dict[str, int]:
    """Node id -> position in forward order, estimated by an iterative post-order walk.

    A node's inputs (its ``next_functions``) ran before it, so post-order is a valid forward
    order; among independent inputs, the first one (``input_nr`` 0) is taken to run first, as
    Python evaluates arguments left to right.
    """
    kids: dict[str, list[str]] = {n.id: [] for n in graph.nodes}
    for e in graph.edges:
        if e.kind == "grad":
            kids[e.src].append(e.dst)
    rank: dict[str, int] = {}
    seen: set[str] = set()
    starts = list(graph.roots) + [n.id for n in graph.nodes]
    no_kids: list[str] = []
    for start in starts:
        if start in seen:
            continue
        seen.add(start)
        # (node, its inputs, the next one to look at): a node is ranked once all are
        stack: list[tuple[str, list[str], int]] = [(start, kids.get(start, no_kids), 0)]
        while stack:
            nid, ks, i = stack.pop()
            n = len(ks)
            while i < n and ks[i] in seen:
                i += 1
            if i == n:
                rank[nid] = len(rank)
            else:
                nxt = ks[i]
                seen.add(nxt)
                stack.append((nid, ks, i + 1))
                stack.append((nxt, kids.get(nxt, no_kids), 0))
    return rank


@dataclass(frozen=True, slots=True)
class Leak:
    """The graph of an earlier step, still alive.

    Attributes:
        step: the step whose graph is alive (0 is the first step).
        seen_at: the step at whose end it was found.
        saved_bytes: bytes its saved tensors still hold (each storage once); 0 when backward
            freed them but something still holds the graph's nodes.
        saved_tensors: how many of its saved tensors are still held.
    """

    step: int
    seen_at: int
    saved_bytes: int
    saved_tensors: int

    def __str__(self) -> str:
        held = (
            f"its {self.saved_tensors} saved tensors hold {format_bytes(self.saved_bytes)}"
            if self.saved_tensors
            else "backward freed its saved tensors, but its nodes are still held"
        )
        return (
            f"the autograd graph of step {self.step} is still alive at the end of step "
            f"{self.seen_at}: {held}. Something keeps a tensor of that step with its grad_fn "
            "(a loss in a list, a hidden state carried over): keep .item() or .detach() instead"
        )


@dataclass(frozen=True, slots=True)
class LeakStep:
    """What ``LeakCheck.step()`` found at the end of one step.

    Attributes:
        step: the step that just ended.
        leaks: the earlier graphs still alive, oldest first.
        held_bytes: bytes their saved tensors hold together (each storage once).
    """

    step: int
    leaks: tuple[Leak, ...]
    held_bytes: int = 0

    def __bool__(self) -> bool:
        return bool(self.leaks)
