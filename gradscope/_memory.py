"""Memory held by autograd graphs: what a graph holds, what each module saves, and leaks.

Three views of the same thing, the tensors autograd saves for backward:

- ``graph_memory(graph)`` (``Graph.memory()``): from a traced ``Graph``, after the fact. Each
  storage counts once; it is an *activation* when only the graph holds it, a *leaf* storage
  when it aliases a leaf (a parameter or an input that requires grad), an *output* storage
  when it aliases a tensor handed to ``trace``.
- ``saved_memory(model=None)``: live, during a forward, through
  ``torch.autograd.graph.saved_tensors_hooks``: bytes per module and the peak, plus CUDA
  allocator figures before and after the forward (and backward) when tensors are on a GPU.
- ``leak_check()``: at each training step, the graphs of earlier steps that are still alive
  (a loss kept in a list without ``.detach()``), with the bytes their saved tensors hold.

Attribution: a storage saved by several nodes belongs to the first of them in forward order
(live: the module running when it was first saved; in a ``Graph``: the first saver in a
post-order walk from the roots, which is forward order for the usual left-to-right code), so
per-node and per-module figures add up to the total.

Errors and warnings::

    GradscopeError
    └── MemoryHooksError   saved-tensor hooks could not be installed or removed in order
    UserWarning
    └── GraphLeakWarning   leak_check found the graph of an earlier step still alive
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ._errors import GradscopeError
from ._model import Graph, format_bytes
from ._views import levels

ACTIVATION, LEAF, OUTPUT = "activation", "leaf", "output"

#: Key under which ``leak_check`` stamps a node's step token into ``grad_fn.metadata``.
LEAK_KEY = "gradscope.leak_step"


class MemoryHooksError(GradscopeError):
    """Saved-tensor hooks could not be installed, or were removed out of order."""


# ====================================================================== the report
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

    An input that does not require grad is no node of the graph, so its storage counts as an
    activation: the graph does keep it alive. Buffers (BatchNorm's running statistics) too.

    Example:
        >>> import torch, gradscope as gs
        >>> x = torch.ones(4, requires_grad=True)
        >>> gs.trace(x.exp().sum()).memory().total      # exp keeps its result: 4 float32
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

    def node_labels(self) -> dict[str, str]:
        """A short label per node that holds bytes (``1.5 KiB``), for renderers."""
        return {nid: format_bytes(n) for nid, n in self.by_node.items() if n}

    def summary(self) -> str:
        """One line: total, and how it splits."""
        peak = f", peak {format_bytes(self.peak)}" if self.peak is not None else ""
        return (
            f"saved tensors hold {format_bytes(self.total)} in {len(self.storages)} storages: "
            f"{format_bytes(self.activation_bytes)} activations (held only by the graph), "
            f"{format_bytes(self.leaf_bytes)} alias leaves (parameters, inputs), "
            f"{format_bytes(self.output_bytes)} alias outputs{peak}"
        )

    def render(self, *, depth: int | None = None, top: int = 20) -> Group:
        """A rich renderable: summary, bytes per module cut to ``depth``, CUDA figures."""
        return render_memory(self, depth=depth, top=top)

    def __rich__(self) -> Group:
        return render_memory(self)


def render_memory(report: MemoryReport, *, depth: int | None = None, top: int = 20) -> Group:
    """A rich renderable: the summary, bytes per module (or per node), CUDA figures.

    Args:
        report: what ``Graph.memory()`` or ``saved_memory`` measured.
        depth: cut module paths to this many components.
        top: show at most this many rows.
    """
    parts: list[Any] = [Text(report.summary())]
    rows = _rows(report, depth)
    if rows:
        title = "module" if report.by_module and set(report.by_module) != {None} else "node"
        table = Table(title=None, box=None, pad_edge=False, show_edge=False)
        table.add_column(title)
        table.add_column("saved", justify="right")
        table.add_column("share", justify="right")
        for label, n in rows[:top]:
            share = f"{100.0 * n / report.total:.1f}%" if report.total else "-"
            table.add_row(label, format_bytes(n), share)
        if len(rows) > top:
            rest = sum(n for _, n in rows[top:])
            table.add_row(f"… {len(rows) - top} more", format_bytes(rest), "")
        parts.append(table)
    for snap in report.cuda:
        parts.append(
            Text(
                f"{snap.device} {snap.phase}: allocated {format_bytes(snap.allocated)}, "
                f"reserved {format_bytes(snap.reserved)}, "
                f"max allocated {format_bytes(snap.max_allocated)}"
            )
        )
    return Group(*parts)


def _rows(report: MemoryReport, depth: int | None) -> list[tuple[str, int]]:
    if report.by_module and set(report.by_module) != {None}:
        items = report.module_bytes(depth).items()
        rows = [("(outside modules)" if k is None else (k or "(root)"), n) for k, n in items]
    else:
        names = report.node_names
        rows = [(f"{nid} {names.get(nid, '')}".rstrip(), n) for nid, n in report.by_node.items()]
    return sorted((r for r in rows if r[1]), key=lambda r: -r[1])


# ====================================================================== Graph.memory()
def graph_memory(graph: Graph) -> MemoryReport:
    """Bytes held by a graph's saved tensors, per storage, node and module.

    Args:
        graph: a graph from ``gs.trace`` (module paths come from ``gs.scopes``).

    Returns:
        The ``MemoryReport``; ``Graph.memory()`` returns the same.

    Example:
        >>> import torch, gradscope as gs
        >>> lin = torch.nn.Linear(3, 2)
        >>> with gs.scopes(lin):
        ...     out = lin(torch.randn(4, 3))
        >>> rep = gs.trace(out.relu().sum(), model=lin).memory()
        >>> rep.by_module    # Linear keeps its input; relu, outside the model, its result
        {'': 48, None: 32}
    """
    aliases = _alias_kinds(graph)
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
    for sid, size in sizes.items():
        node = graph.node(owner[sid])
        use = StorageUse(sid, size, aliases.get(sid, ACTIVATION), node.id, node.module, savers[sid])
        _add(report, use)
        report.by_node[node.id] = report.by_node.get(node.id, 0) + size
        report.node_names[node.id] = node.name
    report.storages.sort(key=lambda u: -u.nbytes)
    return report


def _add(report: MemoryReport, use: StorageUse) -> None:
    report.storages.append(use)
    report.total += use.nbytes
    if use.kind == LEAF:
        report.leaf_bytes += use.nbytes
    elif use.kind == OUTPUT:
        report.output_bytes += use.nbytes
    else:
        report.activation_bytes += use.nbytes
    report.by_module[use.module] = report.by_module.get(use.module, 0) + use.nbytes


def _alias_kinds(graph: Graph) -> dict[str, str]:
    """Storage id -> ``leaf``/``output`` for storages of leaf and output tensors (leaf wins)."""
    kinds: dict[str, str] = {}
    for n in graph.nodes:
        if n.kind in (LEAF, OUTPUT) and n.tensor is not None and n.tensor.storage is not None:
            if kinds.get(n.tensor.storage) != LEAF:
                kinds[n.tensor.storage] = n.kind
    return kinds


def _forward_rank(graph: Graph) -> dict[str, int]:
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
    for start in starts:
        if start in seen:
            continue
        seen.add(start)
        stack: list[tuple[str, Iterator[str]]] = [(start, iter(kids.get(start, ())))]
        while stack:
            nid, it = stack[-1]
            nxt = next((k for k in it if k not in seen), None)
            if nxt is None:
                stack.pop()
                rank[nid] = len(rank)
            else:
                seen.add(nxt)
                stack.append((nxt, iter(kids.get(nxt, ()))))
    return rank


# ====================================================================== saved-tensor hooks
class _Listener:
    """Something that wants to see every tensor autograd saves (saved_memory, leak_check)."""

    def on_pack(self, tensor: torch.Tensor, payload: torch.Tensor) -> None:
        raise NotImplementedError


_LISTENERS: list[_Listener] = []


def _pack(tensor: torch.Tensor) -> torch.Tensor:
    # Returning ``tensor`` itself would make a saved output hold its own grad_fn: a reference
    # cycle through C++ that Python's GC cannot break. A detached alias shares the storage
    # (and the version counter), so backward reads exactly the same bytes; being a plain
    # tensor, ``gs.trace`` reads it like any saved tensor.
    payload = tensor.detach()
    payload._gradscope_version = tensor._version  # type: ignore[attr-defined]
    for listener in _LISTENERS:
        listener.on_pack(tensor, payload)
    return payload


def _unpack(payload: torch.Tensor) -> torch.Tensor:
    version = payload._gradscope_version  # type: ignore[attr-defined]
    # Autograd skips its own version check when hooks are set; do it here so that an in-place
    # change of a saved tensor still fails as it would without gradscope.
    if payload._version != version:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [{payload.type()} {list(payload.shape)}] is at version "
            f"{payload._version}; expected version {version} instead. Hint: the tensor was "
            "changed in place after it was saved for backward; use an out-of-place operation"
        )
    return payload


class _HooksGuard:
    """Pushes gradscope's pack/unpack pair for a listener, and pops it only if still on top."""

    def __init__(self, listener: _Listener) -> None:
        self.listener = listener
        self.pushed = False

    def push(self) -> None:
        if not torch._C._autograd._saved_tensors_hooks_is_enabled():
            raise MemoryHooksError(
                "saved-tensor hooks are disabled here (inside torch.compile or functorch?); "
                "run the forward eagerly to measure saved memory"
            )
        torch._C._autograd._push_saved_tensors_default_hooks(_pack, _unpack)
        _LISTENERS.append(self.listener)
        self.pushed = True

    def pop(self) -> None:
        if not self.pushed:
            return
        self.pushed = False
        if self.listener in _LISTENERS:
            _LISTENERS.remove(self.listener)
        top = torch._C._autograd._top_saved_tensors_default_hooks(False)
        if top is None or top[0] is not _pack:
            raise MemoryHooksError(
                "other saved_tensors_hooks were pushed after gradscope's and not popped; "
                "close them before closing gradscope's saved_memory / leak_check"
            )
        torch._C._autograd._pop_saved_tensors_default_hooks()


