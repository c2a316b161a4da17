"""``torch.compile`` support: reading a compiled region, and (in ``dynamo``, whose names are
importable from here) staying invisible to Dynamo.

Every compiled graph that needs a backward is a ``CompiledFunction`` (an ``autograd.Function``
built by AOTAutograd); its backward node is a ``CompiledFunctionBackward``. ``read_region``
reads that node's AOTAutograd backward FX graph (``_forward_cls._lazy_backward_info.bw_module``,
kept uncompiled for both ``aot_eager`` and inductor, whose backward is compiled lazily on the
first backward) into a ``RegionGraph`` of plain data: one ``RegionOp`` per aten op, where its
tensor inputs come from (another op, a tangent, a saved activation), its module path and forward
line from the FX metadata (``fwd_nn_module_stack`` / ``nn_module_stack``, ``stack_trace``), the
saved activations (placeholder names, shapes, dtypes) and which op produces each gradient the
node returns. On a torch that lacks the AOTAutograd internals read here
(``torchcompat.aot_region_support``), or when the graph is not kept, the ``RegionGraph`` is
opaque and says why in one line; nothing here raises on user programs.

``first_nonfinite_op`` re-runs a region's backward graph op by op (``torch.fx.Interpreter``) on
the inputs the node received, to name the aten op that first produced a NaN/Inf.

The torch internals are read through ``torchcompat`` (probed by feature, not by version; tested
on torch 2.13 and 2.14). Together with ``dynamo`` (``compiling``, ``eager_only``,
``ModuleHooks``, ``unwrap``, ``plain_name``, the torch-function-mode helpers), this is the one
place that reads Dynamo's and AOTAutograd's internals.
"""

from __future__ import annotations

import functools
import operator
import re
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from .._torch import torchcompat
from . import paths

REGION_NODE = "CompiledFunctionBackward"
#: The module-path component of a compiled region (``<compiled>``, ``<compiled>#1``...).
REGION_PART = paths.REGION_PART
#: The class name shown for that level (``module_classes``).
REGION_CLASS = "torch.compile region"


torch_version = torchcompat.torch_version


# ====================================================================== compiled regions
@dataclass(frozen=True, slots=True)
class Ref:
    """Where a tensor of a region's backward graph comes from.

    Attributes:
        kind: ``op`` (an aten op of the region), ``tangent`` (a gradient the node received),
            ``saved`` (an activation saved in the forward).
        index: the op's index in ``RegionGraph.ops``, the tangent's index in
            ``RegionGraph.tangents``, or the saved tensor's in ``RegionGraph.saved``.
        slot: which output of a multi-output op (``getitem`` nodes are folded into this).
    """

    kind: str
    index: int
    slot: int = 0


@dataclass(slots=True)
class RegionOp:
    """One aten op of a region's backward graph.

    Attributes:
        name: the op as torch prints it, ``aten.mm.default``.
        fx_name: the FX node's name (``mm_2``).
        inputs: its tensor inputs, in argument order.
        attrs: its other arguments by schema name, as strings (``dims`` -> ``[1, 0]``).
        modules: the module stack of the forward op it belongs to, outer to inner:
            ``(module id, Dynamo's path, class name)``.
        location: ``(filename, line, code)`` of the forward line, from ``stack_trace``.
    """

    name: str
    fx_name: str
    inputs: list[Ref]
    attrs: dict[str, str]
    modules: tuple[tuple[str, str, str], ...] = ()
    location: tuple[str, int, str] | None = None


@dataclass(slots=True)
class SavedSlot:
    """An activation the region saved for backward (a placeholder of the backward graph)."""

    name: str
    shape: list[int | None] | None
    dtype: str | None


@dataclass
class RegionGraph:
    """What ``read_region`` read of one compiled region; plain data.

    Attributes:
        aot_id: AOTAutograd's id of the compiled graph, or None.
        ops: the aten ops, in graph order; empty when opaque.
        saved: the saved activations, in the order the node holds them.
        tangents: per tangent placeholder, ``(name, index in the node's grad_outputs)``.
        outputs: per ``next_functions`` slot, where that gradient comes from (None: no
            gradient for that input).
        opaque: the backward graph could not be read; ``note`` says why.
        note: one line for the reader (why opaque, or what metadata is missing), else None.
    """

    aot_id: int | None = None
    ops: list[RegionOp] = field(default_factory=list)
    saved: list[SavedSlot] = field(default_factory=list)
    tangents: list[tuple[str, int]] = field(default_factory=list)
    outputs: list[Ref | None] = field(default_factory=list)
    opaque: bool = False
    note: str | None = None


