"""Watch the backward pass: engine order, the gradient on every edge, the first NaN/Inf.

``record_backward(outputs)`` walks the graph behind ``outputs`` once (``gs.trace``, so its node
ids are the ones every renderer shows), puts a hook on every node (``grad_fn.register_hook``:
it sees what the node received and returned), and removes them when the block ends, even when
it raises. The hooks only read gradients and return None, so no gradient changes. Statistics
of CPU gradients are read at once; those of accelerator gradients stay on the device while
backward runs and come to the host in one transfer per device when the block ends.

The forward lines on nodes come from ``gs.record_forward`` (``gradscope.backward.forward``).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from .._torch.handles import HookHandle
from .._torch.stamps import FORWARD_NONFINITE_KEY
from .._torch.torchcompat import local_tensor
from ..graph import regions as _regions
from ..graph.graph import Graph, Node
from ..graph.nest import iter_tensors
from ..graph.tensor_facts import checkable
from ..graph.walk import trace_with_ids
from .forward import created_at
from .records import (
    BackwardTrace,
    GradStat,
    NodeStep,
    NonFinite,
)

#: Key under which ``torch.autograd.detect_anomaly`` keeps a node's forward stack.
_ANOMALY_KEY = "traceback_"


# ---------------------------------------------------------------------------- statistics
def _flat(g: torch.Tensor) -> torch.Tensor | None:
    """``g`` detached, dense, and of a type ``vector_norm`` takes (float8 widened to float32);
    None when empty or unreadable (packed float4)."""
    d = g.detach()
    if d.layout != torch.strided:
        d = d.coalesce().values() if d.is_sparse else d.to_dense()
    if d.numel() == 0:
        return None
    wide = checkable(d)
    if wide is None:
        return None
    d = wide
    if not (d.is_floating_point() or d.is_complex()):
        d = d.double()
    return d


def _norm_kw(d: torch.Tensor) -> dict[str, Any]:
    # Half/bfloat16 norms are computed in float32 so a finite gradient never reads as Inf.
    return {"dtype": torch.float32} if d.dtype in (torch.float16, torch.bfloat16) else {}


_PLAIN = (torch.float32, torch.float64)
#: a float32 2-norm below this may have lost its value to underflow (squares below float32's
#: smallest normal number): recomputed in float64, as one that overflowed
_TINY = torch.finfo(torch.float32).tiny ** 0.5 * 1e4
_norm = torch.linalg.vector_norm


def _stat_now(g: torch.Tensor) -> GradStat:
    """Statistics of a CPU gradient, read at once (a host read costs nothing on the CPU)."""
    if g.is_floating_point() and g.layout == torch.strided and g.numel() and checkable(g) is g:
        d = g.detach()  # fast path: no conversion, one kernel for min and max
        norm = (_norm(d) if d.dtype in _PLAIN else _norm(d, dtype=torch.float32)).item()
        lo_t, hi_t = torch.aminmax(d)
        lo, hi = lo_t.item(), hi_t.item()
        max_abs = max(-lo, hi) if lo == lo and hi == hi else math.nan  # x != x: NaN
    else:
        flat = _flat(g)
        if flat is None:
            return GradStat(list(g.shape), 0.0, 0.0, False, False)
        d = flat
        kw = _norm_kw(d)
        norm = _norm(d, **kw).item()
        max_abs = _norm(d, math.inf, **kw).item()
    if max_abs - max_abs == 0.0 and (norm - norm != 0.0 or (norm < _TINY and max_abs > 0)):
        # every element finite, but the norm overflowed (finite values near 1e30 in float32)
        # or underflowed (values of 1e-25 whose squares are below float32's range): float64
        norm = _norm(d, dtype=torch.complex128 if d.is_complex() else torch.float64).item()
    if norm - norm == 0.0:  # finite
        return GradStat(list(g.shape), norm, max_abs, False, False)
    # NaN, Inf, or a norm that overflowed although every element is finite
    inf = math.isinf(max_abs) or (math.isnan(max_abs) and bool(torch.isinf(d).any()))
    return GradStat(list(g.shape), norm, max_abs, math.isnan(max_abs), inf)


def _stat_later(g: torch.Tensor) -> tuple[list[int], torch.Tensor | None]:
    """``(shape, [norm, max_abs, any_inf])`` of an accelerator gradient, left on its device so
    that backward is not stalled by a host sync; ``_resolve`` reads them all at the end."""
    d = _flat(g)
    if d is None:
        return list(g.shape), None
    kw = _norm_kw(d)
    norm = torch.linalg.vector_norm(d, **kw)
    max_abs = torch.linalg.vector_norm(d, ord=math.inf, **kw)
    return list(g.shape), torch.stack([norm, max_abs, torch.isinf(d).any().to(norm.dtype)])


def _stat(g: Any) -> Any:
    """Statistics of one gradient; of a DTensor, of this rank's shard (its global norm would
    be a collective inside the backward, which a rank whose graph differs would wait on)."""
    if not isinstance(g, torch.Tensor):
        return None
    g = local_tensor(g)
    return _stat_now(g) if g.is_cpu else _stat_later(g)


def _resolve(pending: list[list[Any]]) -> None:
    """Replace each deferred ``(shape, tensor)`` slot in ``pending`` with a ``GradStat``, with
    one host transfer per device and dtype."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for slots in pending:
        for s in slots:
            if isinstance(s, tuple) and s[1] is not None:
                groups.setdefault((s[1].device, s[1].dtype), []).append(s[1])
    values = {key: iter(torch.stack(ts).tolist()) for key, ts in groups.items()}
    for slots in pending:
        for i, s in enumerate(slots):
            if not isinstance(s, tuple):
                continue
            shape, t = s
            if t is None:  # an empty gradient
                slots[i] = GradStat(shape, 0.0, 0.0, False, False)
                continue
            norm, max_abs, inf = next(values[(t.device, t.dtype)])
            slots[i] = GradStat(shape, norm, max_abs, math.isnan(max_abs), bool(inf))


