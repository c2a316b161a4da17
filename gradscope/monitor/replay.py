"""Replay of a training step's bad micro-batch: where its first NaN/Inf came from.

What ``GradMonitor(..., replay=True)`` keeps while a step runs (nothing is copied):

* per forward of the model (a micro-batch): references to its arguments, the CPU and CUDA
  RNG states and the autocast settings at that forward, and the version counters of its
  input tensors (to see an input changed in place before the boundary);
* the gradient that arrives at each of the model's output tensors (a tensor hook: the very
  tensor autograd made, kept until the step ends), or, with ``loss_fn=``, the targets given
  with ``GradMonitor.target`` so the loss can be recomputed;
* the parameters' version counters at the step's first forward.

When the step's gradients turn out non-finite, before ``optimizer.step()`` changes the
parameters, ``Replayer.replay`` runs the micro-batch that went bad once more under
``record_forward(check_finite=True)`` and ``record_backward``, with the RNG states and autocast
of the original forward, the buffers saved and put back, and ``torch.autograd.grad`` (no
``.grad`` is written). The run's RNG stream is restored afterwards, so training goes on
bitwise as it would have without the replay. ``gradscope.monitor.incidents`` decides when
to replay and turns what a replay found (a ``ReplayResult``) into an ``Incident``.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from .._torch import torchcompat
from .._torch.dynamo import compiling
from .._torch.torchcompat import is_dtensor, local_tensor
from ..graph.nest import iter_tensors
from ..graph.tensor_facts import checkable, holds_data
from .incident import OpInput

_AUTOCAST_DEVICES = ("cpu", "cuda")
_version = torchcompat.tensor_version


def autocast_now() -> list[tuple[str, torch.dtype]]:
    """The autocast settings in force: ``(device type, dtype)`` per device type on."""
    return [(dt, torch.get_autocast_dtype(dt)) for dt in _AUTOCAST_DEVICES
            if torch.is_autocast_enabled(dt)]


class MicroBatch:
    """What one forward of the model needs to run again."""

    __slots__ = (
        "args", "kwargs", "cpu_rng", "cuda_rng", "autocast", "versions", "grads", "target",
        "run", "ids",
    )

    def __init__(self) -> None:
        self.args: tuple[Any, ...] = ()
        self.kwargs: dict[str, Any] = {}
        self.cpu_rng: torch.Tensor | None = None
        self.cuda_rng: list[tuple[int, torch.Tensor]] = []
        self.autocast: list[tuple[str, torch.dtype]] = []
        self.versions: list[tuple[torch.Tensor, int | None]] = []
        self.grads: dict[str, torch.Tensor] = {}  # output path -> gradient that arrived
        self.target: tuple[Any, ...] | None = None
        self.run: Callable[[], Any] | None = None  # a framework's own step (Lightning)
        self.ids: list[Any] | None = None  # the data's own ids of its examples, in order


class ReplayResult:
    """What a replay found (filled into an ``Incident`` by the monitor)."""

    def __init__(self) -> None:
        self.phase: str | None = None
        self.op: str | None = None
        self.module: str | None = None
        self.line: str | None = None
        self.code: str | None = None
        self.value: str | None = None
        self.input: str | None = None  # the tensor given to the forward that held it
        self.inputs: list[OpInput] = []
        self.micro_batch: int | None = None
        self.replayed = False
        #: replayed on every rank at once (sharded parameters), not by this rank alone
        self.together = False
        #: where the first NaN/Inf appeared in the replay's order of work: the index of the
        #: value among those the forward checked, or of the node among those the backward ran
        #: (every rank runs the same ops in the same order, so the ranks' positions compare)
        self.position: int | None = None
        self.note: str | None = None
        self.seconds = 0.0


def _fsdp1() -> type | None:
    """torch's FSDP (1) wrapper class, where torch.distributed has it."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:
        return None
    return FullyShardedDataParallel


def _split_where(where: str | None) -> tuple[str | None, str | None]:
    """``file.py:12: code`` -> (``file.py:12``, ``code``)."""
    if not where:
        return None, None
    if "\n" in where:  # a detect_anomaly stack: not a line of ours
        return None, None
    head, sep, code = where.partition(": ")
    return head, (code or None) if sep else None


