"""Every read of torch's private internals, in one place, behind feature detection.

gradscope runs on the torch versions CI tests (2.13 and 2.14) and degrades on others: each
internal it needs is looked up by what it is (an attribute, a callable, a class), never by the
version number, and when one is missing the feature that needs it is switched off with a
one-line note (``notes()``), never an ``ImportError``, ``AttributeError`` or traceback.

What is read here, and what happens without it:

- the torch function mode stack (``torch._C._len_torch_function_stack`` and friends):
  ``record_forward`` takes its mode off the stack while a ``torch.compile`` wrapper runs;
  without it the mode stays on (Dynamo may then guard on it and recompile).
- the autograd sequence counter (``torch._C._autograd._get_sequence_nr``): which nodes a
  module created; without it a probe tensor is made to read the counter (slower).
- the saved-tensor default hooks stack (``torch._C._autograd._push_saved_tensors_default_hooks``
  ...): ``saved_memory`` / ``leak_check``; without it they raise a one-line ``MemoryHooksError``.
- a storage's address (``torch._C._storage_address``), else ``untyped_storage()._cdata``.
- Dynamo's frame-skipping and compile callbacks (``torch._dynamo.eval_frame``,
  ``torch._dynamo.callback``): gradscope's hooks stay out of compiled code; without them the
  hooks still return at once when traced.
- a custom Function's forward: ``ctx._forward_cls.forward`` (the frame of a running forward is
  recognised by its code object, so it works whether ``Function.apply`` is a Python method,
  as up to torch 2.13, or a builtin, as from 2.14, where the user's line calls ``forward``
  directly).
- AOTAutograd's record of a compiled region (``CompiledFunction._lazy_backward_info``,
  ``.metadata``, ``torch._functorch._aot_autograd.schemas.OutputType``...): ``aot_region``
  reads it into plain values; when something it needs is missing, the region is drawn opaque
  with the note ``aot_region_support()`` gives.

The documented ``grad_fn._saved_*`` / ``_raw_saved_*`` attributes, ``metadata``,
``_sequence_nr()`` and ``next_functions`` are read directly where they are used.
"""

from __future__ import annotations

import contextlib
import inspect
import operator
import re
import sys
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

_C: Any = torch._C
_AUTOGRAD: Any = getattr(_C, "_autograd", None)

# ---------------------------------------------------------------------------- notes
_NOTES: dict[str, str] = {}


def note(key: str, text: str) -> None:
    """Record that feature ``key`` is off on this torch, with one line saying what is lost."""
    _NOTES.setdefault(key, f"{text} (torch {torch.__version__})")


def notes(*keys: str) -> list[str]:
    """One line per feature this torch lacks (in the order they were found; only ``keys``
    when given), else []."""
    return [text for key, text in _NOTES.items() if not keys or key in keys]


def torch_version() -> tuple[int, int]:
    """``(major, minor)`` of the running torch (for messages only: features are probed)."""
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _get(obj: Any, *names: str) -> Any:
    for name in names:
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


# ---------------------------------------------------------------------------- function modes
_stack_len: Any = getattr(_C, "_len_torch_function_stack", None)
_stack_at: Any = getattr(_C, "_get_function_stack_at", None)
_stack_pop: Any = getattr(_C, "_pop_torch_function_stack", None)
_stack_push: Any = getattr(_C, "_push_on_torch_function_stack", None)
HAS_MODE_STACK = None not in (_stack_len, _stack_at, _stack_pop, _stack_push)


def mode_on_top(mode: Any) -> bool:
    """``mode`` is the innermost torch function mode (False when the stack cannot be read)."""
    if not HAS_MODE_STACK:
        note("mode-stack", "the torch function mode stack cannot be read: record_forward "
             "stays on while torch.compile'd modules run (Dynamo may recompile)")
        return False
    n = _stack_len()
    return bool(n > 0 and _stack_at(n - 1) is mode)


def pop_mode() -> Any:
    """Pop the innermost torch function mode (only after ``mode_on_top`` said True)."""
    return _stack_pop()


def push_mode(mode: Any) -> None:
    _stack_push(mode)


# ---------------------------------------------------------------------------- sequence numbers
def _probe_sequence_nr() -> int:
    # (inference mode off for the probe: under it no tensor gets a grad_fn)
    with torch.inference_mode(False), torch.enable_grad():
        probe = torch.empty(0, requires_grad=True).view(0)
    return int(probe.grad_fn._sequence_nr()) + 1  # type: ignore[union-attr]


