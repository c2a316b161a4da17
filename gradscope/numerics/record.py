"""``gs.record_numerics``: every op of a forward and backward, summarised (capture).

A ``TorchDispatchMode`` sees every aten op the block runs, the backward's included when the
backward is called inside the block (the autograd engine runs its nodes through the dispatcher
on the calling thread). For each floating-point output it keeps the op, the phase (``backward``
while the engine runs a node: ``torchcompat.current_autograd_node``), the module (a global
module-hook stack in the forward; in the backward the path ``gs.scopes`` stamped on the
running node), the user's line (``stamps.user_frame``; none for built-in backward nodes, which
the engine runs, but a custom Function's backward has one) and the output's ``Stats``
(``gradscope.numerics.sketch``), computed on the device without a host transfer; the block's
end reads them all at once.

Which op made each input is followed by the tensor's address, shape and dtype (the latest op
that wrote there wins, so reused memory is never misattributed): views, copies and ``detach``
are not records of their own, their output stands for their source; a dtype conversion is a
record flagged ``cast``. A tensor no recorded op made is a leaf (a parameter, a model input),
summarised once when first read. Ops that only allocate (``empty``) are skipped.

Each record names its autograd node, the link to the graph page (``gs.trace_divergence``): in
the backward the running node (its name and ``_sequence_nr()``); in the forward the node made
for the op's output, read from the output's ``grad_fn`` once autograd has set it, i.e. when the
next op is dispatched (or the block ends), through a weak reference that keeps nothing alive.
An op whose output needs no gradient (``torch.no_grad``, a compiled region's inner ops, a
custom Function's forward) has none; AccumulateGrad, which has no sequence number, neither.

Under ``torch.distributed`` each process records its own run. A parameter's gradient that is
a DTensor sharded by rows (FSDP2) is summarised as the full tensor without gathering it: each
rank sketches its rows with their place in the full tensor (``Projector.shard_stats``) and two
all-reduces per mesh add the rows up; other layouts are gathered (``full_tensor``, noted). Ops
on DTensors are recorded with their local shard's figures.

The mode asks ``torch.compile`` to ignore it while compiling (``ignore_compile_internals``), so
a compiled model is compiled as without it and its runtime ops (``aot_eager``'s graph) are
recorded; Inductor's fused kernels are one opaque call each and are not seen.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .._torch import dynamo, torchcompat
from .._torch.stamps import (
    MODULE_KEY,
    NO_SEQUENCE_NR,
    outside_gradscope,
    torch_internal,
    user_frame,
)
from ..errors import ScopesError
from .records import LeafRecord, NumericsRun, OpRecord, ParamRecord, Stats
from .sketch import SEED, K, Projector, is_float

#: aten ops whose output only stands for an input (views by schema are found by ``is_view``).
PASS = frozenset({
    "aten.detach", "aten.alias", "aten.clone", "aten.contiguous", "aten.lift_fresh",
    "aten.lift_fresh_copy", "aten._unsafe_view", "aten.view", "aten.reshape",
    "aten._reshape_alias", "aten.t", "aten.expand", "aten.permute", "aten.transpose",
    "aten.unsqueeze", "aten.squeeze", "aten.slice", "aten.select", "aten.split",
    "aten.split_with_sizes", "aten.unbind", "aten.chunk", "aten.as_strided",
    "aten.expand_as", "aten.view_as", "aten.flatten", "aten.unflatten", "aten.narrow",
    "aten.movedim", "aten.diagonal", "aten.unfold",
})
#: dtype conversions: a record flagged ``cast`` when the dtype changes, else a pass.
CASTS = frozenset({"aten._to_copy", "aten.to", "aten._to_dtype", "aten.type_as"})
#: ops whose output holds no values yet (or no values of the run's).
SKIP = frozenset({
    "aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty",
    "aten.new_empty_strided", "aten.set_", "aten.resize_", "aten.resize_as_",
    "aten.empty_permuted", "aten._local_scalar_dense", "aten.record_stream",
})

#: what ``made`` says of a tensor an op like ``empty`` made: it holds no values yet
NO_VALUES = sys.maxsize
_ENGINE = "_engine_run_backward"
_GENERATED = ("<eval_with_key>", "<fx")


def _op_name(func: Any) -> str:
    packet = getattr(func, "overloadpacket", None)
    return str(packet) if packet is not None else str(getattr(func, "__name__", func))


def _key(t: torch.Tensor) -> Any:
    try:
        return (t.data_ptr(), tuple(t.shape), t.dtype)
    except (RuntimeError, NotImplementedError):  # no storage (a wrapper subclass): its id
        return ("id", id(t))


def _line_of(frame: Any) -> str | None:
    import os

    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def _backward_line() -> str | None:
    """In the backward: the user's line running the op (a custom Function's backward), or
    None when the engine itself runs a built-in node (the line would be ``loss.backward()``)."""
    frame = outside_gradscope(sys._getframe(1))
    while frame is not None and torch_internal(frame.f_code.co_filename):
        if frame.f_code.co_name == _ENGINE:
            return None
        frame = frame.f_back
    if frame is None:
        return None
    frame = user_frame(frame)
    return None if frame is None else _line_of(frame)


def _forward_line() -> str | None:
    """The user's line, past the code ``torch.compile`` generates (``<eval_with_key>.3``)."""
    frame = outside_gradscope(sys._getframe(1))
    while frame is not None:
        frame = user_frame(frame)
        if frame is None or not frame.f_code.co_filename.startswith(_GENERATED):
            break
        frame = frame.f_back
    return None if frame is None else _line_of(frame)