def tensor_input(name: str, t: torch.Tensor) -> OpInput:
    """Shape, dtype, finite range and NaN/Inf flags of one tensor (read now, on the host; a
    float8 tensor through a float32 copy, exact)."""
    with torch.no_grad():
        d = checkable(local_tensor(t.detach()))
        if d is None:  # packed float4: nothing reads it element by element
            return OpInput(name, list(t.shape), str(t.dtype).replace("torch.", ""), None, None)
        if not (d.is_floating_point() or d.is_complex()) or d.numel() == 0:
            lo = hi = None
            if d.numel():
                lo, hi = float(d.min()), float(d.max())
            return OpInput(name, list(d.shape), str(d.dtype).replace("torch.", ""), lo, hi)
        if d.is_complex():
            d = d.abs()
        fin = torch.isfinite(d)
        vals = d[fin]
        lo = hi = None
        if vals.numel():
            lo, hi = float(vals.min()), float(vals.max())
        nan = bool(torch.isnan(d).any())
        inf = bool(torch.isinf(d).any())
    return OpInput(name, list(t.shape), str(t.dtype).replace("torch.", ""), lo, hi, nan, inf)


def saved_inputs(fn: Any) -> list[OpInput]:
    """The tensors an autograd node saved for its backward (``self``, ``other``, ``result``...),
    read while the graph is retained."""
    out = []
    for attr in dir(fn):
        if not attr.startswith("_saved_"):
            continue
        try:
            value = getattr(fn, attr)
        except RuntimeError:  # freed
            continue
        if (isinstance(value, torch.Tensor) and value.layout == torch.strided
                and holds_data(local_tensor(value))):
            out.append(tensor_input(attr[len("_saved_"):], value))
    order = {"self": 0, "input": 0, "other": 1, "mat2": 1}
    out.sort(key=lambda i: (order.get(i.name, 2 if i.nan or i.inf else 5)))
    return out