def is_region(fn: Any) -> bool:
    """``fn`` is the backward node of a compiled region."""
    return type(fn).__name__ == REGION_NODE


# per CompiledFunction class: its RegionGraph, read once (the graph of a class never changes,
# but inductor's cache may strip its metadata later, so the first read is the one to keep)
_REGIONS: weakref.WeakKeyDictionary[Any, RegionGraph] = weakref.WeakKeyDictionary()


def read_region(fn: Any) -> RegionGraph:
    """The backward graph of the compiled region whose backward node is ``fn``.

    Never raises: an unreadable region comes back opaque, with a one-line ``note``.
    """
    cls = getattr(fn, "_forward_cls", None)
    if cls is None:
        return RegionGraph(opaque=True, note="not a compiled region's backward node")
    try:
        cached = _REGIONS.get(cls)
    except TypeError:
        cached = None
    if cached is not None:
        return cached
    n_inputs = len(fn.next_functions)

    def opaque(note: str) -> RegionGraph:
        return RegionGraph(aot_id=torchcompat.aot_id(cls), outputs=[None] * n_inputs,
                           opaque=True, note=f"drawn opaque: {note}")

    unsupported = torchcompat.aot_region_support()
    if unsupported is not None:
        region = opaque(unsupported)
    else:
        try:
            region = _read(cls, n_inputs)
        except Exception as exc:  # internals we did not expect: say so, never fail a trace
            first = str(exc).splitlines()[0] if str(exc) else ""
            region = opaque(f"could not read its AOTAutograd backward graph "
                            f"({type(exc).__name__}: {first})")
    try:
        _REGIONS[cls] = region
    except TypeError:
        pass
    return region


def remember(fn: Any) -> None:
    """Read ``fn``'s region now, while its FX metadata is intact (inductor's autograd cache
    clears it when it saves the compiled backward), so later traces see module paths."""
    if is_region(fn):
        read_region(fn)


backward_module = torchcompat.aot_backward_module


def _read(cls: Any, n_inputs: int) -> RegionGraph:
    aot = torchcompat.aot_region(cls)
    aot_id = aot.aot_id
    gm = aot.graph
    if gm is None:
        return RegionGraph(
            aot_id=aot_id,
            outputs=[None] * n_inputs,
            opaque=True,
            note="drawn opaque: AOTAutograd kept no backward graph for this region "
            "(compiled autograd, or a cache entry without one)",
        )
    placeholders = list(gm.graph.find_nodes(op="placeholder"))
    n_sym = aot.n_symints
    tangent_of = aot.tangent_slots
    n_tangents = len(tangent_of)
    n_opaque = aot.n_opaque
    first_tangent = next(
        (i for i, p in enumerate(placeholders) if torchcompat.is_tangent(p)), None
    )
    if first_tangent is None:  # no gradient flows in (all outputs non-differentiable)
        first_tangent = len(placeholders) - aot.n_trailing
    n_saved = first_tangent - n_sym - n_opaque
    if n_saved < 0:
        raise ValueError(f"{len(placeholders)} placeholders, {n_sym} symints, tangent at "
                         f"{first_tangent}")
    refs: dict[Any, Ref] = {}
    saved: list[SavedSlot] = []
    for k, p in enumerate(placeholders[n_sym : n_sym + n_saved]):
        refs[p] = Ref("saved", k)
        saved.append(SavedSlot(p.name, *_shape_dtype(p)))
    tangents: list[tuple[str, int]] = []
    for j, p in enumerate(placeholders[first_tangent : first_tangent + n_tangents]):
        refs[p] = Ref("tangent", j)
        tangents.append((p.name, tangent_of[j]))
    ops: list[RegionOp] = []
    with_meta = False
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is operator.getitem and node.args and node.args[0] in refs:
            src = refs[node.args[0]]
            if src.kind == "op" and isinstance(node.args[1], int):
                refs[node] = Ref("op", src.index, node.args[1])
                continue
        op = _region_op(node, refs)
        with_meta = with_meta or bool(op.modules or op.location)
        refs[node] = Ref("op", len(ops))
        ops.append(op)
    out_node = next(iter(gm.graph.find_nodes(op="output")))
    values = out_node.args[0] if out_node.args else ()
    values = list(values) if isinstance(values, (tuple, list)) else [values]
    outputs = [refs.get(v) if isinstance(v, torch.fx.Node) else None for v in values[:n_inputs]]
    outputs += [None] * (n_inputs - len(outputs))
    note = None
    if ops and not with_meta:
        note = (
            "no module paths or source lines: AOTAutograd's cache keeps none (set "
            "torch._functorch.config.enable_autograd_cache = False, or trace before the "
            "first backward)"
        )
    return RegionGraph(aot_id, ops, saved, tangents, outputs, False, note)