#: The sequence number the next autograd node created on this thread will get, read without
#: making a node (None where this torch has no such getter).
sequence_nr_getter: Callable[[], int] | None = _get(_AUTOGRAD, "_get_sequence_nr")

#: The same, on every torch (where there is no getter, a probe makes one node to read it).
next_sequence_nr: Callable[[], int] = sequence_nr_getter or _probe_sequence_nr


# ---------------------------------------------------------------------------- saved-tensor hooks
_hooks_enabled: Any = _get(_AUTOGRAD, "_saved_tensors_hooks_is_enabled")
_hooks_push: Any = _get(_AUTOGRAD, "_push_saved_tensors_default_hooks")
_hooks_top: Any = _get(_AUTOGRAD, "_top_saved_tensors_default_hooks")
_hooks_pop: Any = _get(_AUTOGRAD, "_pop_saved_tensors_default_hooks")
HAS_SAVED_HOOKS = None not in (_hooks_enabled, _hooks_push, _hooks_top, _hooks_pop)


def tensor_version(t: torch.Tensor) -> int | None:
    """``t``'s version counter (bumped by every in-place change), or None where this torch's
    tensors have none (in-place changes then go unseen; noted); None for an inference tensor,
    which has no counter (reading it raises)."""
    try:
        version = getattr(t, "_version", None)
    except RuntimeError:
        return None
    if isinstance(version, int):
        return version
    note("tensor_version", "tensors have no _version: checkpoint plans cannot tell modules "
         "that change their input in place")
    return None


_version_of = operator.attrgetter("_version")
#: ``t._version`` at C speed, for a hot path that falls back to ``tensor_versions`` itself
#: when it raises (an inference tensor's; a torch whose tensors have none)
version_of: Callable[[torch.Tensor], int | None] = _version_of


def tensor_versions(tensors: Sequence[torch.Tensor]) -> list[int | None]:
    """``tensor_version`` of each tensor, at C speed where this torch's tensors all have one
    (a monitor reads thousands of gradients' versions per logged step; the doctor, every op's
    arguments'). An inference tensor's raises: then each is asked as ``tensor_version`` does."""
    try:
        return list(map(_version_of, tensors))
    except (AttributeError, RuntimeError):
        return [tensor_version(t) for t in tensors]


# ---------------------------------------------------------------------------- profiler, dispatch
#: The profiler's event type of an allocation (``_EventType.Allocation``), or None where this
#: torch's profiler has none (memory measured by the profiler is then unavailable).
PROFILER_ALLOCATION: Any = _get(_C, "_profiler", "_EventType", "Allocation")


def current_autograd_node() -> Any:
    """The autograd node the engine is running on this thread (in a backward), or None
    (also where this torch cannot say: step memory then names backward ops by aten op only,
    noted)."""
    fn = getattr(_C, "_current_autograd_node", None)
    if fn is None:
        note("current_autograd_node", "the engine does not name the running node: step "
             "memory names backward ops by their aten op only")
        return None
    return fn()


def torch_dispatch_disabled() -> Any:
    """A context in which no ``TorchDispatchMode`` sees the calls (a kernel measured beside
    the step recorder's own mode), or a no-op context where this torch has none (noted)."""
    cls = getattr(_C, "_DisableTorchDispatch", None)
    if cls is None:
        note("disable_torch_dispatch", "dispatch modes cannot be paused: a kernel's workspace "
             "is measured with the step recorder's mode on")
        return contextlib.nullcontext()
    return cls()


def node_metadata(node: Any) -> dict[str, Any] | None:
    """``node.metadata`` (a dict per autograd node), or None where this torch's nodes have
    none (checkpoint plans then offer no segments; noted)."""
    meta = getattr(node, "metadata", None)
    if isinstance(meta, dict):
        return meta
    note("node_metadata", "autograd nodes have no metadata: checkpoint plans offer no "
         "segments of sibling modules")
    return None