def _storage_of(t: torch.Tensor) -> tuple[Any, int]:
    """(key, bytes) of ``t``'s storage; storage-less tensors count as their own storage."""
    try:
        st = t.untyped_storage()
        return (t.device.type, st._cdata), st.nbytes()
    except (RuntimeError, NotImplementedError, AttributeError):
        return ("tensor", id(t)), t.numel() * t.element_size()


def _leaf_base(t: torch.Tensor) -> bool:
    base = t._base if t._is_view() and t._base is not None else t
    return base.is_leaf and base.requires_grad


# ====================================================================== CUDA figures
def _model_cuda_device(model: torch.nn.Module | None) -> torch.device | None:
    """The CUDA device of the model's first parameter on a GPU, if any."""
    if model is not None:
        for p in model.parameters():
            if p.device.type == "cuda":
                return p.device
    return None


def _current_cuda_device() -> torch.device | None:
    """The current CUDA device, if CUDA is already in use (never initialises it)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return None


def cuda_snapshot(phase: str, device: torch.device) -> CudaSnapshot:
    """The allocator figures of ``device`` now, labelled ``phase``."""
    return CudaSnapshot(
        phase,
        str(device),
        torch.cuda.memory_allocated(device),
        torch.cuda.memory_reserved(device),
        torch.cuda.max_memory_allocated(device),
    )


# ====================================================================== live accounting
@dataclass(slots=True)
class _Entry:
    nbytes: int
    module: str | None
    refs: int


class SavedMemory(_Listener):
    """Live accounting of saved tensors during a forward; build it with ``saved_memory``."""

    def __init__(self, model: torch.nn.Module | None = None, *, reset_peak: bool = True) -> None:
        self.model = model
        self.reset_peak = reset_peak
        # Reentrant: a GC pass inside a locked block may free a payload and run its callback.
        self._lock = threading.RLock()
        self._entries: dict[Any, _Entry] = {}
        self._order: dict[Any, int] = {}  # storage key -> first-seen index (its sN id)
        self._leaf_keys: set[Any] = set()
        self._refs: dict[int, weakref.ref[torch.Tensor]] = {}
        self._held = 0
        self._peak = 0
        self._saved_total = 0
        self._rec: Any = None
        self._handles: list[Any] = []
        self._guard = _HooksGuard(self)
        self._cuda: list[CudaSnapshot] = []
        self._device: torch.device | None = None
        self._saw_cuda = False
        self._report: MemoryReport | None = None
        self._open = False

    # -------------------------------------------------------------- context
    def __enter__(self) -> SavedMemory:
        if self._open:
            raise MemoryHooksError("this saved_memory block is already open; use a new one")
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        if self.model is not None:
            self._adopt(self.model)
        model_device = _model_cuda_device(self.model)
        self._device = model_device or _current_cuda_device()
        self._saw_cuda = model_device is not None  # else: known once a CUDA tensor is saved
        if self._device is not None:
            if self.reset_peak:
                torch.cuda.reset_peak_memory_stats(self._device)
            self._cuda.append(cuda_snapshot("before forward", self._device))
        self._handles = [
            register_module_forward_pre_hook(self._pre),
            register_module_forward_hook(self._post, always_call=True),
        ]
        try:
            self._guard.push()
        except BaseException:
            self._remove_module_hooks()
            raise
        self._open = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._open = False
        try:
            self._guard.pop()
        finally:
            self._remove_module_hooks()
            self._finish()

    def _remove_module_hooks(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    # -------------------------------------------------------------- modules
    def _adopt(self, model: torch.nn.Module) -> None:
        from . import _capture, _scopes

        self._rec = _scopes._Recorder(model)
        _capture.SCOPES_USED = True  # the recorder stamps nodes: let trace read them
        _scopes.MODULE_CLASSES.update(self._rec.classes)
        for p in model.parameters():
            if p.requires_grad:
                self._leaf_keys.add(_storage_of(p)[0])

    def _pre(self, module: torch.nn.Module, args: Any) -> None:
        if self._rec is None and self.model is None:
            self._adopt(module)  # no model given: the first module called is the model
        self._rec.pre(module, args)

    def _post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._rec is not None:
            self._rec.post(module, args, output)

    def _module(self) -> str | None:
        return None if self._rec is None else self._rec.stack[-1].path

    # -------------------------------------------------------------- saved tensors
    def on_pack(self, tensor: torch.Tensor, payload: torch.Tensor) -> None:
        key, nbytes = _storage_of(tensor)
        if tensor.device.type == "cuda":
            self._saw_cuda = True
            if self._device is None:
                self._device = tensor.device
        with self._lock:
            if _leaf_base(tensor):
                self._leaf_keys.add(key)
            entry = self._entries.get(key)
            if entry is None:
                entry = _Entry(nbytes, self._module(), 0)
                self._entries[key] = entry
                self._order.setdefault(key, len(self._order))
                self._held += nbytes
                self._saved_total += nbytes
                self._peak = max(self._peak, self._held)
            entry.refs += 1
        ref = weakref.ref(payload, self._released_cb(key))
        self._refs[id(ref)] = ref

    def _released_cb(self, key: Any) -> Any:
        def released(ref: weakref.ref[torch.Tensor]) -> None:
            # May run on an autograd worker thread when backward frees the graph.
            with self._lock:
                self._refs.pop(id(ref), None)
                entry = self._entries.get(key)
                if entry is None:
                    return
                entry.refs -= 1
                if entry.refs == 0:
                    del self._entries[key]
                    self._held -= entry.nbytes

        return released

    def _finish(self) -> None:
        if self._saw_cuda and self._device is not None:
            self._cuda.append(cuda_snapshot("after forward", self._device))
        else:
            self._cuda.clear()  # a CPU forward: CUDA figures would be about something else
        with self._lock:
            report = MemoryReport(peak=self._peak, saved_total=self._saved_total)
            for key, entry in sorted(self._entries.items(), key=lambda kv: self._order[kv[0]]):
                kind = LEAF if key in self._leaf_keys else ACTIVATION
                sid = f"s{self._order[key]}"
                _add(report, StorageUse(sid, entry.nbytes, kind, None, entry.module, entry.refs))
        report.storages.sort(key=lambda u: -u.nbytes)
        report.cuda = list(self._cuda)
        self._report = report

    # -------------------------------------------------------------- results
    def report(self) -> MemoryReport:
        """The figures measured by the block (available once it has closed)."""
        if self._report is None:
            raise MemoryHooksError(
                "saved_memory has no figures yet: read them after the with-block closes"
            )
        return self._report

    @property
    def total(self) -> int:
        """Bytes held by saved tensors when the block closed (each storage once)."""
        return self.report().total

    @property
    def peak(self) -> int:
        """Most bytes held by saved tensors at any moment during the block."""
        return self.report().peak or 0

    @property
    def by_module(self) -> dict[str | None, int]:
        """Bytes held at the end of the block, per module path (sums to ``total``)."""
        return self.report().by_module

    @property
    def held_now(self) -> int:
        """Bytes the saved tensors recorded by the block still hold right now."""
        with self._lock:
            return self._held

    def backward(self) -> _BackwardPhase:
        """A context manager adding CUDA figures before and after a backward call.

        Example:
            >>> with gs.saved_memory(model) as mem:       # doctest: +SKIP
            ...     loss = model(x).sum()
            >>> with mem.backward():                       # doctest: +SKIP
            ...     loss.backward()
        """
        return _BackwardPhase(self)

    def __rich__(self) -> Group:
        return render_memory(self.report())


class _BackwardPhase:
    def __init__(self, mem: SavedMemory) -> None:
        self.mem = mem

    def __enter__(self) -> None:
        dev = self.mem._device
        if dev is not None and self.mem._report is not None and self.mem._report.cuda:
            if self.mem.reset_peak:
                torch.cuda.reset_peak_memory_stats(dev)
            self.mem._report.cuda.append(cuda_snapshot("before backward", dev))

    def __exit__(self, *exc: object) -> None:
        dev = self.mem._device
        if dev is not None and self.mem._report is not None and self.mem._report.cuda:
            self.mem._report.cuda.append(cuda_snapshot("after backward", dev))


def saved_memory(model: torch.nn.Module | None = None, *, reset_peak: bool = True) -> SavedMemory:
    """Record, during a forward, the bytes autograd saves per module and their peak.

    Built on ``torch.autograd.graph.saved_tensors_hooks``: each saved tensor is kept as a
    detached alias of itself (same storage, same bytes), so results are bitwise identical
    and in-place changes of saved tensors still raise as usual. Module forward hooks (global,
    removed on exit) tell which module is running; without ``model`` the first module called
    is taken as the model. The nodes created are also stamped like ``gs.scopes`` does, so a
    ``gs.trace`` of the output carries the same module paths. Tensors saved inside a region
    with hooks of its own (``torch.utils.checkpoint(use_reentrant=False)``) are not seen, and
    neither are tensors a custom Function keeps on ``ctx`` instead of ``save_for_backward``.

    On a GPU the report also holds ``memory_allocated``, ``memory_reserved`` and
    ``max_memory_allocated`` before and after the forward (``reset_peak`` resets the peak
    counter first); wrap the backward in ``mem.backward()`` for its figures too.

    Args:
        model: the module whose submodules name the scopes (default: the first one called).
        reset_peak: reset CUDA's peak counter at the start of each phase.

    Example:
        >>> import torch, gradscope as gs
        >>> net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh())
        >>> with gs.saved_memory(net) as mem:
        ...     out = net(torch.randn(4, 8))
        >>> mem.by_module                    # Linear saves its input, Tanh its output
        {'0': 128, '1': 512}
    """
    return SavedMemory(model, reset_peak=reset_peak)


# ====================================================================== leak detector
class GraphLeakWarning(UserWarning):
    """An autograd graph from an earlier training step is still alive."""


class _StepToken:
    """Stamped into the metadata of every node a step creates; dies with the last of them."""

    __slots__ = ("step", "__weakref__")

    def __init__(self, step: int) -> None:
        self.step = step


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


class LeakCheck(_Listener):
    """Notices autograd graphs of earlier steps still alive; build it with ``leak_check``.

    Interface (what the gradient monitor's ``leaks=True`` uses)::

        check = LeakCheck(grace=1, warn=False).start()   # saved-tensor hooks on
        found = check.step()        # at the end of each step: a LeakStep
        found.leaks                 # tuple of Leak(step, seen_at, saved_bytes, saved_tensors)
        found.held_bytes            # bytes all earlier live graphs hold (each storage once)
        check.history, check.leaks  # every LeakStep; the latest Leak per leaking step
        check.remove()              # hooks off (safe twice); results stay readable
    """

    def __init__(self, *, grace: int = 1, warn: bool = True) -> None:
        if grace < 1:
            raise GradscopeError(
                f"leak_check(grace={grace}): grace must be at least 1, since the graph of "
                "the step just ended is normally still referenced by its loss"
            )
        self.grace = grace
        self.warn = warn
        self.history: list[LeakStep] = []
        self._step = 0
        self._token = _StepToken(0)
        self._tokens: dict[int, weakref.ref[_StepToken]] = {}
        self._saved: dict[int, list[tuple[weakref.ref[torch.Tensor], Any, int]]] = {}
        self._warned: set[int] = set()
        self._guard = _HooksGuard(self)

    # -------------------------------------------------------------- lifecycle
    def start(self) -> LeakCheck:
        """Install the saved-tensor hooks; calling it again does nothing."""
        if not self._guard.pushed:
            self._guard.push()
        return self

    def remove(self) -> None:
        """Remove the hooks; safe to call twice. ``history`` stays readable."""
        self._guard.pop()

    def __enter__(self) -> LeakCheck:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # -------------------------------------------------------------- recording
    def on_pack(self, tensor: torch.Tensor, payload: torch.Tensor) -> None:
        key, nbytes = _storage_of(tensor)
        if _leaf_base(tensor):
            nbytes = 0  # a parameter's storage: the model holds it whether the graph lives or not
        self._saved.setdefault(self._step, []).append((weakref.ref(payload), key, nbytes))
        fn = tensor.grad_fn
        if fn is not None:
            meta = fn.metadata
            if LEAK_KEY not in meta:  # a node of an earlier step keeps that step's token
                meta[LEAK_KEY] = self._token

    # -------------------------------------------------------------- checking
    def step(self) -> LeakStep:
        """Mark the end of a training step; return the earlier graphs still alive.

        The graph of the step just ended (and of the ``grace - 1`` before it) is not checked:
        the loop's ``loss`` variable normally holds it until the next step rebinds it.
        """
        ended = self._step
        self._tokens[ended] = weakref.ref(self._token)
        leaks: list[Leak] = []
        held: dict[Any, int] = {}
        for s in self._old_steps(ended):
            found_s = self._alive(s, ended, held)
            if found_s is not None:
                leaks.append(found_s)
        found = LeakStep(ended, tuple(leaks), sum(held.values()))
        self.history.append(found)
        self._step = ended + 1
        self._token = _StepToken(self._step)
        if self.warn:
            for leak in leaks:
                if leak.step not in self._warned:
                    self._warned.add(leak.step)
                    warnings.warn(str(leak), GraphLeakWarning, stacklevel=2)
        return found

    def _old_steps(self, ended: int) -> list[int]:
        steps = set(self._tokens) | set(self._saved)
        return sorted(s for s in steps if s <= ended - self.grace)

    def _alive(self, s: int, ended: int, held: dict[Any, int]) -> Leak | None:
        saved = [e for e in self._saved.get(s, ()) if e[0]() is not None]
        if saved:
            self._saved[s] = saved
        else:
            self._saved.pop(s, None)
        token_ref = self._tokens.get(s)
        token_alive = token_ref is not None and token_ref() is not None
        if not token_alive:
            self._tokens.pop(s, None)
        if not saved and not token_alive:
            return None
        storages = {key: n for _, key, n in saved}
        held.update(storages)
        return Leak(s, ended, sum(storages.values()), len(saved))

    @property
    def leaks(self) -> list[Leak]:
        """The latest finding for every step whose graph was found alive."""
        latest: dict[int, Leak] = {}
        for found in self.history:
            for leak in found.leaks:
                latest[leak.step] = leak
        return [latest[s] for s in sorted(latest)]

    def report(self) -> Text:
        """A rich renderable: one line per step whose graph leaked, or a clean bill."""
        if not self.leaks:
            return Text(f"no autograd graph outlived its step ({len(self.history)} steps checked)")
        text = Text()
        last = self.history[-1]
        text.append(
            f"{len(self.leaks)} earlier graphs still alive; at step {last.step} they hold "
            f"{format_bytes(last.held_bytes)} of saved tensors\n",
            "bold red",
        )
        for leak in self.leaks:
            text.append(f"  step {leak.step}: {format_bytes(leak.saved_bytes)} "
                        f"({leak.saved_tensors} saved tensors), seen at step {leak.seen_at}\n")
        return text

    def __rich__(self) -> Text:
        return self.report()


def leak_check(*, grace: int = 1, warn: bool = True) -> LeakCheck:
    """Notice autograd graphs of earlier training steps that are still alive.

    The hooks go on at once (or use it as a context manager); ``.remove()`` takes them off.
    Call ``.step()`` once at the end of every training step. Every tensor saved for backward
    is recorded with its step, and the nodes that produced them are stamped with the step;
    at each ``.step()`` the graphs of steps older than ``grace`` steps that still hold saved
    tensors or nodes are reported (``LeakStep``, ``.history``, a ``GraphLeakWarning`` per
    leaking step when ``warn``). A correct loop stays silent. Results are unchanged (saved
    tensors are kept as detached aliases; in-place changes still raise).

    Args:
        grace: steps a graph may outlive its own step (1: the loop's ``loss`` variable).
        warn: issue a ``GraphLeakWarning`` the first time each step's graph is found alive.

    Example:
        >>> import torch, gradscope as gs
        >>> w = torch.ones(3, requires_grad=True)
        >>> kept = []
        >>> with gs.leak_check(warn=False) as lc:
        ...     for _ in range(3):
        ...         loss = (w.exp() * 2).sum()
        ...         kept.append(loss)            # the bug: the graph stays alive
        ...         found = lc.step()
        >>> [leak.step for leak in lc.history[-1].leaks]
        [0, 1]
    """
    return LeakCheck(grace=grace, warn=warn).start()