# ---------------------------------------------------------------------------- the recorder
class _Recorder:
    """Holds the hooks and the raw records of one ``record_backward`` block.

    A gradient a node receives is usually the very tensor one node returned: its statistics
    are then reused, not computed twice. Slots fed by several edges (which the engine sums,
    possibly in place) or by the caller (roots) are always measured.
    """

    def __init__(self, ids: dict[Any, str], roots: list[tuple[Any, int]]) -> None:
        self.ids = ids
        self.handles = HookHandle()
        self.steps: list[list[Any]] = []  # [node_id, name, grad_outputs, grad_inputs]
        self.returned: dict[int, tuple[Any, Any]] = {}  # id(grad) -> (weakref, stat)
        self.shared = self._shared_slots(ids, roots)

    @staticmethod
    def _shared_slots(ids: dict[Any, str], roots: list[tuple[Any, int]]) -> dict[Any, set[int]]:
        """Per node, the output slots whose gradient is not exactly one returned tensor."""
        feeds: dict[tuple[Any, int], int] = {}
        for fn in ids:
            for nxt, slot in fn.next_functions:
                if nxt is not None:
                    feeds[(nxt, slot)] = feeds.get((nxt, slot), 0) + 1
        shared: dict[Any, set[int]] = {}
        for (fn, slot), n in feeds.items():
            if n > 1:
                shared.setdefault(fn, set()).add(slot)
        for fn, slot in roots:
            shared.setdefault(fn, set()).add(slot)
        return shared

    def install(self) -> None:
        try:
            for fn, nid in self.ids.items():
                hook = self._hook(nid, type(fn).__name__, self.shared.get(fn, set()))
                self.handles.add(fn.register_hook(hook))
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        self.handles.remove()
        self.returned.clear()

    def _hook(self, nid: str, name: str, shared: set[int]) -> Any:
        """A post-hook: the engine calls it right after the node ran, with what it received
        (``grad_outputs``) and returned (``grad_inputs``). The engine runs one node at a time
        per device thread, so post-hook order is the order nodes ran (and pre-hooks, which
        would double the hook cost, are not needed)."""
        returned = self.returned
        steps = self.steps

        def hook(grad_inputs: Any, grad_outputs: Any) -> None:
            received = []
            for i, g in enumerate(grad_outputs):
                hit = returned.pop(id(g), None) if g is not None and i not in shared else None
                received.append(hit[1] if hit is not None and hit[0]() is g else _stat(g))
            sent = []
            for g in grad_inputs:
                stat = _stat(g)
                if stat is not None:
                    returned[id(g)] = (weakref.ref(g), stat)
                sent.append(stat)
            steps.append([nid, name, received, sent])
            return None  # never replace a gradient

        return hook

    def node_steps(self) -> list[NodeStep]:
        pending = [s[2] for s in self.steps] + [s[3] for s in self.steps]
        _resolve(pending)
        return [NodeStep(nid, name, go, gi) for nid, name, go, gi in self.steps]