def forget_kwargs_flag(handle: Any) -> None:
    """After ``handle.remove()`` of a global forward hook registered ``with_kwargs=True``: torch
    (2.13, 2.14) leaves the hook's id in ``_global_forward_hooks_with_kwargs``, which makes every
    later ``torch.compile(module)`` warn about global hooks. Drops it (nothing where the table
    is absent)."""
    flags = getattr(torch.nn.modules.module, "_global_forward_hooks_with_kwargs", None)
    if isinstance(flags, dict):
        flags.pop(handle.id, None)


def saved_hooks_missing() -> str | None:
    """None when the saved-tensor hook stack can be used, else why not (one line)."""
    if HAS_SAVED_HOOKS:
        return None
    return (f"this torch ({torch.__version__}) has no saved-tensor hook stack that gradscope "
            "can read; saved_memory and leak_check are unavailable")


def saved_hooks_enabled() -> bool:
    return bool(_hooks_enabled())


def push_saved_hooks(pack: Callable[..., Any], unpack: Callable[..., Any]) -> None:
    _hooks_push(pack, unpack)


def top_saved_hooks() -> Any:
    """``(pack, unpack)`` of the innermost default saved-tensor hooks, or None."""
    return _hooks_top(False)


def pop_saved_hooks() -> None:
    _hooks_pop()


# ---------------------------------------------------------------------------- torch.func
#: Whether a tensor is a torch.func transform's wrapper (vmap, grad): its values cannot be
#: checked from outside the transform. Without the probe, no tensor is taken for one.
is_functorch_wrapped: Callable[[torch.Tensor], bool] = (
    _get(_C, "_functorch", "is_functorch_wrapped_tensor") or (lambda t: False)
)


# ---------------------------------------------------------------------------- the monitor
def _no_graph_task() -> int:
    note("graph_task_id", "the autograd graph task id cannot be read: GradMonitor ends a "
         "step at the callback it queued, and a backward that raised can delay the next one")
    return -2


#: The id of the autograd graph task running on this thread (one per backward call).
current_graph_task_id: Callable[[], int] = _get(_C, "_current_graph_task_id") or _no_graph_task

_engine: Any = _get(torch.autograd, "Variable", "_execution_engine")
#: Queue ``fn`` to run when the current backward's graph task ends (the autograd engine's
#: final callbacks; what DDP queues its gradient averaging with).
queue_engine_callback: Callable[[Callable[[], None]], None] | None = _get(
    _engine, "queue_callback"
)

#: A guard for inference mode without ``torch.inference_mode``'s Python wrapper (it costs a
#: few microseconds per use, on every logged step).
inference_mode: Callable[[bool], Any] = (
    getattr(_C, "_InferenceMode", None) or torch.inference_mode
)


_DTENSOR: list[Any] = []  # torch's DTensor class (or None), imported on first use


def dtensor_type() -> Any:
    """torch's ``DTensor`` class (FSDP2 and tensor parallelism), or None where
    ``torch.distributed`` has none; imported on first use, not at gradscope's import."""
    if not _DTENSOR:
        try:
            from torch.distributed.tensor import DTensor
        except ImportError:  # pragma: no cover - torch without distributed
            DTensor = None  # type: ignore[assignment,misc]  # noqa: N806
        _DTENSOR.append(DTensor)
    return _DTENSOR[0]


def is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a DTensor."""
    cls = _DTENSOR[0] if _DTENSOR else dtensor_type()
    return cls is not None and isinstance(t, cls)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor (its shard on this process, without ``to_local()``'s
    autograd view); other tensors as they are."""
    inner = getattr(t, "_local_tensor", None)
    return inner if inner is not None else t


def grad_scaler_scale(scaler: Any) -> torch.Tensor | None:
    """A ``torch.amp.GradScaler``'s scale as a device tensor (no host sync), or None before
    its first ``scale()``; where the tensor cannot be read, ``get_scale()`` (a host sync;
    noted)."""
    scale = getattr(scaler, "_scale", False)
    if scale is None or isinstance(scale, torch.Tensor):
        return scale
    note("grad_scaler_scale", "a GradScaler's scale tensor cannot be read: GradMonitor reads "
         "get_scale() (one host sync more per logged step)")
    value = scaler.get_scale()
    return torch.tensor(float(value), dtype=torch.float64) if value else None


