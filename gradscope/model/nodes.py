"""The records of the graph model: ``Node``, ``Edge``, ``SavedTensor``, ``TensorInfo``, ``Box``.

Plain slotted dataclasses, no torch objects: capture fills them from a live autograd graph,
renderers read them, and they can be serialised, compared and kept after the autograd graph
they describe is gone, without keeping any tensor alive. ``Graph`` (``gradscope.model.graph``)
holds them; the modules that transform or write graphs import these records, never ``Graph``,
so the model has no import cycle.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol


#: Node kinds, in the vocabulary of the design document; ``module`` is a collapsed group of
#: nodes (``Graph.collapse``) and only appears in collapsed views.
KINDS = ("op", "custom", "accumulate", "leaf", "output", "module")


@dataclass(slots=True)
class SavedTensor:
    """A tensor saved by a backward node for use in backward.

    Attributes:
        name: the saved name without the ``_saved_`` prefix (``self``, ``mat1``, ``result``),
            ``name[i]`` for one element of a saved list, ``saved_tensors[i]`` for custom Functions.
        shape: the tensor's shape; None when backward already freed it and torch kept no size.
        dtype: e.g. ``float32``; None once freed.
        device: e.g. ``cpu`` or ``cuda:0``; None once freed.
        nbytes: ``numel * element_size`` of the saved tensor (0 once freed).
        storage: an id (``s0``, ``s1``...) shared by every tensor in the graph on the same storage.
        freed: True once backward released the tensor (``retain_graph=False``).
        storage_nbytes: bytes of the whole storage behind it (a saved slice keeps all of it
            alive); defaults to ``nbytes``.
    """

    name: str
    shape: list[int] | None
    dtype: str | None
    device: str | None
    nbytes: int
    storage: str | None
    freed: bool = False
    storage_nbytes: int | None = None

    def __post_init__(self) -> None:
        if self.storage_nbytes is None:
            self.storage_nbytes = self.nbytes


@dataclass(slots=True)
class TensorInfo:
    """The tensor behind a ``leaf`` or ``output`` node."""

    name: str | None
    shape: list[int]
    dtype: str
    device: str
    storage: str | None = None


@dataclass(slots=True)
class Box:
    """What a ``module`` node of a collapsed or folded view stands for.

    Attributes:
        cls: the module's class name (``TransformerEncoderLayer``), "" when unknown.
        nodes: how many nodes of the full graph the box stands for.
        saved_bytes: bytes of the members' saved tensors, each storage counted once.
        repeat: for a fold (``layers.0-63 x64``), how many identical layers it stands for.
    """

    cls: str
    nodes: int
    saved_bytes: int
    repeat: int | None = None


@dataclass(slots=True)
class Node:
    """One node of the autograd graph (or a tensor drawn next to it).

    Attributes:
        id: stable id (``n0``, ``n1``...) assigned in walk order.
        name: the backward node's class name (``MulBackward0``, ``AccumulateGrad``,
            ``MyFunctionBackward``); for ``leaf`` and ``output`` nodes the tensor's name or "".
        kind: one of ``op``, ``custom``, ``accumulate``, ``leaf``, ``output``, ``module``.
        module: dotted path of the module whose forward created the node, or None.
        attrs: non-tensor saved attributes of the backward node, values as strings (nothing
            else: what gradscope adds has typed fields below).
        saved: tensors the node saved for backward.
        tensor: shape/dtype/name for ``leaf`` and ``output`` nodes, else None.
        order: position in the engine's execution order when the graph was annotated by
            ``gs.record_backward`` (0 runs first), else None.
        module_classes: the class names from the model down to ``module``: the model's own
            class first, then one per depth level (``gs.scopes`` records them), else None.
        created_at: the user's line that created the node, ``file:line: code``
            (``gs.record_forward``), else None.
        nonfinite: ``nan`` or ``inf`` when the recorded backward found this node producing a
            non-finite gradient, else None.
        first_nonfinite: the node is the first, in engine order, to produce one.
        view_base: an ``output`` node that is the base tensor of a view output.
        box: for ``module`` nodes, what the box stands for.
    """

    id: str
    name: str
    kind: str
    module: str | None = None
    attrs: dict[str, str] = field(default_factory=dict)
    saved: list[SavedTensor] = field(default_factory=list)
    tensor: TensorInfo | None = None
    order: int | None = None
    module_classes: tuple[str, ...] | None = None
    created_at: str | None = None
    nonfinite: str | None = None
    first_nonfinite: bool = False
    view_base: bool = False
    box: Box | None = None

    @property
    def saved_bytes(self) -> int:
        """Bytes of this node's saved tensors that are still held (freed ones count 0)."""
        return sum(s.nbytes for s in self.saved if not s.freed)

    @property
    def count(self) -> int:
        """How many nodes of the full graph this one stands for (a box: its members)."""
        return self.box.nodes if self.box is not None else 1


@dataclass(slots=True)
class Edge:
    """``dst`` is in ``src``'s ``next_functions``: in backward, gradient flows src -> dst.

    Attributes:
        src: id of the node whose backward produces the gradient.
        dst: id of the node that receives it.
        input_nr: position in ``src.next_functions``, i.e. the slot of src's forward inputs.
        kind: ``grad`` for autograd edges, ``view`` for the dotted link from a view output to
            its base tensor (drawn as torchviz does).
        grad_norm: norm of the gradient that flowed along the edge, when the graph was
            annotated by ``gs.record_backward``; else None.
        count: how many edges this one stands for (merged edges of collapsed views), else 1.
    """

    src: str
    dst: str
    input_nr: int = 0
    kind: str = "grad"
    grad_norm: float | None = None
    count: int = 1

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Edge):
            return NotImplemented
        return (self.src, self.dst, self.input_nr, self.kind, self.count) == (
            other.src,
            other.dst,
            other.input_nr,
            other.kind,
            other.count,
        ) and _same_float(self.grad_norm, other.grad_norm)


class GraphLike(Protocol):
    """What the model's functions read of a graph: its nodes, edges and roots."""

    nodes: list[Node]
    edges: list[Edge]
    roots: list[str]


def saved_bytes_of(nodes: Iterable[Node]) -> int:
    """Bytes held by the saved tensors of ``nodes``, each storage counted once (the largest
    saved view of it), freed ones 0; tensors without a storage id count on their own."""
    seen: dict[str, int] = {}
    total_unkeyed = 0
    for n in nodes:
        for s in n.saved:
            if s.freed:
                continue
            if s.storage is None:
                total_unkeyed += s.nbytes
            else:
                seen[s.storage] = max(seen.get(s.storage, 0), s.nbytes)
    return sum(seen.values()) + total_unkeyed


def _same_float(a: float | None, b: float | None) -> bool:
    """Equality that treats NaN as equal to NaN (a recorded NaN norm must round-trip)."""
    if a is None or b is None:
        return a is b
    return a == b or (a != a and b != b)


def format_bytes(n: float) -> str:
    """Human-readable bytes: ``512 B``, ``1.5 KiB``, ``3.2 MiB``."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024.0
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")