class Replayer:
    """Keeps each micro-batch of the current step and replays the one that went bad.

    Args:
        model: the module whose forward is a micro-batch (hooked: ``hook_target``, the
            ``torch.compile`` wrapper when one was given, else the module).
        params: the watched parameters (the replay's ``autograd.grad`` inputs).
        loss_fn: ``loss_fn(output)`` or ``loss_fn(output, *targets)``; lets a replay whose
            gradient reached the outputs already non-finite name the loss's own op.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        hook_target: torch.nn.Module,
        params: Sequence[torch.Tensor],
        loss_fn: Callable[..., Any] | None = None,
    ) -> None:
        self.model = model
        self.target_module = hook_target
        self.params = list(params)
        self.loss_fn = loss_fn
        self.batches: list[MicroBatch] = []
        self.flags: list[torch.Tensor] = []  # per backward: sum of the gradient norms
        self.param_versions: list[int | None] | None = None
        self.replaying = False
        self.runs_only = False  # a framework gives each micro-batch as a run (Lightning)
        self.next_target: tuple[Any, ...] | None = None
        self.next_ids: list[Any] | None = None
        self.handles: list[Any] = []
        self.cuda_devices = sorted(
            {p.device.index or 0 for p in self.params if p.device.type == "cuda"}
        )

    # ------------------------------------------------------------------ hooks
    def install(self) -> Callable[[], None]:
        m = self.target_module
        self.handles = [
            m.register_forward_pre_hook(self._pre, with_kwargs=True),
            m.register_forward_hook(self._post, with_kwargs=True),
        ]
        return self.remove

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.clear()

    def clear(self) -> None:
        """The step ended: drop every reference it kept."""
        self.batches = []
        self.flags = []
        self.param_versions = None

    def _pre(self, module: Any, args: Any, kwargs: Any) -> None:
        # a model compiled as a whole inlines its own hooks: traced, they do nothing (the
        # compiled wrapper, given to the monitor, is hooked instead: its hooks run eagerly)
        if compiling():
            return None
        if self.replaying or self.runs_only or not torch.is_grad_enabled():
            return None
        mb = MicroBatch()
        mb.args, mb.kwargs = args, kwargs
        mb.target, self.next_target = self.next_target, None
        mb.ids, self.next_ids = self.next_ids, None
        mb.cpu_rng = torch.get_rng_state()
        if self.cuda_devices:
            mb.cuda_rng = [(d, torch.cuda.get_rng_state(d)) for d in self.cuda_devices]
        mb.autocast = autocast_now()
        mb.versions = [(t, _version(t)) for _, t in iter_tensors((args, kwargs))]
        if self.param_versions is None:
            self.param_versions = [_version(p) for p in self.params]
        self.batches.append(mb)
        return None

    def _post(self, module: Any, args: Any, kwargs: Any, output: Any) -> None:
        if compiling():
            return None
        if self.replaying or self.runs_only or not self.batches or not torch.is_grad_enabled():
            return None
        grads = self.batches[-1].grads
        for path, t in iter_tensors(output):
            if t.requires_grad:
                t.register_hook(_Keep(grads, path))
        return None

    def set_target(self, *values: Any) -> None:
        """The targets of a micro-batch (for ``loss_fn(output, *targets)``): of the latest
        forward when it has none yet, else of the next forward."""
        if self.batches and self.batches[-1].target is None:
            self.batches[-1].target = values
        else:
            self.next_target = values

    def set_ids(self, ids: list[Any]) -> None:
        """The data's own ids of a micro-batch's examples: of the latest forward when it has
        none yet and its backward has not ended (ids read from the batch a framework just
        ran, or by a forward hook after this one), else of the next forward (ids given
        before it); so each micro-batch of an accumulated step keeps its own."""
        if self.batches and self.batches[-1].ids is None and len(self.flags) < len(self.batches):
            self.batches[-1].ids = ids
        else:
            self.next_ids = ids

    def add_run(self, run: Callable[[], Any]) -> None:
        """A framework's step (returns the loss) as one micro-batch, RNG state taken now; from
        the first call on, the model's own forwards are no longer micro-batches."""
        self.runs_only = True
        mb = MicroBatch()
        mb.run = run
        mb.ids, self.next_ids = self.next_ids, None
        mb.cpu_rng = torch.get_rng_state()
        if self.cuda_devices:
            mb.cuda_rng = [(d, torch.cuda.get_rng_state(d)) for d in self.cuda_devices]
        if self.param_versions is None:
            self.param_versions = [_version(p) for p in self.params]
        self.batches.append(mb)

    def note_backward(self, norms: torch.Tensor) -> None:
        """A backward of this step ended; ``norms``: the per-parameter gradient norms after it
        (device tensor, not read now)."""
        self.flags.append(norms.sum())

    # ------------------------------------------------------------------ checks
    @staticmethod
    def distributed() -> bool:
        """Whether this is one rank of several (each rank replays its own micro-batch alone,
        where the forward and backward make no collective: ``alone``)."""
        dist = torch.distributed
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def local_module(self) -> torch.nn.Module:
        """What a replay runs: the hooked module, or the module a ``DistributedDataParallel``
        wraps (whose own forward and backward make no collective)."""
        m = self.target_module
        ddp = getattr(torch.nn.parallel, "DistributedDataParallel", None)
        return m.module if ddp is not None and isinstance(m, ddp) else m

    def why_not_alone(self) -> str | None:
        """On one rank of several: why this rank cannot replay its micro-batch by itself (its
        forward or backward would wait on the other ranks), or None. Data parallelism
        (DDP, gradients all-reduced by hand) replays the wrapped module alone."""
        if not self.distributed():
            return None
        sharded = (
            "not replayed: {what} gathers from the other ranks in its forward, and a replay "
            "on one rank would wait for them (activations=True names the first rank and its "
            "first non-finite module)"
        )
        if any(is_dtensor(p) for p in self.params):
            return sharded.format(what="a model with sharded (DTensor) parameters (FSDP2, "
                                  "tensor parallel)")
        fsdp1 = _fsdp1()
        for m in self.local_module().modules():
            if fsdp1 is not None and isinstance(m, fsdp1):
                return sharded.format(what="a FullyShardedDataParallel model")
            if isinstance(m, torch.nn.SyncBatchNorm) and m.training:
                return sharded.format(what="SyncBatchNorm")
        if self.runs_only:
            return ("not replayed: a framework's own step on one rank of several would "
                    "re-enter its collectives")
        return None

    def together(self) -> bool:
        """Whether every rank replays its own micro-batch at the same time: on one rank of
        several, a model with sharded (DTensor) parameters (FSDP2, tensor parallel, FSDP2 x
        TP), whose forward and backward gather from the other ranks. Every rank runs the same
        collectives in the same order, as in the step itself; the monitor decides it from
        figures every rank holds alike, so no rank replays without the others."""
        return self.distributed() and any(is_dtensor(p) for p in self.params)

    def why_not(self) -> str | None:
        """One line on why this step cannot be replayed exactly, or None."""
        alone = None if self.together() else self.why_not_alone()
        if alone is not None:
            return alone
        if not self.batches:
            return (
                "not replayed: no forward of the model was seen in this step (a model compiled "
                "as a whole: give GradMonitor the torch.compile wrapper the loop calls)"
            )
        if self.param_versions is not None and self.param_versions != [
            _version(p) for p in self.params
        ]:
            return (
                "not replayed: parameters were changed in place between the forward and the "
                "optimizer step, so the step cannot be run again as it was"
            )
        return None

    def _changed_input(self, mb: MicroBatch) -> bool:
        return any(_version(t) != v for t, v in mb.versions)

    def bad_index(self) -> int | None:
        """The first micro-batch after whose backward the gradients were non-finite, when
        there was one backward per micro-batch (one host transfer); else None."""
        if len(self.flags) != len(self.batches) or not self.flags:
            return None
        values = torch.stack([f.to(torch.float64) for f in self.flags]).tolist()
        for i, v in enumerate(values):
            if not math.isfinite(v):
                return i
        return None

    # ------------------------------------------------------------------ replay
    def replay(self) -> ReplayResult:
        """Run the micro-batch that went bad again under the recorders; never raises for a
        failure of the replay itself (the result's note says what happened)."""
        import time

        res = ReplayResult()
        why = self.why_not()
        if why is not None:
            res.note = why
            return res
        index = self.bad_index()
        order = [index] if index is not None else list(range(len(self.batches)))
        start = time.perf_counter()
        try:
            for i in order:
                mb = self.batches[i]
                if mb.run is None and self._changed_input(mb):
                    res.note = (
                        f"not replayed: an input of micro-batch {i} was changed in place after "
                        "its forward"
                    )
                    return res
                found = self._replay_one(mb, res)
                res.micro_batch = i
                if found:
                    break
            else:
                res.note = (
                    "replayed with every rank, this rank's own values stayed finite: the "
                    "NaN/Inf came from another rank"
                ) if res.together else (
                    "replayed alone on this rank, its gradients were finite: the NaN/Inf "
                    "came from another rank (through the gradients' reduction)"
                ) if self.distributed() else (
                    "replayed, but the replay's gradients were finite: the step depends on "
                    "something the replay cannot repeat (state or randomness outside torch's "
                    "RNG, a side effect of the forward)"
                )
        except Exception as exc:  # noqa: BLE001 - a failed replay must not stop training
            res.note = f"the replay failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        finally:
            res.seconds = time.perf_counter() - start
        return res

    def _replay_one(self, mb: MicroBatch, res: ReplayResult) -> bool:
        from ..backward.forward import record_forward
        from ..backward.recorder import record_backward
        from ..graph.scopes import scopes
        from ..graph.walk import trace_with_ids

        model = self.model
        grads_bad = not _all_finite(list(mb.grads.values()))
        outside = False
        params = [p for p in self.params if p.requires_grad]
        res.replayed = True
        res.together = self.together()
        with _preserved(model, self.cuda_devices), _restored_rng(mb):
            self.replaying = True
            try:
                with contextlib.ExitStack() as stack:
                    stack.enter_context(torch.enable_grad())
                    for dt, dtype in mb.autocast:
                        stack.enter_context(torch.autocast(dt, dtype=dtype))
                    fw = stack.enter_context(record_forward(check_finite=True))
                    # a NaN/Inf already in the batch (or a weight) is said as such
                    fw.name_inputs(input_labels(model, mb.args, mb.kwargs))
                    if mb.run is not None:
                        with scopes(model):
                            roots, grads = _loss_root(mb.run())
                    else:
                        with scopes(model):
                            out = self.local_module()(*mb.args, **mb.kwargs)
                        # the gradient reached finite outputs already non-finite: the loss
                        outside = grads_bad and _all_finite(out)
                        if outside and self.loss_fn is not None:
                            roots, grads = _loss_root(self.loss_fn(out, *(mb.target or ())))
                        else:
                            roots, grads = _output_roots(out, mb.grads)
                if not roots:
                    res.note = "replayed, but no output of the model received a gradient"
                    return False
                fwd = fw.first_nonfinite
                if res.together:  # what the graph reaches: FSDP2's gathered parameters
                    params = graph_leaves(roots)
                with record_backward(roots, model=model) as rec:
                    # kept for reading the op's saved tensors after; a compiled region's
                    # backward (donated buffers) cannot be run with retain_graph
                    retain = not any(n.compiled is not None for n in rec.graph.nodes)
                    torch.autograd.grad(
                        roots, params, grads, allow_unused=True, retain_graph=retain
                    )
                graph = rec.graph
                back = rec.first_nonfinite
                fnode = next((n for n in graph.nodes if n.forward_nonfinite), None)
                roots_bad = not _all_finite(roots)
                node_id = None
                if fwd is not None and (
                    roots_bad or back is None or (fnode is not None and fnode.nonfinite)
                ):
                    res.phase = "forward"
                    res.op = fwd.node or fwd.op or None  # "": the input held it, no op read it
                    res.module = fwd.module
                    res.line, res.code = _split_where(fwd.where)
                    res.value = fwd.kind
                    res.input = fwd.input  # None when an op of the forward made it
                    res.position = fwd.index
                    node_id = fnode.id if fnode is not None else None
                elif back is not None:
                    res.phase = "backward"
                    res.op = back.name
                    node = graph.node(back.node_id)
                    res.module = node.module
                    res.line, res.code = _split_where(back.traceback or node.created_at)
                    res.value = back.kind
                    node_id = back.node_id
                    res.position = next((i for i, s in enumerate(rec.steps)
                                         if s.node_id == back.node_id), None)
                else:
                    return False
                if mb.run is not None and res.module is None:
                    outside = True  # a framework's step: an op outside every module's forward
                if outside:
                    res.phase = "outside"
                    if mb.run is None and self.loss_fn is None:
                        res.op = res.module = res.line = res.code = None
                        res.note = (
                            "the loss is computed outside the model: pass loss_fn= (and "
                            "GradMonitor.target(...)) to name its op"
                        )
                        return True
                if node_id is not None and retain:
                    _, ids = trace_with_ids(roots, model=model, saved=False)
                    fn = next((f for f, nid in ids.items() if nid == node_id), None)
                    if fn is not None and graph.node(node_id).compiled is None:
                        res.inputs = saved_inputs(fn)
                    del ids, fn
                return True
            finally:
                self.replaying = False