def _shape_dtype(node: Any) -> tuple[list[int | None] | None, str | None]:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        shape: list[int | None] | None
        try:
            shape = [int(s) for s in val.shape]
        except (TypeError, ValueError):  # symbolic sizes
            shape = None
        return shape, str(val.dtype).removeprefix("torch.")
    tm = node.meta.get("tensor_meta")
    if tm is not None and hasattr(tm, "shape"):
        try:
            return [int(s) for s in tm.shape], str(tm.dtype).removeprefix("torch.")
        except (TypeError, ValueError):
            return None, str(tm.dtype).removeprefix("torch.")
    return None, None


def _op_name(target: Any) -> str:
    if torchcompat.is_op_overload(target):
        return str(target)  # aten.mm.default
    mod = getattr(target, "__module__", "") or ""
    name = getattr(target, "__name__", None) or str(target)
    return f"{mod.removeprefix('_operator').strip('.') or 'operator'}.{name}" if mod else name


def _region_op(node: Any, refs: dict[Any, Ref]) -> RegionOp:
    inputs: list[Ref] = []
    attrs: dict[str, str] = {}
    schema = getattr(node.target, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    for i, arg in enumerate(node.args):
        label = names[i] if i < len(names) else f"arg{i}"
        _add_arg(label, arg, refs, inputs, attrs)
    for key, arg in node.kwargs.items():
        _add_arg(key, arg, refs, inputs, attrs)
    stack = node.meta.get("fwd_nn_module_stack") or node.meta.get("nn_module_stack") or {}
    modules = tuple(
        (str(key), str(val[0]), _class_name(val[1]))
        for key, val in stack.items()
        if isinstance(val, tuple) and len(val) >= 2
    )
    return RegionOp(
        _op_name(node.target), node.name, inputs, attrs, modules,
        _last_frame(node.meta.get("stack_trace")),
    )


def _add_arg(label: str, arg: Any, refs: dict[Any, Ref], inputs: list[Ref],
             attrs: dict[str, str]) -> None:
    if isinstance(arg, torch.fx.Node):
        ref = refs.get(arg)
        if ref is not None:
            inputs.append(ref)
        else:  # a symint placeholder or a value computed from one
            attrs[label] = arg.name
        return
    if isinstance(arg, (list, tuple)) and any(isinstance(a, torch.fx.Node) for a in arg):
        parts = []
        for a in arg:
            if isinstance(a, torch.fx.Node) and a in refs:
                inputs.append(refs[a])
                parts.append(a.name)
            else:
                parts.append(str(getattr(a, "name", a)))
        attrs[label] = "[" + ", ".join(parts) + "]"
        return
    attrs[label] = str(arg)


def _class_name(cls: Any) -> str:
    return cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1]


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n([^\n]*)')


def _last_frame(stack: Any) -> tuple[str, int, str] | None:
    """The innermost ``File "f", line n, in fn`` entry of an FX ``stack_trace``, with its code
    line (the forward line that created the op)."""
    if not stack or not isinstance(stack, str):
        return None
    found = _FRAME.findall(stack)
    if not found:
        return None
    filename, line, code = found[-1]
    return filename, int(line), code.strip()


_TOKEN = re.compile(r"""^(?:L|G)\[['"]([^'"]+)['"]\]""")


@functools.lru_cache(maxsize=8192)
def dynamo_path(path: str) -> str:
    """Dynamo's module source (``L['self'].layers[0]``) as a dotted path relative to the
    compiled module (``layers.0``); a module held by another variable keeps its name
    (``G['model'].fc1`` -> ``model.fc1``).

    Example:
        >>> dynamo_path("L['self'].layers.0.attn")
        'layers.0.attn'
        >>> dynamo_path("G['model'].fc1")
        'model.fc1'
    """
    m = _TOKEN.match(path)
    rest = path
    head = ""
    if m is not None:
        rest = path[m.end():]
        if m.group(1) not in ("self", "fn", "mod"):
            head = m.group(1)
    rest = _dotted(rest)
    return ".".join(p for p in (head, rest) if p)