# ---------------------------------------------------------------------------- annotation
def _anomaly_stack(fn: Any) -> str | None:
    stack = fn.metadata.get(_ANOMALY_KEY)
    if not stack:
        return None
    return "".join(stack) if isinstance(stack, (list, tuple)) else str(stack)


def _first_bad(slots: list[GradStat | None]) -> tuple[int, str] | None:
    for i, s in enumerate(slots):
        if s is not None and not s.finite:
            return i, s.kind or "nan"
    return None


def _find_first(steps: list[NodeStep], graph: Graph) -> tuple[NodeStep, str, str] | None:
    """The first step, in engine order, that returned (or, coming from outside, received) a
    non-finite gradient."""
    for step in steps:
        incoming = _first_bad(step.grad_outputs)
        if incoming is not None:
            return step, f"grad_outputs[{incoming[0]}]", incoming[1]
        outgoing = _first_bad(step.grad_inputs)
        if outgoing is not None:
            return step, f"grad_inputs[{outgoing[0]}]", outgoing[1]
    return None


def _bad_kind(step: NodeStep, node: Node) -> str | None:
    """``nan``/``inf`` when the step produced a non-finite gradient (for AccumulateGrad: the one
    it accumulates), else None."""
    slots = step.grad_outputs if node.kind == "accumulate" else step.grad_inputs
    kind = None
    for s in slots:
        if s is not None and (s.nan or s.inf):
            if s.nan:
                return "nan"
            kind = "inf"
    return kind


def _output_slots(outputs: Any, graph: Graph) -> dict[str, int]:
    """Output node id -> ``output_nr`` of its tensor, for the edge into its ``grad_fn``."""
    unique: dict[int, torch.Tensor] = {}
    for _, t in iter_tensors(outputs):
        if t.requires_grad:
            unique.setdefault(id(t), t)
    return {root: t.output_nr for root, t in zip(graph.roots, unique.values())}


def _edge_norm(
    e: Any, graph: Graph, first: dict[str, NodeStep], slots: dict[str, int]
) -> float | None:
    src = graph.node(e.src)
    if src.region is not None:  # a compiled region's boundary (see gradscope.graph.regions)
        inside = graph.node(e.dst).region == src.region
        if src.id != src.region and inside:
            return None  # between two aten ops: the engine never saw that gradient
        step = first.get(src.region)
        if step is None:
            return None
        grads = step.grad_outputs if inside else step.grad_inputs
        stat = grads[e.input_nr] if e.input_nr < len(grads) else None
        return None if stat is None else stat.norm
    if src.kind == "output":
        step = first.get(e.dst)
        grads = step.grad_outputs if step else []
        k = slots.get(e.src, 0) if len(grads) > 1 else 0
    else:
        step = first.get(e.src)
        if step is None:
            return None
        grads = step.grad_outputs if src.kind == "accumulate" else step.grad_inputs
        k = 0 if src.kind == "accumulate" else e.input_nr
    stat = grads[k] if k < len(grads) else None
    return None if stat is None else stat.norm


def _annotate(
    graph: Graph, steps: list[NodeStep], fns: dict[str, Any], outputs: Any, watch: Any = None
) -> NonFinite | None:
    first: dict[str, NodeStep] = {}
    for i, step in enumerate(steps):
        if step.node_id not in first:
            first[step.node_id] = step
            graph.node(step.node_id).order = i
    slots = _output_slots(outputs, graph)
    for e in graph.edges:
        if e.kind == "grad":
            e.grad_norm = _edge_norm(e, graph, first, slots)
    for nid, fn in fns.items():
        meta = fn.metadata
        if not meta:
            continue
        where = created_at(fn)
        node = graph.node(nid)
        if where:
            node.created_at = where
        forward = meta.get(FORWARD_NONFINITE_KEY)
        if forward is not None:
            node.forward_nonfinite = forward
    for step in steps:
        node = graph.node(step.node_id)
        kind = _bad_kind(step, node)
        if kind and node.nonfinite != "nan":
            node.nonfinite = kind
    return _first_record(graph, steps, fns, watch)


