"""Watch the backward pass: engine order, the gradient on every edge, the first NaN/Inf.

``record_backward(outputs)`` walks the graph behind ``outputs`` once (``gs.trace``, so its node
ids are the ones every renderer shows), puts a hook on every node (``grad_fn.register_hook``:
it sees what the node received and returned), and removes them when the block ends, even when
it raises. The hooks only read gradients and return None, so no gradient changes. Statistics
of CPU gradients are read at once; those of accelerator gradients stay on the device while
backward runs and come to the host in one transfer per device when the block ends.

``record_forward()`` notes where each autograd node was created (file, line, code) while the
forward runs, so the first non-finite gradient can name the line of the model's code, at a
fraction of the cost of ``torch.autograd.detect_anomaly``, which formats a full Python stack
for every node and checks every gradient for NaN with a host sync.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import math
import os
import re
import sys
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from ._capture import _trace_with_ids
from ._model import Graph, Node
from ._nest import iter_tensors

#: Key under which ``record_forward`` stamps ``(filename, lineno)`` into ``grad_fn.metadata``.
CREATED_KEY = "gradscope.created_at"
#: Key under which ``torch.autograd.detect_anomaly`` keeps a node's forward stack.
_ANOMALY_KEY = "traceback_"

#: Set once ``record_forward`` has run: until then the recorder does not read
#: ``grad_fn.metadata``, which allocates a dict on every node it is read from.
FORWARD_USED = False


# ---------------------------------------------------------------------------- the records
@dataclass(slots=True)
class GradStat:
    """Statistics of one gradient tensor.

    Attributes:
        shape: the gradient's shape.
        norm: its 2-norm (``torch.linalg.vector_norm``); NaN when any element is NaN.
        max_abs: the largest absolute value; NaN when any element is NaN.
        nan: some element is NaN.
        inf: some element is +Inf or -Inf.
    """

    shape: list[int]
    norm: float
    max_abs: float
    nan: bool
    inf: bool

    @property
    def finite(self) -> bool:
        """No element is NaN or Inf."""
        return not (self.nan or self.inf)

    @property
    def kind(self) -> str | None:
        """``nan``, ``inf`` (NaN wins when both occur) or None."""
        return "nan" if self.nan else "inf" if self.inf else None


@dataclass(slots=True)
class NodeStep:
    """One node the engine ran, in engine order.

    Attributes:
        node_id: the node's id in ``BackwardTrace.graph``.
        name: its class name (``MulBackward0``...).
        grad_outputs: the gradients the node received, one per forward output (None: none came).
        grad_inputs: the gradients it returned, one per ``next_functions`` slot (None: not needed).
            AccumulateGrad returns nothing: its gradient is its ``grad_outputs[0]``.
    """

    node_id: str
    name: str
    grad_outputs: list[GradStat | None]
    grad_inputs: list[GradStat | None]


@dataclass(slots=True)
class NonFinite:
    """The first gradient with a NaN or Inf, in engine order.

    Attributes:
        node_id: id of the node in ``BackwardTrace.graph``.
        name: its class name, as ``detect_anomaly`` names it (``SqrtBackward0``).
        slot: ``grad_inputs[i]`` when the node returned it (the usual case), ``grad_outputs[i]``
            when it arrived from outside the recorded graph (a ``grad_tensors`` argument, a tensor
            hook) or reached an AccumulateGrad.
        kind: ``nan`` or ``inf``.
        traceback: where the node was created: ``file:line: code`` when the forward ran under
            ``gs.record_forward()``, the forward stack when it ran under ``detect_anomaly``,
            else None.
        param: for AccumulateGrad, the name of the parameter that received the gradient.
    """

    node_id: str
    name: str
    slot: str
    kind: str
    traceback: str | None
    param: str | None = None


@dataclass
class BackwardTrace:
    """What ``record_backward`` saw; filled in when its block ends.

    Attributes:
        steps: one ``NodeStep`` per node run, in engine order (over every backward call in the
            block).
        first_nonfinite: the first NaN/Inf gradient, or None.
        graph: the traced graph, annotated: ``Node.order`` (first run, 0 first), ``Edge.grad_norm``
            (norm of the gradient that flowed along the edge), and on nodes whose gradients were
            not finite ``attrs["nonfinite"]`` (``nan``/``inf``), ``attrs["first_nonfinite"]``
            and ``attrs["created_at"]`` where known.
    """

    steps: list[NodeStep] = field(default_factory=list)
    first_nonfinite: NonFinite | None = None
    graph: Graph = field(default_factory=Graph)

    def nonfinite_params(self) -> list[str]:
        """Names of the leaves whose AccumulateGrad received a NaN/Inf gradient, in graph order."""
        leaf_of = {e.src: e.dst for e in self.graph.edges if e.kind == "grad"}
        out = []
        for node in self.graph.nodes:
            if node.kind == "accumulate" and node.attrs.get("nonfinite"):
                leaf = self.graph.node(leaf_of[node.id])
                out.append(leaf.name or leaf.id)
        return out

    def _slot_target(self, bad: NonFinite) -> str:
        """`` -> fc.bias`` when the bad slot flows into a parameter's AccumulateGrad."""
        m = re.fullmatch(r"grad_inputs\[(\d+)\]", bad.slot)
        if m is None:
            return ""
        k = int(m.group(1))
        dst = next((e.dst for e in self.graph.edges if e.src == bad.node_id and e.input_nr == k
                    and e.kind == "grad"), None)
        leaf = next((e.dst for e in self.graph.edges if e.src == dst and e.kind == "grad"), None)
        if dst is None or self.graph.node(dst).kind != "accumulate" or leaf is None:
            return ""
        return f" -> {self.graph.node(leaf).name or leaf}"

    def summary(self) -> str:
        """One line: nodes run, and the first non-finite gradient if any."""
        ran = len({s.node_id for s in self.steps})
        line = f"backward ran {len(self.steps)} node steps ({ran} distinct nodes)"
        bad = self.first_nonfinite
        if bad is None:
            return line + ", all gradients finite"
        where = f" in {bad.param}" if bad.param else self._slot_target(bad)
        line += (
            f"; first non-finite gradient: {bad.kind} from {bad.name} ({bad.node_id}) "
            f"{bad.slot}{where}"
        )
        if bad.traceback and "\n" not in bad.traceback:
            line += f", created at {bad.traceback}"
        return line