@functools.lru_cache(maxsize=8192)
def compiled_relative(path: str) -> str | None:
    """Dynamo's module source as a path below the compiled module itself
    (``L['self'].layers[0]`` -> ``layers.0``, ``L['fn']`` -> ""), or None when the source is
    some other variable (a global model called by a compiled function).

    Example:
        >>> compiled_relative("L['fn'].0"), compiled_relative("G['model'].fc1")
        ('0', None)
    """
    m = _TOKEN.match(path)
    if m is None or m.group(1) not in ("self", "fn", "mod"):
        return None
    return _dotted(path[m.end():])


def _dotted(rest: str) -> str:
    rest = re.sub(r"\._modules\[['\"]([^'\"]+)['\"]\]", r".\1", rest)
    rest = re.sub(r"\[['\"]?([^\]'\"]+)['\"]?\]", r".\1", rest)
    return rest.lstrip(".")


# ====================================================================== replaying a region
@dataclass(slots=True)
class RegionInputs:
    """What a region's backward node had when it ran: enough to run its graph again."""

    saved: list[Any]
    symints: list[Any]
    opaque: list[Any]


def capture_inputs(fn: Any) -> RegionInputs | None:
    """The saved tensors, symints and opaque objects of a region's backward node, read before
    it runs (backward frees them); the ones AOTAutograd may donate to the compiled backward
    (which may overwrite them) are copied. None when they cannot be read."""
    try:
        saved, symints, opaque = torchcompat.region_saved(fn)
    except RuntimeError:
        return None
    donated = torchcompat.aot_donated(fn._forward_cls)
    n_sym = len(symints)
    for idx in donated:
        k = idx - n_sym
        if 0 <= k < len(saved) and isinstance(saved[k], torch.Tensor):
            saved[k] = saved[k].clone()
    return RegionInputs(saved, symints, opaque)


def first_nonfinite_op(fn_cls: Any, inputs: RegionInputs, grad_outputs: Iterable[Any]
                       ) -> tuple[int, str] | None:
    """Run the region's backward graph again on ``inputs`` and the ``grad_outputs`` the node
    received, op by op, and find where its non-finite gradients come from: among the ops whose
    output is not finite and that feed a non-finite gradient the region returns, the first to
    run. Returns ``(index in RegionGraph.ops, "nan"/"inf")``, or None when the re-run finds
    none (the compiled kernels may differ from the aten ops: the region is then the answer).
    """
    gm = backward_module(fn_cls)
    region = _REGIONS.get(fn_cls)
    if gm is None or region is None or region.opaque:
        return None
    prologue = torchcompat.aot_prologue(fn_cls)
    if prologue is None:
        return None
    index = {op.fx_name: i for i, op in enumerate(region.ops)}
    finder = _NonFiniteFinder(gm)
    with torch.no_grad():
        try:
            args = prologue(list(inputs.saved), inputs.symints, inputs.opaque, list(grad_outputs))
            finder.run(*args)
        except Exception:  # the aten graph would not run on these inputs: no answer
            return None
    return finder.origin(index)


class _NonFiniteFinder(torch.fx.Interpreter):
    """Runs the graph, noting which nodes produced a NaN/Inf (values are freed as it goes)."""

    def __init__(self, gm: Any) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.bad: dict[Any, str] = {}
        self.order: dict[Any, int] = {}

    def run_node(self, n: Any) -> Any:
        result = super().run_node(n)
        self.order[n] = len(self.order)
        if n.op in ("call_function", "placeholder"):
            kind = _nonfinite(result)
            if kind is not None:
                self.bad[n] = kind
        return result

    def origin(self, index: dict[str, int]) -> tuple[int, str] | None:
        out = next(iter(self.graph.find_nodes(op="output")))
        values = out.args[0] if isinstance(out.args[0], (tuple, list)) else [out.args[0]]
        stack = [v for v in values if isinstance(v, torch.fx.Node) and v in self.bad]
        seen: set[Any] = set()
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            stack.extend(a for a in n.all_input_nodes if a in self.bad)
        ops = [n for n in seen if n.op == "call_function"]
        # a getitem of a multi-output op stands for that op
        named = [(self.order[n], n if n.name in index else n.args[0]) for n in ops]
        named = [(o, n) for o, n in named if isinstance(n, torch.fx.Node) and n.name in index]
        if not named:
            return None
        _, first = min(named, key=lambda x: x[0])
        return index[first.name], self.bad.get(first, "nan")


def _nonfinite(value: Any) -> str | None:
    tensors = value if isinstance(value, (list, tuple)) else (value,)
    kind = None
    for t in tensors:
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) and t.numel():
            if bool(torch.isnan(t).any()):
                return "nan"
            if bool(torch.isinf(t).any()):
                kind = "inf"
    return kind