def _first_record(
    graph: Graph, steps: list[NodeStep], fns: dict[str, Any], watch: Any = None
) -> NonFinite | None:
    found = _find_first(steps, graph)
    if found is None:
        return None
    step, slot, kind = found
    node = graph.node(step.node_id)
    if watch is not None and node.compiled is not None and slot.startswith("grad_inputs"):
        inner = watch.locate(graph, node.id)  # the aten op of the region that made it
        if inner is not None:
            if node.nonfinite is None:
                node.nonfinite = kind
            op, op_kind = inner
            op.nonfinite = op_kind
            op.first_nonfinite = True
            return NonFinite(op.id, op.name, "output", op_kind, op.created_at)
    if node.nonfinite is None:
        node.nonfinite = kind
    node.first_nonfinite = True
    param = None
    if node.kind == "accumulate":
        leaf = next(graph.node(e.dst) for e in graph.edges if e.src == node.id)
        param = leaf.name or None
    where = node.created_at or _anomaly_stack(fns[node.id])
    return NonFinite(node.id, node.name, slot, kind, where, param)


@contextlib.contextmanager
def record_backward(
    outputs: Any, *, params: Any = None, model: Any = None, saved: bool = False,
    inputs: Any = None,
) -> Iterator[BackwardTrace]:
    """Record the backward pass(es) run inside the block, node by node.

    Args:
        outputs: the tensor(s) backward starts from (a tensor or any nest of tensors, as for
            ``gs.trace``). Nodes not reachable from them are not recorded.
        params: names for leaves (dict of name -> tensor, or an ``nn.Module``), so an
            AccumulateGrad that received a NaN names its parameter.
        model: an ``nn.Module``: names leaves and reads module scopes, as in ``gs.trace``.
        saved: also record saved tensors in ``.graph`` (as ``gs.trace(saved=True)``); off by
            default to keep the recorder cheap.
        inputs: what the forward was given (any nest of tensors), as for ``gs.trace``: saved
            tensors on an input's storage (or a parameter's or buffer's of ``model``) are
            marked alive without the graph, so ``.graph.memory()`` counts no input as an
            activation.

    Yields:
        A ``BackwardTrace``, filled in when the block ends (also when it raises). Several
        ``.backward()`` / ``torch.autograd.grad`` calls in one block add to the same trace;
        nodes that backward creates with ``create_graph=True`` are not hooked: record a second
        backward through them with a second ``record_backward`` on its outputs. Hooks run
        after each node, so a node whose backward raised has no step.

    Example:
        >>> import torch, gradscope as gs
        >>> x = torch.tensor([4.0, -1.0], requires_grad=True)
        >>> y = x.sqrt().sum()
        >>> with gs.record_backward(y, params={"x": x}) as rec:
        ...     y.backward()
        >>> [s.name for s in rec.steps]
        ['SumBackward0', 'SqrtBackward0', 'AccumulateGrad']
        >>> rec.first_nonfinite.name, rec.first_nonfinite.kind
        ('SqrtBackward0', 'nan')
    """
    graph, ids = trace_with_ids(outputs, params, saved=saved, model=model, inputs=inputs)
    roots = [(t.grad_fn, t.output_nr) for _, t in iter_tensors(outputs) if t.grad_fn is not None]
    recorder = _Recorder(ids, roots)
    result = BackwardTrace(graph=graph)
    watch = None
    # one pass over the plain graph (the recorder hooks every node anyway)
    expanded = {n.id for n in graph.nodes if n.compiled is not None and n.compiled.ops}
    if expanded:
        watch = _regions.Watch({nid: fn for fn, nid in ids.items() if nid in expanded})
    recorder.install()
    if watch is not None:
        try:
            watch.install(recorder.handles)
        except BaseException:
            recorder.remove()
            raise
    try:
        yield result
    finally:
        recorder.remove()
        fns = {nid: fn for fn, nid in ids.items()}
        result.steps = recorder.node_steps()
        result.first_nonfinite = _annotate(graph, result.steps, fns, outputs, watch)
        if watch is not None:
            watch.clear()
        recorder.ids = {}
        del ids, fns  # hold no autograd node past the block