class _Mode(TorchDispatchMode):
    """The dispatch mode: runs each op, then hands it to the recorder."""

    def __init__(self, recorder: Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Hidden while ``torch.compile`` compiles (else Dynamo runs the model eagerly)."""
        return True

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        kwargs = kwargs or {}
        rec = self.recorder
        before = None
        if rec.on:
            try:  # the inputs' sources first: a leaf is summarised before an op changes it
                before = rec.before(func, args, kwargs)
            except Exception as exc:  # never break the user's step: stop recording, say why
                rec.stop(func, exc)
        out = func(*args, **kwargs)
        if before is not None and rec.on:
            try:
                rec.op(func, before, out)
            except Exception as exc:
                rec.stop(func, exc)
        return out


class Recorder:
    """What the mode keeps while the block runs (see the module's docstring)."""

    def __init__(self, model: torch.nn.Module | None, projector: Projector) -> None:
        self.model = model
        self.projector = projector
        self.on = True
        self.notes: list[str] = []
        self.ops: list[tuple[str, str, str | None, str | None, str | None, str, tuple[int, ...],
                             tuple[int, ...], str | None]] = []
        self.op_stats: list[torch.Tensor] = []
        self.leaves: list[tuple[str, int, str, tuple[int, ...]]] = []
        self.leaf_stats: list[torch.Tensor] = []
        self.made: dict[Any, int] = {}  # a tensor's (address, shape, dtype) -> its source
        self.names: dict[int, str] = {}  # id of a parameter / input tensor -> its name
        self.unnamed = 0
        self.modules: list[str | None] = []
        self.module_names: dict[int, str] = {}
        self.held: list[torch.Tensor] = []  # tensors named by id: kept alive while recording
        self.nodes: dict[int, tuple[str, int]] = {}  # op record -> its node's (name, seq)
        # the last forward op's records and weak references to its outputs: their grad_fn is
        # set by autograd after the dispatch returns, read when the next op comes
        self.pending: tuple[range, list[weakref.ref[torch.Tensor]]] | None = None
        if model is not None:
            self.module_names = {id(m): name for name, m in model.named_modules() if name}
            for name, p in model.named_parameters():
                self.names[id(p)] = name
            for name, b in model.named_buffers():
                self.names[id(b)] = name

    # ------------------------------------------------------------------ module stack
    def pre(self, module: torch.nn.Module, args: Any) -> None:
        if module is self.model:
            for i, t in enumerate(x for x in tree_leaves(args) if is_float(x)):
                self.names.setdefault(id(t), f"input {i}")
                self.held.append(t)
        self.modules.append(self.module_names.get(id(module)))

    def post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self.modules:
            self.modules.pop()

    # ------------------------------------------------------------------ sources
    def source(self, t: torch.Tensor, name: str | None = None) -> int:
        """The op record (``>= 0``) or leaf (``-(j + 1)``) that made ``t`` (``NO_VALUES``
        for an op like ``empty``); ``name`` registers ``t`` as a new leaf of that name."""
        key = _key(t)
        found = self.made.get(key) if name is None else None
        if found is not None:
            return found
        name = name or self.names.get(id(t))
        if name is None and self.model is not None:
            name = next((f"{n}.grad" for n, p in self.model.named_parameters()
                         if p.grad is t), None)
        if name is None:
            name = f"leaf {self.unnamed}"
            self.unnamed += 1
        if getattr(t, "placements", None) is not None:
            name += " (local shard)"  # its stats are the shard's: not the full tensor's
        j = len(self.leaves)
        row = self.projector.stats(torchcompat.local_tensor(t))
        self.leaves.append((name, len(self.ops), str(t.dtype).removeprefix("torch."),
                            tuple(t.shape)))
        self.leaf_stats.append(row)
        self.made[key] = -(j + 1)
        return -(j + 1)

    # ------------------------------------------------------------------ one op
    def stop(self, func: Any, exc: Exception) -> None:
        self.on = False
        self.notes.append(f"recording stopped at {_op_name(func)}: {type(exc).__name__}: {exc}")

    def resolve(self) -> None:
        """The autograd node of the last forward op's records: the ``grad_fn`` autograd gave
        its first output that has one (none: the op needs no gradient)."""
        if self.pending is None:
            return
        records, refs = self.pending
        self.pending = None
        for ref in refs:
            t = ref()
            fn = None if t is None else t.grad_fn
            if fn is None:
                continue
            seq = int(fn._sequence_nr())
            if seq != NO_SEQUENCE_NR:
                for i in records:
                    self.nodes[i] = (str(fn.name()), seq)
            return

    def before(self, func: Any, args: Any, kwargs: dict[str, Any]
               ) -> tuple[str, list[torch.Tensor], list[int]] | None:
        """Before the op runs: its name, its floating-point inputs and their sources (a
        leaf's figures taken now, before an in-place op or a side effect such as batch norm's
        running statistics changes it); None for an op that is not recorded."""
        self.resolve()
        name = _op_name(func)
        if name in SKIP:
            return (name, [], [])
        ins = [t for t in tree_leaves((args, kwargs)) if is_float(t)]
        if name == "aten.copy_" and len(ins) >= 2:  # dst <- src: only src's values matter
            return (name, ins, [0, self.source(ins[1])])
        return (name, ins, [self.source(t) if t.numel() else NO_VALUES for t in ins])

    def op(self, func: Any, before: tuple[str, list[torch.Tensor], list[int]], out: Any
           ) -> None:
        name, ins, found = before
        outs = [t for t in (out if isinstance(out, (tuple, list)) else (out,))
                if isinstance(t, torch.Tensor)]
        if not any(is_float(t) for t in outs):
            return
        if name in SKIP:
            for t in outs:
                if t.numel():
                    self.made[_key(t)] = NO_VALUES
            return
        if name == "aten.copy_" and len(ins) >= 2:
            dst, src = ins[0], ins[1]
            if dst.dtype == src.dtype:
                self.made[_key(dst)] = found[1]
                return
            ins, found = [src], [found[1]]
        elif name in CASTS and ins and all(t.dtype == ins[0].dtype for t in outs):
            name = "pass"
        if name == "pass" or name in PASS or getattr(func, "is_view", False):
            if ins:
                for t in outs:
                    if is_float(t) and t.numel():
                        self.made[_key(t)] = found[0]
            return
        sources = tuple(s for s in dict.fromkeys(found) if s != NO_VALUES)
        node = torchcompat.current_autograd_node()
        if not sources and node is None:  # made from nothing (randn, full...): data, a leaf
            line = _forward_line()
            for t in outs:
                if is_float(t):
                    self.source(t, f"{name} at {line}" if line else name)
            return
        if node is not None:
            phase = "backward"
            meta = torchcompat.node_metadata(node)
            module = meta.get(MODULE_KEY) if meta else None
            line = _backward_line()
            node_name = str(node.name())
        else:
            phase = "forward"
            module = self.modules[-1] if self.modules else None
            line = _forward_line()
            node_name = None
        flag = "cast" if name in CASTS or name == "aten.copy_" else None
        float_outs = [t for t in outs if is_float(t)]
        first = len(self.ops)
        if node is not None:
            seq = int(node._sequence_nr())
            if seq != NO_SEQUENCE_NR:  # (AccumulateGrad has none)
                for i in range(first, first + len(float_outs)):
                    self.nodes[i] = (node_name or "", seq)
        else:
            self.pending = (range(first, first + len(float_outs)),
                            [weakref.ref(t) for t in float_outs])
        for n, t in enumerate(float_outs):
            i = len(self.ops)
            label = name if n == 0 else f"{name}#{n}"
            row = self.projector.stats(torchcompat.local_tensor(t))  # a DTensor: its shard
            self.ops.append((phase, label, module, line, node_name,
                             str(t.dtype).removeprefix("torch."), tuple(t.shape), sources, flag))
            self.op_stats.append(row)
            if t.numel():
                self.made[_key(t)] = i

    # ------------------------------------------------------------------ the end
    def finish(self, run: NumericsRun) -> None:
        """Fill ``run`` with what was recorded (one host transfer per device)."""
        self.resolve()
        self.on = False
        params: list[tuple[str, torch.Tensor | None]] = []
        if self.model is not None:
            for name, p in self.model.named_parameters():
                params.append((name, p.grad))
        grads = [g for _, g in params if g is not None]
        grad_stats = _grad_stats(self.projector, grads, self.notes)
        producers = [self.made.get(_key(g)) for g in grads]
        values = _read(self.op_stats + self.leaf_stats + grad_stats)
        k = self.projector.k
        n_ops = len(self.ops)
        n_leaves = len(self.leaves)

        def stats(row: list[float], dtype: str, shape: tuple[int, ...]) -> Stats:
            return Stats(dtype, shape, row[k], row[k + 1], int(row[k + 2]), tuple(row[:k]))

        for i, (phase, op, module, line, node, dtype, shape, inputs, flag) in enumerate(self.ops):
            made = self.nodes.get(i)
            run.ops.append(OpRecord(i, phase, op, module, line,
                                    made[0] if made is not None else node,
                                    stats(values[i], dtype, shape), inputs, flag,
                                    made[1] if made is not None else None))
        for j, (name, position, dtype, shape) in enumerate(self.leaves):
            run.leaves.append(LeafRecord(j, name, position,
                                         stats(values[n_ops + j], dtype, shape)))
        g = 0
        for name, grad in params:
            if grad is None:
                run.params.append(ParamRecord(name, None))
                continue
            row = values[n_ops + n_leaves + g]
            prod = producers[g]
            run.params.append(ParamRecord(
                name, stats(row, str(grad.dtype).removeprefix("torch."), tuple(grad.shape)),
                prod if prod is not None and prod >= 0 else None))
            g += 1
        run.notes.extend(self.notes)
        self.made = {}
        self.nodes = {}
        self.held = []
        self.op_stats = []
        self.leaf_stats = []


def _shard_offset(t: Any) -> int | None:
    """Where a DTensor's local shard starts in the full flattened tensor, when it is one
    contiguous run of rows (``Shard(0)`` on a 1-D mesh, ``torch.chunk``'s split, as FSDP2
    shards); None for any other layout."""
    placements = getattr(t, "placements", None)
    mesh = getattr(t, "device_mesh", None)
    if placements is None or mesh is None or len(placements) != 1 or mesh.ndim != 1:
        return None
    placement = placements[0]
    if not (placement.is_shard() and getattr(placement, "dim", None) == 0) or t.dim() == 0:
        return None
    rows, world, rank = t.shape[0], mesh.size(), mesh.get_local_rank()
    chunk = -(-rows // world)
    start = min(rank * chunk, rows)
    local = torchcompat.local_tensor(t)
    if local.shape[0] != max(0, min(chunk, rows - start)) or local.shape[1:] != t.shape[1:]:
        return None
    return start * (t.numel() // rows if rows else 0)


def _grad_stats(projector: Projector, grads: list[torch.Tensor], notes: list[str]
                ) -> list[torch.Tensor]:
    """Each gradient's stats row; a DTensor's as its full tensor's: a ``Shard(0)`` shard's
    partial rows summed over its mesh (two all-reduces for all of them, no gather), any other
    layout through ``full_tensor()`` (a gather)."""
    out: list[torch.Tensor | None] = [None] * len(grads)
    sharded: dict[int, tuple[Any, list[int]]] = {}  # mesh -> (its group, the grads on it)
    for i, g in enumerate(grads):
        if getattr(g, "placements", None) is None:
            out[i] = projector.stats(g)
            continue
        offset = _shard_offset(g)
        if offset is None:
            full = g.full_tensor()  # type: ignore[attr-defined]
            out[i] = projector.stats(full)
            notes.append("gradients of DTensors that are not sharded by rows were gathered "
                         "(full_tensor) to be summarised")
            continue
        out[i] = projector.shard_stats(torchcompat.local_tensor(g), offset)
        mesh = g.device_mesh  # type: ignore[attr-defined]
        sharded.setdefault(id(mesh), (mesh.get_group(), []))[1].append(i)
    if sharded:
        import torch.distributed as dist

        k = projector.k
        for group, idx in sharded.values():
            block = torch.stack([out[i] for i in idx])  # type: ignore[misc]
            most = block[:, k + 1].clone()
            dist.all_reduce(block, group=group)
            dist.all_reduce(most, op=dist.ReduceOp.MAX, group=group)
            block[:, k] = block[:, k].sqrt()
            block[:, k + 1] = most
            for row, i in zip(block, idx, strict=True):
                out[i] = row
    return [row for row in out if row is not None]


def _read(rows: list[torch.Tensor]) -> list[list[float]]:
    """Every stats row as floats: one host transfer per device."""
    out: list[list[float]] = [[] for _ in rows]
    by_device: dict[Any, list[int]] = {}
    for i, r in enumerate(rows):
        by_device.setdefault(r.device, []).append(i)
    for idx in by_device.values():
        block = torch.stack([rows[i] for i in idx]).tolist()
        for i, values in zip(idx, block, strict=True):
            out[i] = values
    return out


@contextmanager
def record_numerics(model: torch.nn.Module | None = None) -> Iterator[NumericsRun]:
    """Record every op of the forward and backward run inside the block, with each output's
    statistics and fixed-seed sketch, and (with ``model``) each parameter's gradient.

    Args:
        model: the model whose modules name the ops (``encoder.layers.0``) and whose
            parameters name the leaves and gradients; None records ops only.

    Yields:
        A ``NumericsRun``, filled when the block ends: compare two with ``gs.compare_runs``,
        save one with ``.save(path)``.

    Nothing is recorded outside the block, and nothing in the step changes (the mode only
    reads each op's output). Under ``torch.distributed`` each process records its own run
    (``rank``, ``world``).

    Example:
        >>> import torch, gradscope as gs
        >>> m = torch.nn.Linear(4, 2)
        >>> with gs.record_numerics(m) as run:
        ...     m(torch.ones(3, 4)).square().sum().backward()
        >>> [op.op for op in run.ops][:2], [p.name for p in run.params]
        (['aten.addmm', 'aten.pow'], ['weight', 'bias'])
    """
    if isinstance(model, torch.nn.parallel.DistributedDataParallel):
        model = model.module  # the names of the model it wraps, as a single process has them
    run = NumericsRun(model=type(model).__name__ if model is not None else None, k=K,
                      seed=SEED, torch=torch.__version__)
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        run.rank, run.world = dist.get_rank(), dist.get_world_size()
    rec = Recorder(model, Projector(K, SEED))
    hooks = dynamo.ModuleHooks(rec.pre, rec.post).install() if model is not None else None
    scope_block: Any = None
    if model is not None:
        from ..graph.scopes import scopes

        try:
            scope_block = scopes(model)
            scope_block.__enter__()
        except ScopesError:  # the caller has a scopes block open: it stamps the nodes
            scope_block = None
    mode = _Mode(rec)
    try:
        with mode:
            yield run
    finally:
        if scope_block is not None:
            scope_block.__exit__(None, None, None)
        if hooks is not None:
            hooks.remove()
        rec.finish(run)