# ---------------------------------------------------------------------------- statistics
def _flat(g: torch.Tensor) -> torch.Tensor | None:
    """``g`` detached, dense, and of a type ``vector_norm`` takes; None when empty."""
    d = g.detach()
    if d.layout != torch.strided:
        d = d.coalesce().values() if d.is_sparse else d.to_dense()
    if d.numel() == 0:
        return None
    if not (d.is_floating_point() or d.is_complex()):
        d = d.double()
    return d


def _norm_kw(d: torch.Tensor) -> dict[str, Any]:
    # Half/bfloat16 norms are computed in float32 so a finite gradient never reads as Inf.
    return {"dtype": torch.float32} if d.dtype in (torch.float16, torch.bfloat16) else {}


_PLAIN = (torch.float32, torch.float64)
_norm = torch.linalg.vector_norm


def _stat_now(g: torch.Tensor) -> GradStat:
    """Statistics of a CPU gradient, read at once (a host read costs nothing on the CPU)."""
    if g.is_floating_point() and g.layout == torch.strided and g.numel():
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
    if not isinstance(g, torch.Tensor):
        return None
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
        self.handles: list[Any] = []
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
                self.handles.append(fn.register_hook(hook))
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
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
def _created_at(fn: Any) -> str | None:
    """``file:line: code`` recorded by ``record_forward`` for ``fn``, or None."""
    loc = fn.metadata.get(CREATED_KEY)
    if loc is None:
        return None
    return _location_text(*loc)