def input_labels(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Iterator[tuple[str, torch.Tensor]]:
    """What a NaN already in a tensor the forward was given is called: each input by the
    name of the ``forward`` argument it was bound to (``the input x``, ``the input
    input_ids`` for ``model(**batch)``, ``the input batch['pixel_values']``), then ``the
    parameter fc.weight`` and ``the buffer bn.running_mean`` (as the model file's loader
    names them)."""
    for name, value in _bound(model, args, kwargs):
        # Sequential's argument is called ``input``: "the input input" would read badly
        label = "the model's input" if name == "input" else f"the input {name}"
        for path, t in iter_tensors(value, ""):
            yield label + path, t
    for name, p in model.named_parameters():
        yield f"the parameter {name}", p
    for name, b in model.named_buffers():
        yield f"the buffer {name}", b


def _bound(
    model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Iterator[tuple[str, Any]]:
    """``(argument name, value)`` of a forward call, ``*args`` as ``args[i]`` and
    ``**kwargs`` by key; positions (``args[0]``) when the signature cannot be read."""
    try:
        sig = inspect.signature(model.forward)
        bound = sig.bind(*args, **kwargs)
    except (TypeError, ValueError):  # a builtin's forward, or a call it would not bind
        yield from ((f"args[{i}]", a) for i, a in enumerate(args))
        yield from kwargs.items()
        return
    for name, value in bound.arguments.items():
        kind = sig.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            yield from ((f"{name}[{i}]", a) for i, a in enumerate(value))
        elif kind is inspect.Parameter.VAR_KEYWORD:
            yield from value.items()
        else:
            yield name, value


class _Keep:
    """A tensor hook that keeps the gradient arriving at one output (never replaces it)."""

    __slots__ = ("grads", "path")

    def __init__(self, grads: dict[str, torch.Tensor], path: str) -> None:
        self.grads, self.path = grads, path

    def __call__(self, grad: torch.Tensor) -> None:
        self.grads[self.path] = grad


def _all_finite(out: Any) -> bool:
    """Whether every floating tensor in ``out`` (a nest) is finite: float8 read widened
    (``isfinite`` has no float8_e4m3fn kernel), packed float4 not readable, so not said
    non-finite."""
    for _, t in iter_tensors(out):
        if t.is_floating_point() or t.is_complex():  # this rank's shard of a DTensor
            d = checkable(local_tensor(t.detach()))
            if d is not None and not bool(torch.isfinite(d).all()):
                return False
    return True


def graph_leaves(roots: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The leaf tensors the graph of ``roots`` accumulates gradients into (its
    ``AccumulateGrad`` nodes' variables), each once: under FSDP2 the parameters the forward
    gathered, not the sharded ones the optimizer holds (no graph reaches those)."""
    seen: set[int] = set()
    stack = [t.grad_fn for t in roots if t.grad_fn is not None]
    out: list[torch.Tensor] = []
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        variable = getattr(fn, "variable", None)
        if isinstance(variable, torch.Tensor):
            out.append(variable)
        stack.extend(f for f, _ in fn.next_functions if f is not None)
    return out


def _loss_root(loss: Any) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    if isinstance(loss, dict):
        loss = loss.get("loss")
    if not isinstance(loss, torch.Tensor) or not loss.requires_grad:
        return [], []
    return [loss], [torch.ones_like(loss)]


def _output_roots(
    out: Any, grads: dict[str, torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    roots, gs = [], []
    for path, t in iter_tensors(out):
        g = grads.get(path)
        if g is not None and t.requires_grad and g.shape == t.shape:
            roots.append(t)
            gs.append(g)
    return roots, gs


@contextlib.contextmanager
def _restored_rng(mb: MicroBatch) -> Iterator[None]:
    """Run with the RNG states of ``mb``'s forward; put the run's own states back after."""
    cpu = torch.get_rng_state()
    cuda = [(d, torch.cuda.get_rng_state(d)) for d, _ in mb.cuda_rng]
    try:
        if mb.cpu_rng is not None:
            torch.set_rng_state(mb.cpu_rng)
        for d, state in mb.cuda_rng:
            torch.cuda.set_rng_state(state, d)
        yield
    finally:
        torch.set_rng_state(cpu)
        for d, state in cuda:
            torch.cuda.set_rng_state(state, d)


@contextlib.contextmanager
def _preserved(model: torch.nn.Module, cuda_devices: list[int]) -> Iterator[None]:
    """Buffers (BatchNorm statistics...) as they were before the replay, put back after; the
    training flags of every module too."""
    with torch.no_grad():
        saved = [(b, b.clone()) for b in model.buffers()]
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, copy in saved:
                if not torch.equal(b, copy) or b.dtype != copy.dtype:
                    b.copy_(copy)
        for m, mode in modes:
            m.training = mode


#: the keys of a dict batch that hold the examples' own ids
ID_KEYS = ("id", "idx")


def ids_in(batch: Any) -> Any:
    """The examples' ids a dict batch carries (under ``"id"`` or ``"idx"``), as they are (a
    tensor stays on its device: no host transfer), or None."""
    if not isinstance(batch, dict):
        return None
    for key in ID_KEYS:
        ids = batch.get(key)
        if ids is not None and not isinstance(ids, (str, bytes)):
            try:
                len(ids)
            except TypeError:  # a 0-d tensor, a number: not one id per example
                continue
            return ids
    return None