def grad_scaler_unscaled(scaler: Any, optimizer: Any) -> bool:
    """Whether ``scaler`` already unscaled ``optimizer``'s gradients in this step
    (``unscale_``, ``step``); False where its per-optimizer state cannot be read (noted)."""
    states = getattr(scaler, "_per_optimizer_states", None)
    ready = _get(sys.modules.get("torch.amp.grad_scaler"), "OptState", "READY")
    if not isinstance(states, dict) or ready is None:
        note("grad_scaler_state", "a GradScaler's per-optimizer state cannot be read: "
             "GradMonitor takes the gradients at optimizer.step() as still scaled")
        return False
    state = states.get(id(optimizer))
    return state is not None and state.get("stage") is not ready


# ---------------------------------------------------------------------------- storages
def _storage_key_fallback(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


#: The address of a tensor's StorageImpl: one key per storage (raises for storage-less tensors).
storage_key: Callable[[torch.Tensor], int] = (
    getattr(_C, "_storage_address", None) or _storage_key_fallback
)


# ---------------------------------------------------------------------------- Dynamo
#: ``torch.compiler.is_compiling``: True while Dynamo traces (a constant it folds).
compiling: Callable[[], bool] = _get(torch, "compiler", "is_compiling") or (lambda: False)


def dynamo_loaded() -> bool:
    """Whether the program imported ``torch._dynamo`` (nothing can be compiled before that)."""
    return "torch._dynamo" in sys.modules


def frame_skipper() -> Callable[[Any], None] | None:
    """A function that makes Dynamo run a code object (and what it calls) as plain Python,
    or None when this torch offers none. Call only once ``dynamo_loaded()``."""
    try:
        from torch._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy

        strategy = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
    except (ImportError, AttributeError, TypeError):
        skip = _get(sys.modules.get("torch._dynamo.eval_frame"), "skip_code")
        if skip is None:
            note("dynamo-skip", "Dynamo offers no way to skip gradscope's hooks: a hook "
                 "that runs inside a compiled call may be compiled as a frame of its own")
        return skip

    def mark(code: Any) -> None:
        set_code_exec_strategy(code, strategy)

    return mark


def compile_callbacks() -> Any:
    """Dynamo's compile start/end callback registry (``register_start_callback``,
    ``register_end_callback``, ``start_callbacks``, ``end_callbacks``), or None."""
    handler = _get(sys.modules.get("torch._dynamo.callback"), "callback_handler")
    needed = ("register_start_callback", "register_end_callback", "start_callbacks",
              "end_callbacks")
    if handler is None or not all(hasattr(handler, n) for n in needed):
        if dynamo_loaded():
            note("dynamo-callbacks", "Dynamo has no compile callbacks: gradscope's module "
                 "hooks stay registered while it compiles (it may guard on them)")
        return None
    return handler


# ---------------------------------------------------------------------------- custom Functions
#: The base class of every custom Function's backward node (its ``ctx``).
CUSTOM_BASE: type = _get(torch, "autograd", "function", "BackwardCFunction") or type(
    "_NoCustomFunctions", (), {}
)


def is_custom_ctx(obj: Any) -> bool:
    """``obj`` is a custom Function's ``ctx`` (= its backward node)."""
    return isinstance(obj, CUSTOM_BASE)


_FORWARD_CODE: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def custom_forward_code(ctx: Any) -> Any:
    """The code object of the ``forward`` that ``ctx``'s Function runs (decorators such as
    ``torch.amp.custom_fwd`` unwrapped), or None."""
    cls = getattr(type(ctx), "_forward_cls", None)
    if cls is None:
        note("custom-forward", "custom Functions' nodes name no forward class: their "
             "forward lines are not recorded")
        return None
    try:
        return _FORWARD_CODE[cls]
    except (KeyError, TypeError):
        pass
    fn = inspect.getattr_static(cls, "forward", None)
    fn = getattr(fn, "__func__", fn)  # staticmethod / classmethod
    try:
        fn = inspect.unwrap(fn) if fn is not None else None
    except ValueError:  # a __wrapped__ cycle
        pass
    code = getattr(fn, "__code__", None)
    try:
        _FORWARD_CODE[cls] = code
    except TypeError:
        pass
    return code


# ---------------------------------------------------------------------------- AOTAutograd
@dataclass(frozen=True)
class AotRegion:
    """What AOTAutograd keeps of one compiled region, as plain values.

    Attributes:
        aot_id: AOTAutograd's id of the compiled graph, or None.
        graph: the uncompiled backward ``torch.fx.GraphModule``, or None when none was kept.
        n_symints: symints saved for backward (the first placeholders).
        n_opaque: opaque objects saved for backward (placeholders after the saved tensors).
        tangent_slots: per tangent placeholder, the index of the node's ``grad_outputs``.
        n_trailing: backward inputs after the tangents (effect tokens, rng seed/offset).
    """

    aot_id: int | None
    graph: Any
    n_symints: int
    n_opaque: int
    tangent_slots: list[int]
    n_trailing: int


_OUTPUT_KINDS = ("non_alias", "unsafe_view_alias", "custom_function_view")
_META_FIELDS = ("num_mutated_inp_runtime_indices", "mutated_inp_runtime_indices", "input_info",
                "output_info", "num_outputs", "num_intermediate_bases")
_SUPPORT: list[str | None] = []  # the probe's answer, computed once


def _output_type() -> Any:
    from torch._functorch._aot_autograd.schemas import OutputType

    return OutputType


def aot_region_support() -> str | None:
    """None when this torch has the AOTAutograd internals ``aot_region`` reads, else one line
    saying which is missing (regions are then drawn opaque). Probed once, by feature."""
    if _SUPPORT:
        return _SUPPORT[0]
    why: str | None = None
    try:
        kinds = _output_type()
        missing = [k for k in _OUTPUT_KINDS if not hasattr(kinds, k)]
        if missing:
            why = f"OutputType has no {', '.join(missing)}"
    except (ImportError, AttributeError) as exc:
        why = f"no torch._functorch._aot_autograd.schemas.OutputType ({type(exc).__name__})"
    if why is None and not hasattr(torch.fx.Graph, "find_nodes"):
        why = "torch.fx.Graph has no find_nodes"
    result = None if why is None else (
        f"gradscope cannot read AOTAutograd's backward graphs on torch {torch.__version__}: "
        f"{why}")
    _SUPPORT.append(result)
    return result


_LOADED: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def aot_backward_module(cls: Any) -> Any:
    """The uncompiled backward ``GraphModule`` AOTAutograd keeps for a ``CompiledFunction``
    class (``_lazy_backward_info.bw_module``, or loaded once by its ``bw_module_fn``), or None."""
    info = getattr(cls, "_lazy_backward_info", None)
    if info is None:
        return None
    gm = getattr(info, "bw_module", None)
    if gm is None:
        load = getattr(info, "bw_module_fn", None)
        if load is not None:
            gm = _LOADED.get(cls)
            if gm is None:
                gm = load()
                _LOADED[cls] = gm
    return gm if isinstance(gm, torch.fx.GraphModule) else None


def aot_region(cls: Any) -> AotRegion:
    """Read a ``CompiledFunction`` class's record. Raises (``AttributeError``...) when the
    record is not shaped as expected; the caller draws the region opaque then."""
    meta = cls.metadata
    missing = [f for f in _META_FIELDS if not hasattr(meta, f)]
    if missing:
        raise AttributeError(f"AOTAutograd's metadata has no {', '.join(missing)}")
    kinds = _output_type()
    slots = [
        i
        for i, idx in enumerate(meta.mutated_inp_runtime_indices)
        if meta.input_info[idx].mutates_data and meta.input_info[idx].requires_grad
    ]
    n_mut = meta.num_mutated_inp_runtime_indices
    keep = tuple(getattr(kinds, k) for k in _OUTPUT_KINDS)
    for i, info in enumerate(meta.output_info):
        if (
            info.output_type in keep
            and issubclass(info.raw_type, torch.Tensor)
            and info.requires_grad_for_backward
        ):
            slots.append(n_mut + i)
    start = n_mut + meta.num_outputs
    slots.extend(range(start, start + meta.num_intermediate_bases))
    trailing = int(getattr(meta, "num_backward_tokens", 0) or 0)
    trailing += 2 if getattr(meta, "is_rng_op_functionalized", False) else 0
    return AotRegion(
        aot_id=getattr(cls, "_aot_id", None),
        graph=aot_backward_module(cls),
        n_symints=int(getattr(cls, "num_symints_saved_for_bw", 0) or 0),
        n_opaque=int(getattr(meta, "num_opaque_objects_saved_for_bw", 0) or 0),
        tangent_slots=slots,
        n_trailing=trailing,
    )


def aot_id(cls: Any) -> int | None:
    return getattr(cls, "_aot_id", None)


def is_tangent(placeholder: Any) -> bool:
    """A placeholder of a backward graph is a tangent (a gradient the node receives)."""
    desc = placeholder.meta.get("desc")
    if desc is not None:
        return type(desc).__name__ == "TangentAOTInput"
    return bool(placeholder.name.startswith("tangents_"))


def aot_prologue(cls: Any) -> Any:
    """The function that turns a region node's inputs into its backward graph's arguments
    (``_bw_prologue_fn``), or None."""
    return getattr(cls, "_bw_prologue_fn", None)


def aot_donated(cls: Any) -> list[int]:
    """Indices of backward inputs the compiled backward may overwrite (donated buffers)."""
    return list(getattr(getattr(cls, "metadata", None), "bw_donated_idxs", None) or [])


def region_saved(fn: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """``(saved tensors, symints, opaque objects)`` a region's backward node holds, unpacked.
    Raises ``RuntimeError`` once backward freed them."""
    saved = list(fn.saved_tensors) + list(getattr(fn, "_tensors_no_vc_check", None) or [])
    symints = list(getattr(fn, "symints", None) or [])
    opaque = list(getattr(fn, "opaque_objects", None) or [])
    return saved, symints, opaque


def raw_saved(fn: Any, name: str) -> list[Any]:
    """The values behind a backward node's saved attribute ``name`` (``_saved_self``...),
    read through their ``SavedVariable`` handles (``_raw_saved_self``): unchecked, so a
    tensor changed in place since it was saved reads as it is now. Raises
    ``AttributeError``/``RuntimeError`` where there is no such handle or backward freed it."""
    raw = getattr(fn, "_raw" + name)
    handles = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    return [h.data for h in handles]


def region_raw_saved(fn: Any) -> list[Any]:
    """The tensors a region node holds, read through their ``SavedVariable`` handles (no
    unpack hook runs), then the ones it holds without a version check. Raises
    ``RuntimeError`` once backward freed them."""
    tensors = [r.data for r in fn._raw_saved_tensors]
    tensors += list(getattr(fn, "_tensors_no_vc_check", None) or [])
    return tensors


def is_op_overload(target: Any) -> bool:
    """An FX node's target is an aten/prims op overload (``aten.mm.default``)."""
    kind = _get(torch, "_ops", "OpOverload")
    return kind is not None and isinstance(target, kind)


# ---------------------------------------------------------------------------- FSDP2
def fsdp_param_groups(model: torch.nn.Module) -> list[Any]:
    """The FSDP2 parameter groups of ``model``'s modules (``fully_shard``), one per sharded
    module; [] for a model without FSDP2 or where its state cannot be read."""
    groups = []
    for module in model.modules():
        get = getattr(module, "_get_fsdp_state", None)
        if get is None:
            continue
        try:
            group = get()._fsdp_param_group
        except Exception:  # noqa: BLE001 - an FSDP2 whose state is laid out otherwise
            continue
        if group is not None:
            groups.append(group)
    return groups


def fsdp_unsharded_grads(group: Any) -> list[torch.Tensor]:
    """The gradients of an FSDP2 group's unsharded (all-gathered) parameters, before its
    post-backward reduce-scatters them into the sharded ones."""
    grads: list[torch.Tensor] = []
    for fsdp_param in getattr(group, "fsdp_params", ()):
        param = getattr(fsdp_param, "_unsharded_param", None)
        for g in (getattr(param, "grad", None),
                  getattr(fsdp_param, "unsharded_accumulated_grad", None)):
            if isinstance(g, torch.Tensor):
                grads.append(g)
    return grads


# ---------------------------------------------------------------------------- DTensor
def dtensor_meta_propagation() -> tuple[Any, str] | None:
    """(class, method name) of what DTensor runs, the first time it meets an op and its
    shapes, on fake tensors of the *global* shapes to read the output's shape
    (``ShardingPropagator._propagate_tensor_meta_non_cached``; cached after): the tensors it
    makes are shapes only, never memory. None where this torch has no such method."""
    try:
        from torch.distributed.tensor import _sharding_prop
    except ImportError:
        return None
    cls = getattr(_sharding_prop, "ShardingPropagator", None)
    name = "_propagate_tensor_meta_non_cached"
    return (cls, name) if callable(getattr(cls, name, None)) else None