@functools.lru_cache(maxsize=4096)
def _location_text(filename: str, lineno: int) -> str:
    code = linecache.getline(filename, lineno).strip()
    return f"{_short_path(filename)}:{lineno}: {code}"


def _short_path(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        return filename
    return filename if rel.startswith("..") else rel


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
    graph: Graph, steps: list[NodeStep], fns: dict[str, Any], outputs: Any
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
    if FORWARD_USED:
        for nid, fn in fns.items():
            where = _created_at(fn)
            if where:
                graph.node(nid).attrs["created_at"] = where
    for step in steps:
        node = graph.node(step.node_id)
        kind = _bad_kind(step, node)
        if kind and node.attrs.get("nonfinite") != "nan":
            node.attrs["nonfinite"] = kind
    return _first_record(graph, steps, fns)


def _first_record(graph: Graph, steps: list[NodeStep], fns: dict[str, Any]) -> NonFinite | None:
    found = _find_first(steps, graph)
    if found is None:
        return None
    step, slot, kind = found
    node = graph.node(step.node_id)
    node.attrs.setdefault("nonfinite", kind)
    node.attrs["first_nonfinite"] = "true"
    param = None
    if node.kind == "accumulate":
        leaf = next(graph.node(e.dst) for e in graph.edges if e.src == node.id)
        param = leaf.name or None
    where = node.attrs.get("created_at") or _anomaly_stack(fns[node.id])
    return NonFinite(node.id, node.name, slot, kind, where, param)


@contextlib.contextmanager
def record_backward(
    outputs: Any, *, params: Any = None, model: Any = None, saved: bool = False
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
    graph, ids = _trace_with_ids(outputs, params, saved=saved, model=model)
    roots = [(t.grad_fn, t.output_nr) for _, t in iter_tensors(outputs) if t.grad_fn is not None]
    recorder = _Recorder(ids, roots)
    result = BackwardTrace(graph=graph)
    recorder.install()
    try:
        yield result
    finally:
        recorder.remove()
        fns = {nid: fn for fn, nid in ids.items()}
        result.steps = recorder.node_steps()
        result.first_nonfinite = _annotate(graph, result.steps, fns, outputs)
        recorder.ids = {}
        del ids, fns  # hold no autograd node past the block


# ---------------------------------------------------------------------------- forward lines
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_OWN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_INTERNAL: dict[str, bool] = {}  # by file name: hashing a code object hashes its bytecode
_APPLY_CODE = torch.autograd.Function.apply.__func__.__code__  # type: ignore[attr-defined]
_ACCUMULATE_SEQ = 2**64 - 1  # AccumulateGrad nodes carry UINT64_MAX as sequence number
_CUSTOM_BASE = torch.autograd.function.BackwardCFunction
_UNSET = object()


def _internal(filename: str) -> bool:
    hit = _INTERNAL.get(filename)
    if hit is None:
        hit = filename.startswith((_TORCH_DIR, "<frozen"))
        _INTERNAL[filename] = hit
    return hit


def _user_frame(frame: Any) -> Any:
    """The innermost frame outside torch: the user's line. None when torch code was called by
    gradscope itself (the CLI running an ``nn.Linear`` from a model file): no line of the
    user's made that node, and the line that called gradscope would only mislead."""
    while frame is not None and _internal(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is not None and frame.f_code.co_filename.startswith(_OWN_DIR):
        return None
    return frame


def _next_sequence_nr() -> int:
    """The sequence number the next autograd node created on this thread will get."""
    with torch.enable_grad():
        probe = torch.empty(0, requires_grad=True).view(0)
    return probe.grad_fn._sequence_nr() + 1  # type: ignore[union-attr]


class _ForwardMode(TorchFunctionMode):
    """Stamps each autograd node created by a torch call with the user's file and line.

    Nodes are numbered (``_sequence_nr``) in creation order per thread: a call whose output node
    is numbered right after the last one stamped created just that node, so only calls that
    skipped numbers (composite ops, custom Functions) need a look at the nodes below.
    """

    def __init__(self) -> None:
        super().__init__()
        self.start = _next_sequence_nr()
        self.last = self.start - 1

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if torch.is_grad_enabled():
            self._stamp_outputs(out)
        else:
            self._stamp_custom()  # custom Function forwards run with grad disabled
        return out

    def _stamp_outputs(self, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            fns = [out.grad_fn]
        elif isinstance(out, (tuple, list)):
            fns = [t.grad_fn for t in out if isinstance(t, torch.Tensor)]
        else:
            return
        loc: Any = _UNSET
        for fn in fns:
            if fn is None:
                continue
            seq = fn._sequence_nr()
            if seq <= self.last or seq == _ACCUMULATE_SEQ:
                continue  # made before this call (or a leaf's AccumulateGrad): not this line's
            if loc is _UNSET:
                # frame 2 is the caller of __torch_function__; None (no user line) is stamped
                # too, so that the next call does not take these nodes for its own
                frame = _user_frame(sys._getframe(2))
                loc = None if frame is None else (frame.f_code.co_filename, frame.f_lineno)
            fn.metadata[CREATED_KEY] = loc
            if seq > self.last + 1:
                self._stamp_below(fn, loc, seq - self.last - 1)
            self.last = max(self.last, seq)

    def _stamp_below(self, top: Any, loc: tuple[str, int] | None, missing: int) -> None:
        """Stamp the ``missing`` nodes numbered between the last stamped one and ``top``: nodes
        created since the block began, not yet stamped, below ``top``."""
        stack = [nxt for nxt, _ in top.next_functions]
        while stack and missing > 0:
            fn = stack.pop()
            if fn is None or not self.start <= fn._sequence_nr() < _ACCUMULATE_SEQ:
                continue
            meta = fn.metadata
            if CREATED_KEY in meta:
                continue
            meta[CREATED_KEY] = loc
            missing -= 1
            stack.extend(nxt for nxt, _ in fn.next_functions)

    def _stamp_custom(self) -> None:
        """Inside a custom Function's forward, stamp its node (``ctx``) with the line that
        called ``.apply``."""
        frame = _user_frame(sys._getframe(2))
        caller = frame.f_back if frame is not None else None
        if caller is None or caller.f_code is not _APPLY_CODE or not frame.f_code.co_varnames:
            return
        ctx = frame.f_locals.get(frame.f_code.co_varnames[0])
        if not isinstance(ctx, _CUSTOM_BASE) or CREATED_KEY in ctx.metadata:
            return
        site = _user_frame(caller)
        if site is not None:
            ctx.metadata[CREATED_KEY] = (site.f_code.co_filename, site.f_lineno)


@contextlib.contextmanager
def record_forward() -> Iterator[None]:
    """Record where each autograd node created in the block comes from (file, line, code).

    ``record_backward`` then puts ``file:line: code`` on ``NonFinite.traceback`` and on
    ``node.attrs["created_at"]``. Only the innermost frame outside torch is kept, so it costs
    far less than ``torch.autograd.detect_anomaly`` (see ``benchmarks/backward.py``).

    Example:
        >>> import torch, gradscope as gs
        >>> x = torch.tensor([-1.0], requires_grad=True)
        >>> with gs.record_forward():
        ...     y = torch.where(x > 0, x.sqrt(), 0.0).sum()
        >>> with gs.record_backward(y) as rec:
        ...     y.backward()
        >>> rec.first_nonfinite.name
        'SqrtBackward0'
    """
    global FORWARD_USED
    FORWARD_USED = True
    with _ForwardMode():
        yield
