"""The records of the graph model: ``Node``, ``Edge``, ``SavedTensor``, ``TensorInfo``, ``Box``,
``Region``.

Plain slotted dataclasses, no torch objects: capture fills them from a live autograd graph,
renderers read them, and they can be serialised, compared and kept after the autograd graph
they describe is gone, without keeping any tensor alive. ``Graph`` (``gradscope.graph.graph``)
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
            A dimension with no single size (a nested tensor's ragged one) is None.
        dtype: e.g. ``float32``; None once freed.
        device: e.g. ``cpu`` or ``cuda:0``; None once freed.
        nbytes: ``numel * element_size`` of the saved tensor (0 once freed).
        storage: an id (``s0``, ``s1``...) shared by every tensor in the graph on the same storage.
        freed: True once backward released the tensor (``retain_graph=False``).
        storage_nbytes: bytes of the whole storage behind it (a saved slice keeps all of it
            alive); defaults to ``nbytes``.
        alias: ``leaf`` when the storage is alive without the graph though no leaf node holds
            it: a parameter or buffer (BatchNorm's running statistics) of the model, or an
            input of the forward (``gs.trace(model=..., inputs=...)`` marks them); memory
            figures count it with the parameters/inputs. None: the graph's own (or unknown).
    """

    name: str
    shape: list[int | None] | None
    dtype: str | None
    device: str | None
    nbytes: int
    storage: str | None
    freed: bool = False
    storage_nbytes: int | None = None
    alias: str | None = None

    def __post_init__(self) -> None:
        if self.storage_nbytes is None:
            self.storage_nbytes = self.nbytes


@dataclass(slots=True)
class TensorInfo:
    """The tensor behind a ``leaf`` or ``output`` node (``shape``: as ``SavedTensor.shape``)."""

    name: str | None
    shape: list[int | None]
    dtype: str
    device: str
    storage: str | None = None


@dataclass(slots=True)
class Box:
    """What a ``module`` node of a collapsed or folded view stands for.

    Attributes:
        cls: the module's class name (``TransformerEncoderLayer``), "" when unknown.
        nodes: how many nodes of the full graph the box stands for.
        saved_bytes: bytes held by the members' saved tensors, each storage counted once
            (whole storages, as ``saved_bytes_of`` counts them).
        repeat: for a fold (``layers.0-63 x64``), how many identical layers it stands for.
        leaf_bytes: the part of ``saved_bytes`` whose storages alias a leaf (a parameter, or
            an input that requires grad): alive without the graph too.
        output_bytes: the part whose storages alias an output tensor.
        aliases: storage id -> ``leaf``/``output`` for those storages, so that a box of boxes
            (a fold of a collapsed view) can split its bytes again.
        shown: for a fold that keeps its first member drawn (``fold(keep_first=True)``), that
            member's path (``encoder.layers.0``); the box then stands for the other members.

    ``activation_bytes`` is the rest: what only the graph holds.
    """

    cls: str
    nodes: int
    saved_bytes: int
    repeat: int | None = None
    leaf_bytes: int = 0
    output_bytes: int = 0
    aliases: dict[str, str] = field(default_factory=dict)
    shown: str | None = None

    @property
    def activation_bytes(self) -> int:
        """Bytes only the graph holds (``saved_bytes`` minus the aliases of leaves/outputs)."""
        return self.saved_bytes - self.leaf_bytes - self.output_bytes


@dataclass(slots=True)
class Region:
    """A ``torch.compile`` region: what gradscope read of the AOTAutograd backward graph that
    its ``CompiledFunctionBackward`` node runs.

    Attributes:
        graph: AOTAutograd's id of the compiled graph (``aot_id``), or None.
        ops: how many aten op nodes the region was expanded into; 0 when drawn opaque.
        note: one line for the reader (why the region is drawn opaque, or what its nodes
            lack), else None.
    """

    graph: int | None = None
    ops: int = 0
    note: str | None = None


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
        forward_nonfinite: ``nan`` or ``inf`` when this node's forward output was the first
            non-finite value of the forward (``gs.record_forward(check_finite=True)``).
        region: the id of the ``CompiledFunctionBackward`` node of the compiled region this
            node belongs to (an aten op of its backward graph, or that node itself), else None.
        compiled: on a compiled region's ``CompiledFunctionBackward`` node, the ``Region``.
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
    forward_nonfinite: str | None = None
    region: str | None = None
    compiled: Region | None = None

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
        input_nr: position in ``src.next_functions``, i.e. the slot of src's forward inputs. At
            a compiled region's boundary: into the region, the index of the region node's
            ``grad_outputs``; out of it, the slot of its ``next_functions``; inside, which
            output of the producing op.
        kind: ``grad`` for autograd edges, ``view`` for the dotted link from a view output to
            its base tensor (drawn as torchviz does), ``saved`` for the dotted link from a
            compiled region's node to an op of its backward graph that no gradient reaches
            (it reads only saved activations).
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


def storage_sizes(nodes: Iterable[Node]) -> dict[str, int]:
    """Storage id -> bytes held, for the saved tensors of ``nodes``: each storage once, at the
    size of the whole storage (a saved slice keeps all of it alive; ``storage_nbytes``), freed
    ones left out. A saved tensor without a storage id (sparse...) is a storage of its own,
    keyed ``<node id>:<index>``; a placeholder packed by hooks (no storage, 0 bytes) holds
    nothing and is left out."""
    sizes: dict[str, int] = {}
    for n in nodes:
        for k, s in enumerate(n.saved):
            if s.freed or (s.storage is None and not s.nbytes):
                continue
            sid = s.storage if s.storage is not None else f"{n.id}:{k}"
            size = s.storage_nbytes or s.nbytes
            if size > sizes.get(sid, -1):
                sizes[sid] = size
    return sizes


def saved_bytes_of(nodes: Iterable[Node]) -> int:
    """Bytes held by the saved tensors of ``nodes``, each storage counted once (as
    ``storage_sizes`` counts it), freed ones 0."""
    return sum(storage_sizes(nodes).values())


def _same_float(a: float | None, b: float | None) -> bool:
    """Equality that treats NaN as equal to NaN (a recorded NaN norm must round-trip)."""
    if a is None or b is None:
        return a is b
    return a == b or (a != a and b != b)


def format_split(activation: int, leaf: int = 0, output: int = 0) -> str:
    """Saved bytes as the views write them, activations apart from aliases: ``1.5 KiB
    activations + 36.0 KiB params/inputs + 64 B outputs`` (zero parts left out; ``0 B`` when
    all are zero). Activations are held only by the graph; the others alias a leaf (a
    parameter, an input) or an output, which stay alive without the graph.

    Example:
        >>> format_split(1536, 36864), format_split(0, 512), format_split(0)
        ('1.5 KiB activations + 36.0 KiB params/inputs', '512 B params/inputs', '0 B')
    """
    parts = [f"{format_bytes(activation)} activations"] if activation else []
    if leaf:
        parts.append(f"{format_bytes(leaf)} params/inputs")
    if output:
        parts.append(f"{format_bytes(output)} outputs")
    return " + ".join(parts) or "0 B"


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``n`` and the noun in the number it takes: ``1 node``, ``2 nodes``, ``1 box``.

    Example:
        >>> plural(1, "saved tensor"), plural(3, "node"), plural(2, "box", "boxes")
        ('1 saved tensor', '3 nodes', '2 boxes')
    """
    return f"{n} {noun if n == 1 else (many or noun + 's')}"


def format_bytes(n: float) -> str:
    """Human-readable bytes: ``512 B``, ``1.5 KiB``, ``3.2 MiB``."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024.0
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable")
