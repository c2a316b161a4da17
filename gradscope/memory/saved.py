"""Live accounting of the tensors autograd saves, and the detector of graphs kept alive.

- ``saved_memory(model=None)``: during a forward, through
  ``torch.autograd.graph.saved_tensors_hooks``: bytes per module and the peak, plus CUDA
  allocator figures before and after the forward (and backward) when tensors are on a GPU.
- ``leak_check()``: at each training step, the graphs of earlier steps that are still alive
  (a loss kept in a list without ``.detach()``), with the bytes their saved tensors hold.

Both produce the plain records of ``gradscope.memory.saved_records`` (``MemoryReport``, ``Leak``,
``LeakStep``); what a traced ``Graph`` holds is ``Graph.memory()``, computed from the graph alone.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from .._torch import dynamo, torchcompat
from .._torch.handles import HookHandle
from .._torch.stamps import LEAK_KEY
from ..errors import GradscopeError, GraphLeakWarning, MemoryHooksError
from ..graph.scopes import ScopeRecorder
from ..output.formats import renderer
from .saved_records import (
    ACTIVATION,
    LEAF,
    CudaSnapshot,
    Leak,
    LeakStep,
    MemoryReport,
    StorageUse,
    add_use,
)


# ====================================================================== saved-tensor hooks
class _Listener:
    """Something that wants to see every tensor autograd saves (saved_memory, leak_check)."""

    def on_pack(self, tensor: torch.Tensor, payload: torch.Tensor) -> None:
        raise NotImplementedError


_LISTENERS: list[_Listener] = []


def _pack(tensor: torch.Tensor) -> torch.Tensor:
    if dynamo.compiling():  # a tensor of a graph being traced, not one the program saves
        return tensor
    # Returning ``tensor`` itself would make a saved output hold its own grad_fn: a reference
    # cycle through C++ that Python's GC cannot break. A detached alias shares the storage
    # (and the version counter), so backward reads exactly the same bytes; being a plain
    # tensor, ``gs.trace`` reads it like any saved tensor.
    payload = tensor.detach()
    payload._gradscope_version = torchcompat.tensor_version(tensor)  # type: ignore[attr-defined]
    for listener in _LISTENERS:
        listener.on_pack(tensor, payload)
    return payload


def _unpack(payload: torch.Tensor) -> torch.Tensor:
    version = getattr(payload, "_gradscope_version", None)
    if version is None:  # packed while compiling (see _pack)
        return payload
    # Autograd skips its own version check when hooks are set; do it here so that an in-place
    # change of a saved tensor still fails as it would without gradscope.
    now = torchcompat.tensor_version(payload)
    if now != version:
        raise RuntimeError(
            "one of the variables needed for gradient computation has been modified by an "
            f"inplace operation: [{payload.type()} {list(payload.shape)}] is at version "
            f"{now}; expected version {version} instead. Hint: the tensor was "
            "changed in place after it was saved for backward; use an out-of-place operation"
        )
    return payload


class _HooksGuard:
    """Pushes gradscope's pack/unpack pair for a listener, and pops it only if still on top."""

    def __init__(self, listener: _Listener) -> None:
        self.listener = listener
        self.pushed = False

    def push(self) -> None:
        missing = torchcompat.saved_hooks_missing()
        if missing is not None:
            raise MemoryHooksError(missing)
        if not torchcompat.saved_hooks_enabled():
            raise MemoryHooksError(
                "saved-tensor hooks are disabled here (inside torch.compile or functorch?); "
                "run the forward eagerly to measure saved memory"
            )
        # a compiled region saves its tensors while its frame runs: Dynamo must not compile
        # these hooks as frames of their own
        dynamo.eager_only(_pack, _unpack)
        torchcompat.push_saved_hooks(_pack, _unpack)
        _LISTENERS.append(self.listener)
        self.pushed = True

    def pop(self) -> None:
        if not self.pushed:
            return
        self.pushed = False
        if self.listener in _LISTENERS:
            _LISTENERS.remove(self.listener)
        top = torchcompat.top_saved_hooks()
        if top is None or top[0] is not _pack:
            raise MemoryHooksError(
                "other saved_tensors_hooks were pushed after gradscope's and not popped; "
                "close them before closing gradscope's saved_memory / leak_check"
            )
        torchcompat.pop_saved_hooks()


def _storage_of(t: torch.Tensor) -> tuple[Any, int]:
    """(key, bytes) of ``t``'s storage; storage-less tensors count as their own storage."""
    try:
        return (t.device.type, torchcompat.storage_key(t)), t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError, AttributeError, TypeError):
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
        self._handles = HookHandle()
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
        if self.model is not None:
            self._adopt(self.model)
        model_device = _model_cuda_device(self.model)
        self._device = model_device or _current_cuda_device()
        self._saw_cuda = model_device is not None  # else: known once a CUDA tensor is saved
        if self._device is not None:
            if self.reset_peak:
                torch.cuda.reset_peak_memory_stats(self._device)
            self._cuda.append(cuda_snapshot("before forward", self._device))
        handles = self._handles
        try:
            handles.add(dynamo.ModuleHooks(self._pre, self._post).install())
            self._guard.push()
            handles.add(self._guard.pop)  # removed first: the newest hook goes first
        except BaseException:
            handles.remove()
            raise
        self._open = True
        return self

    def __exit__(self, *exc: object) -> None:
        self._open = False
        try:
            self._handles.remove()
            if self._rec is not None:
                self._rec.close()
        finally:
            self._finish()

    # -------------------------------------------------------------- modules
    def _adopt(self, model: torch.nn.Module) -> None:
        self._rec = ScopeRecorder(model)
        # parameters (frozen ones too) and buffers are alive without the graph, as
        # ``gs.trace(model=...)`` and ``activation_report`` count them
        for p in (*model.parameters(), *model.buffers()):
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
                add_use(report, StorageUse(sid, entry.nbytes, kind, None, entry.module, entry.refs))
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

    def __rich__(self) -> Any:
        return self.report().render()


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
class _StepToken:
    """Stamped into the metadata of every node a step creates; dies with the last of them."""

    __slots__ = ("step", "__weakref__")

    def __init__(self, step: int) -> None:
        self.step = step


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
        self._handle = HookHandle()

    # -------------------------------------------------------------- lifecycle
    def start(self) -> LeakCheck:
        """Install the saved-tensor hooks; calling it again does nothing."""
        if not self._guard.pushed:
            self._guard.push()
            self._handle.add(self._guard.pop)
        return self

    def remove(self) -> None:
        """Remove the hooks; safe to call twice. ``history`` stays readable."""
        self._handle.remove()

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
            meta: dict[Any, Any] = fn.metadata  # type: ignore[assignment]  # a dict, not a method
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

    def report(self) -> Any:
        """A rich renderable: one line per step whose graph leaked, or a clean bill."""
        return renderer("leaks")(self.history, self.leaks)

    def __rich__(self) -> Any:
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
