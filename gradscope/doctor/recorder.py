"""What the autograd doctor records while the forward runs (``gs.doctor``'s torch function mode).

For every torch call in the block, a ``TorchFunctionMode`` (``_DoctorMode``) keeps:

- **lineage**: three Python ints per tensor, kept by the tensor's id beside a weak reference
  that tells whether it is still that tensor (dead ones are swept as the table doubles):
  ``dep``, a bitset over the watched parameters the tensor depends on *by value*, through any op
  (``.detach()``, ``.item()``, ``argmax``, integer casts, ops under ``no_grad`` included);
  ``live``, the bits of parameters a gradient can still reach it from; ``cuts``, a bitset over the
  *cut events* upstream of it. A cut event is one call where some parameter's bit was live in the
  inputs but not in the outputs: the op, its line, its module and why (``no_grad``,
  ``inference_mode``, ``detach``, ``data``, ``item``, ``integer``, ``nondiff``), or in some of
  its outputs only (``indices``: ``max(dim)``'s indices beside values that carry the gradient;
  ``nondiff_output``). Ops inside a custom Function's forward (grad off) cut nothing; an output
  the Function marked non-differentiable is found at its first use and cut at the ``.apply``
  line (``marked_nondiff``). Memory is three
  ints per live tensor (a bit per parameter) and one record per cut event, never sets of tensors.
  Python numbers, lists and arrays that ``.item()`` / ``.tolist()`` / ``.numpy()`` return keep
  their lineage while the same object is handed to a later torch call.
- **versions**: each tensor argument's version counter (``torchcompat.tensor_version``) before and
  after the call; a call that bumped one is an in-place write, logged per storage (the op, the
  user's line and module, the version it left), through a view too (``y[0].zero_()``). A
  property read (``.shape``, ``.T``, ``.grad``) writes nothing and is not checked.
- **new autograd nodes**: no Python object is made for a node while the forward runs (no
  ``grad_fn`` read, no ``metadata`` dict: a node's Python object and dict that live through
  the forward are walked by every full collection of the program's heap). Each call that made
  nodes is one record of the autograd sequence numbers they took (``CallRecords``: the
  thread's counter before and after the call, five ints in flat arrays, the call's site once
  per distinct op, line, module): the op, the line, the module, the call's index, the
  iteration (backward count) when it was made. A node is looked up only when a finding needs
  it (``_DoctorMode.node_record``: its ``_sequence_nr()``, bisected among the records'
  ranges). Records are bounded: beyond ``_RECORDS_KEPT`` those older than the last backward
  are dropped, but for the nodes of tensors still alive in the lineage table (a graph kept
  for a later backward, a carried hidden state). A custom Function's node is stamped instead
  (``node.metadata``, a ``_stamp`` string, read back by ``node_record``): it is made before
  the ops of its forward, by no call the mode sees. The tensors a node saved for backward are
  read from the graph's own ``_saved_*`` attributes when a finding needs them (``saved_of``):
  one changed in place since raises torch's version error, which says the version it was
  saved at, and is read through its ``SavedVariable`` handle. The graph's own saved tensors
  are read, not ``saved_tensors_hooks``: with hooks torch no longer checks versions, and the
  doctor must leave torch's error as it is. Nodes made while the user had saved-tensor hooks
  of their own (checkpointing, offloading) are recorded so, and their saved tensors are not
  read (unpacking would run their hooks). A node made on another thread (sequence numbers
  are per thread) or between the calls the mode sees (an optimizer step, a compiled region)
  is in no record.

- **forward errors**: an in-place op torch refuses while the forward runs (a leaf, a view of
  one, an output of ``unbind``/``split``, a custom Function's view) goes to ``on_error``, which
  gives the error to raise in its place (torch's, explained).

The user's line is ``stamps.user_frame``'s: the innermost frame outside torch and gradscope
(``_DoctorMode.line_of``: found once per module call for the calls inside it).

Memory, all told: three ints and a weak reference per live tensor with a lineage, five ints
per call that made nodes (bounded as above), a record per cut event and distinct site, the
newest in-place writes per storage. When the block ends (``_DoctorMode.close``) the lineage,
host values and call records are dropped, and the mode lets go of its owner's callbacks.

Cost, on a 4,000-layer chain of ``Linear`` + ``ReLU`` (``benchmarks/doctor_layers.py``: 8,000
ops, 12,000 module calls a step): about 1.3x of a plain step is an empty ``TorchFunctionMode``
with empty global module hooks; the doctor's own work is some 7 us of Python per op (the user's
line, 1.5: a walk out through torch's frames, per module call and per op; the inputs'
lineage, 1.5; the call record, 1.5; versions before and after, 1; the outputs' lineage, 1)
and about 1 us per module call (the module stack), 1.8-1.9x in all.
"""

from __future__ import annotations

import bisect
import os
import sys
import weakref
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from .._torch import dynamo, torchcompat
from .._torch.stamps import (
    INTERNAL_FILES,
    NO_SEQUENCE_NR,
    OWN_DIR,
    PASS_THROUGH,
    custom_apply,
    torch_internal,
    user_frame,
)
from .findings import Site, parse_inplace

#: The ``node.metadata`` key of the doctor's ``NodeRecord``.
DOCTOR_KEY = "gradscope.doctor"
#: In-place writes kept per storage (the newest), and storages with writes kept (the newest
#: half stays when there are more): a long run's temporaries do not pile up.
_WRITES_KEPT = 8
_STORAGES_KEPT = 1 << 16
#: Python values from ``.item()`` / ``.tolist()`` / ``.numpy()`` whose lineage is kept.
_HOST_KEPT = 1024
_HOST_TYPES = (int, float, bool, complex, list, tuple)
_CUT_OPS = {"detach": "detach", "detach_": "detach", "item": "item", "tolist": "item",
            "numpy": "item", "__get__": "data"}
_BACKWARD = "backward"
#: the next autograd sequence number of this thread (``torchcompat.next_sequence_nr``: read
#: without making a node where this torch has the getter; else a probe node takes one, which
#: ``_PROBED`` takes off the end of a call's range)
_next_seq: Callable[[], int] = torchcompat.next_sequence_nr
_PROBED = 0 if torchcompat.sequence_nr_getter is not None else 1
#: call records kept (``CallRecords``) before those of calls older than the last backward
#: whose nodes no live tensor holds are dropped (then twice as many as stay)
_RECORDS_KEPT = 1 << 20
#: ``torch.is_grad_enabled``, the version of a tensor, the innermost saved-tensor hooks
_grad_on = torch.is_grad_enabled
_version_of = torchcompat.version_of
_HAS_HOOKS = torchcompat.HAS_SAVED_HOOKS
_saved_hooks_top = torchcompat.top_saved_hooks
#: lineage entries before the first sweep of dead tensors' (``_DoctorMode._sweep``)
_SWEEP_AT = 4096


@dataclass(frozen=True)
class SavedRecord:
    """A tensor a backward node saved: its storage, version at save time, shape, dtype, and
    which output of which node it is (``creator`` None for a leaf)."""

    storage: int | None
    version: int | None
    shape: tuple[int, ...]
    dtype: str
    creator: str | None
    output_nr: int


@dataclass
class NodeRecord:
    """What the doctor knows of one autograd node it saw made (``node_record``: read back from
    the plain tuple the mode stamps on the node)."""

    iteration: int
    op: str
    site: Site
    index: int = 0  # the call that made it (``_DoctorMode.index``)
    saved: list[SavedRecord] = field(default_factory=list)


#: a stamp field that is None (``_stamp``)
_NONE = "\x00"
_SEP = "\x1f"


def _stamp(iteration: int, index: int, readable: bool, op: str, line: str | None,
           module: str | None) -> str:
    """The stamp of the nodes one call made: a string, which the garbage collector does not
    track; a tuple would make the node's ``metadata`` dict a tracked object too, and each one
    that lives through the forward is walked by every full collection of the program's heap
    (the costliest part of watching a long forward). ``readable``: the nodes' saved tensors
    may be read back (no saved-tensor hooks of the user's were on: reading would run them)."""
    return (f"{iteration}{_SEP}{index}{_SEP}{'1' if readable else ''}{_SEP}"
            f"{_NONE if line is None else line}{_SEP}{_NONE if module is None else module}"
            f"{_SEP}{op}")


def node_record(fn: Any) -> NodeRecord | None:
    """The ``NodeRecord`` of autograd node ``fn`` (None: not one the doctor saw made): its
    stamp read back, and the tensors it saved read from the node now (``saved_of``), which
    tells the same as reading them when the node was made: a saved tensor changed in place
    since is the one whose read raises torch's version error, which gives the version it was
    saved at; any other is as it was saved."""
    meta = getattr(fn, "metadata", None) if fn is not None else None
    raw = meta.get(DOCTOR_KEY) if isinstance(meta, dict) else None
    if not isinstance(raw, str):
        return None
    iteration, index, readable, line, module, op = raw.split(_SEP, 5)
    return NodeRecord(int(iteration), op,
                      Site("made", op, None if line == _NONE else line,
                           None if module == _NONE else module),
                      int(index), saved_of(fn) if readable else [])


#: a call's user line and module (``_DoctorMode._at``: its path, or what ``path_of`` names)
_At = tuple["str | None", Any]
#: a call record's site: op, line, module (its path, or what ``_DoctorMode.path_of`` names),
#: whether the nodes' saved tensors may be read
_SiteKey = tuple[str, "str | None", Any, bool]


class CallRecords:
    """The calls that made autograd nodes, by the sequence numbers their nodes took: a node
    is found by its ``_sequence_nr()`` (``find``), so the forward makes no Python object for a
    node (no ``grad_fn`` read, no ``metadata`` dict) and the records hold no node alive.

    Autograd numbers the nodes each thread makes in the order it makes them, and the mode
    sees the calls of the thread that entered it one at a time (not the calls inside a call),
    so the nodes made while one call ran are the numbers from the counter's value before it
    to its value after (``[start, end)``), and the calls' ranges come in ascending order.
    A record is five ints in flat arrays (``starts``; ``info``: end, the call's index, its
    site, the iteration), the site (``sites``: op, line, module, whether the nodes' saved
    tensors may be read) kept once per distinct site. A node made on another thread (a
    device thread's double backward) or between the calls the mode saw (an optimizer step,
    a compiled region) is in no record.

    Memory: beyond ``limit`` records, those older than the last iteration (the latest
    backward) are dropped except the ones that made the node of a tensor still alive in the
    lineage table (a graph kept for a later backward, a hidden state carried over), and the
    limit becomes twice what stays."""

    def __init__(self, limit: int | None = None) -> None:
        self.starts = array("q")
        self.info = array("q")  # 4 per record: end, call index, site, iteration
        self.sites: list[_SiteKey] = []
        self.site_at: dict[_SiteKey, int] = {}
        self.limit = _RECORDS_KEPT if limit is None else limit

    def __len__(self) -> int:
        return len(self.starts)

    def add(self, start: int, end: int, index: int, iteration: int, op: str,
            line: str | None, module: str | None, readable: bool) -> None:
        """Record a call (the mode appends in place, the same way)."""
        key = (op, line, module, readable)
        site = self.site_at.get(key)
        if site is None:
            site = self.site(key)
        self.starts.append(start)
        self.info.extend((end, index, site, iteration))

    def site(self, key: _SiteKey) -> int:
        """The number of a site not kept yet (``sites``), kept."""
        site = self.site_at[key] = len(self.sites)
        self.sites.append(key)
        return site

    def find(self, seq: int) -> tuple[int, int, _SiteKey] | None:
        """``(call index, iteration, site)`` of the call that made node number ``seq``."""
        at = bisect.bisect_right(self.starts, seq) - 1
        if at < 0 or seq >= self.info[4 * at]:
            return None
        _, index, site, iteration = self.info[4 * at:4 * at + 4]
        return index, iteration, self.sites[site]

    def trim(self, iteration: int, alive: Iterable[int]) -> None:
        """Drop the records of iterations before ``iteration`` but those that made one of
        the nodes numbered ``alive`` (see the class docstring). The records come in the
        order of their iterations, so those kept whole are a tail, cut off in one slice."""
        starts, info = self.starts, self.info
        low, high = 0, len(starts)  # the first record of ``iteration`` or later
        while low < high:
            mid = (low + high) // 2
            if info[4 * mid + 3] < iteration:
                low = mid + 1
            else:
                high = mid
        held = set()  # records before the tail that made a node still alive
        for seq in alive:
            at = bisect.bisect_right(starts, seq) - 1
            if 0 <= at < low and seq < info[4 * at]:
                held.add(at)
        kept = sorted(held)
        head_starts = array("q", (starts[at] for at in kept))
        head_info = array("q")
        for at in kept:
            head_info.extend(info[4 * at:4 * at + 4])
        self.starts = head_starts + starts[low:]
        self.info = head_info + info[4 * low:]
        self.limit = max(self.limit, 2 * len(self.starts))


@dataclass(frozen=True)
class Write:
    """An in-place write: the version it left on the storage's counter, the op, where."""

    version: int
    index: int
    site: Site
    shape: tuple[int, ...]


@dataclass(frozen=True)
class CutEvent:
    """A call where a gradient path from some parameters ended (see the module docstring)."""

    index: int
    lost: int
    why: str
    site: Site


class BackwardLines:
    """The line of each backward of the block, by its number, and whether it kept its graph
    (``retain_graph``), kept as runs (a training loop calls backward from one line): as large
    as the number of times the line changed, not the number of steps, over a long run."""

    def __init__(self) -> None:
        self.starts: list[int] = []  # the number of the first backward of each run
        self.lines: list[str | None] = []
        self.retained: list[bool] = []
        self.count = 0

    def add(self, line: str | None, retained: bool = False) -> None:
        if not self.lines or (self.lines[-1], self.retained[-1]) != (line, retained):
            self.starts.append(self.count)
            self.lines.append(line)
            self.retained.append(retained)
        self.count += 1

    def at(self, number: int) -> str | None:
        """The line of backward ``number`` (0-based); None when there was none."""
        if not 0 <= number < self.count:
            return None
        return self.lines[bisect.bisect_right(self.starts, number) - 1]

    def freed_from(self, number: int) -> str | None:
        """The line of the first backward from ``number`` on that did not retain its graph
        (the one that freed a graph made before it); None when every one retained it."""
        if not 0 <= number < self.count:
            return None
        for run in range(bisect.bisect_right(self.starts, number) - 1, len(self.starts)):
            if not self.retained[run]:
                return self.lines[run]
        return None


#: ``file.py`` of each file name a line was read from (one ``basename`` per file)
_BASENAMES: dict[str, str] = {}


def _text(frame: Any) -> str:
    """``file.py:NN`` of ``frame``'s current line."""
    filename = frame.f_code.co_filename
    base = _BASENAMES.get(filename)
    if base is None:
        base = _BASENAMES[filename] = os.path.basename(filename)
    return f"{base}:{frame.f_lineno}"


def user_line(frame: Any) -> str | None:
    """``file.py:NN`` of the user's line at or above ``frame`` (``stamps.user_frame``: the
    first frame outside torch; None when gradscope itself made the call)."""
    frame = user_frame(frame)
    if frame is None:
        return None
    return _text(frame)


#: a module call whose line nobody asked for yet (``_DoctorMode.call_lines``)
_UNSET: Any = object()


def op_name(func: Any) -> str:
    """``sigmoid``, ``Tensor.data`` for the ``.data`` getter, ``__setitem__``..."""
    name = getattr(func, "__name__", None) or str(func)
    if name == "__get__":
        owner = getattr(getattr(func, "__self__", None), "__name__", None)
        return f"Tensor.{owner}" if owner else name
    return name


def _tensors(args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensor arguments of a call (one level into lists and tuples: ``torch.cat``)."""
    found = []
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


def _outputs(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return []


#: by node class: its ``_saved_*`` attributes that may hold tensors (one seen holding a number,
#: a string, sizes... is a non-tensor field of the class, and is not read again)
_SAVED_NAMES: dict[type, tuple[str, ...]] = {}


def _saved_names(node: Any) -> tuple[str, ...]:
    cls = type(node)
    names = _SAVED_NAMES.get(cls)
    if names is None:
        names = tuple(n for n in dir(cls) if n.startswith("_saved_"))
        _SAVED_NAMES[cls] = names
    return names


def _saved_record(t: torch.Tensor, version: int | None = None, creator: Any = False,
                  output_nr: int | None = None) -> SavedRecord:
    """``t``'s ``SavedRecord``; ``version``, ``creator``, ``output_nr`` in place of ``t``'s
    own where given (a tensor changed in place since it was saved: torch's error says them)."""
    try:
        storage: int | None = torchcompat.storage_key(t)
    except (RuntimeError, NotImplementedError, TypeError):
        storage = None
    if creator is False:
        fn = t.grad_fn
        creator = type(fn).__name__ if fn is not None else None
        output_nr = t.output_nr if fn is not None else 0
    if version is None:
        version = torchcompat.tensor_version(t)
    return SavedRecord(storage, version, tuple(t.shape), str(t.dtype), creator, output_nr or 0)


def _changed(fn: Any, name: str, exc: RuntimeError) -> list[SavedRecord]:
    """The records of the tensors behind the saved value ``name`` of ``fn`` whose read raised
    ``exc``: when it is torch's version error, read through the ``SavedVariable`` handles,
    unchecked, at the version the error says it was saved at."""
    parsed = parse_inplace(str(exc))
    if parsed is None:  # released by a backward, or another refusal: nothing to read
        return []
    try:
        tensors = torchcompat.raw_saved(fn, name)
    except (AttributeError, RuntimeError):
        return []
    found = []
    for t in tensors:
        if not (isinstance(t, torch.Tensor) and t.layout == torch.strided):
            continue
        if tuple(t.shape) == parsed.shape and torchcompat.tensor_version(t) == parsed.found:
            found.append(_saved_record(t, parsed.expected, parsed.node, parsed.output_nr))
        else:  # a tensor beside it in a saved list, as it is
            found.append(_saved_record(t))
    return found


def saved_of(node: Any) -> list[SavedRecord]:
    """The tensors ``node`` saved for backward, read from the graph itself, as they were
    when saved (a tensor changed in place since: through ``_changed``). Read when a finding
    needs them, not as the forward runs: reading a saved output makes a Python tensor that
    lives as long as the graph."""
    found: list[SavedRecord] = []
    values: list[Any] = []
    if torchcompat.is_custom_ctx(node):
        try:
            values.extend(node.saved_tensors)
        except RuntimeError as exc:
            found.extend(_changed(node, "_saved_tensors", exc))
    else:
        names = _saved_names(node)
        plain: list[str] = []  # names found holding no tensor
        for name in names:
            try:
                value = getattr(node, name)
            except RuntimeError as exc:  # changed in place, released, not a saved value
                found.extend(_changed(node, name, exc))
                continue
            if isinstance(value, torch.Tensor):
                values.append(value)
            elif isinstance(value, (list, tuple)):
                if value and not any(isinstance(v, torch.Tensor) or v is None for v in value):
                    plain.append(name)  # sizes, strides: not a tensor list
                values.extend(value)
            elif value is not None:
                plain.append(name)  # a number, a string, a dtype
        if plain:
            _SAVED_NAMES[type(node)] = tuple(n for n in names if n not in plain)
    for value in values:
        if isinstance(value, torch.Tensor) and value.layout == torch.strided:
            found.append(_saved_record(value))
    return found


class _DoctorMode(TorchFunctionMode):
    """The doctor's torch function mode (see the module docstring). ``on_backward`` is the
    owner's: backward calls (``Tensor.backward``, ``torch.autograd.grad``) go to it.

    Its cost per call is kept to a few dictionary reads and integer operations: the user's
    line of a call inside a module is the line of that module's call, found once per module
    call (``calls``, which the owner's module hooks keep); a tensor's lineage is three ints in
    a plain dictionary by id, beside a weak reference that tells whether the tensor is still
    the one (dead entries are swept as the dictionary doubles); the nodes a call made are one
    record of sequence numbers (``CallRecords``), read back by ``node_record``. The module of
    a call is the top of ``modules`` where the owner keeps that stack (else ``module_now()``),
    kept as it is there (the owner's module ids) and named by ``path_of`` only when a site is
    made: a cut, a write, a finding."""

    def __init__(self, bits: dict[int, int], on_backward: Callable[..., Any],
                 module_now: Callable[[], str | None],
                 params: list[torch.Tensor] | None = None,
                 on_error: Callable[[RuntimeError, str, Any, Any], BaseException | None]
                 | None = None) -> None:
        super().__init__()
        self.bits = bits  # id(parameter) -> its bit
        self.params = params or []  # by bit
        self.on_backward = on_backward
        #: a torch error a forward call raised: ``on_error(exc, op name, args, caller frame)``
        #: returns the error to raise in its place (torch's, explained), or None
        self.on_error = on_error
        #: tensors a custom Function's forward made -> where its ``.apply`` was called (an
        #: output it marked non-differentiable is cut there)
        self.custom_made: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.module_now = module_now
        self.iteration = 0
        self.index = 0
        #: lineage: id(tensor) -> (dep, live, cuts), valid while ``refs[id]`` is that tensor
        self.lineage: dict[int, tuple[int, int, int]] = {}
        self.refs: dict[int, Any] = {}  # id(tensor) -> a weak reference to it
        self.sweep_at = _SWEEP_AT
        self.host: dict[int, tuple[Any, int, int]] = {}  # id -> (object, dep, cuts)
        self.events: list[CutEvent] = []
        self.event_at: dict[tuple[int, str, Site], int] = {}  # (lost, why, site) -> its index
        self.writes: dict[int, list[Write]] = {}
        #: bit -> where the parameter was first used: (op, line, module) (``use_site``)
        self.first_use: dict[int, tuple[str, str | None, Any]] = {}
        self.frozen_use: dict[int, Site] = {}  # bit -> first use while requires_grad=False
        self.compiled_use: dict[int, Site] = {}  # bit -> first compiled region on its path
        #: bits no call used yet that reached the lineage through a getter (``w.T``, ``p.grad``:
        #: no use of the parameter itself): the first call to use what it returned uses them
        self.pending: dict[int, None] = {}
        #: bits a compiled region used (``region``): they have no first use of their own
        self.in_region: set[int] = set()
        #: the module calls running (innermost last): the frame of torch's call of each (where
        #: its hooks and its forward are called from; None: not one), and the user's line of
        #: that call (``_UNSET`` until a call inside asks): kept by the owner's module hooks
        self.calls: list[Any] = []
        self.call_lines: list[Any] = []
        self.paused = False  # an optimizer step runs: calls go through unrecorded
        self.failure: str | None = None
        #: the calls that made autograd nodes (``node_record`` finds a node's)
        self.records = CallRecords()
        #: the owner's stack of the modules running (innermost last), read in place of
        #: ``module_now()`` where given: what it holds (a module's id) is named by
        #: ``path_of`` when a finding needs it
        self.modules: list[Any] | None = None
        self.path_of: Callable[[Any], str | None] = _as_path
        dynamo.eager_only(_DoctorMode.__torch_function__)

    def close(self) -> None:
        """The block ended, its findings made: drop the tables only the forward reads (the
        lineage, host values, call records). The mode and its owner hold each other, so
        they would go only with a full collection of the program's heap, tens of thousands
        of objects promoted into it at each block of a large model; dropped here they go
        now, by their counts."""
        self.lineage = {}
        self.refs = {}
        self.host = {}
        self.records = CallRecords()
        # the owner's callbacks: no cycle is left between the two
        self.on_backward, self.on_error, self.module_now = _run, None, _no_module
        self.path_of = _as_path

    # ---------------------------------------------------------------- lineage
    def tag(self, t: torch.Tensor) -> tuple[int, int, int]:
        """``(dep, live, cuts)`` of a tensor (a watched parameter: its own bit)."""
        bit = self.bits.get(id(t))
        if bit is not None:
            mask = 1 << bit
            return mask, (mask if t.requires_grad else 0), 0
        found = self.lineage.get(id(t))
        if found is None or self.refs[id(t)]() is not t:
            return 0, 0, 0
        return found

    def set_tag(self, t: torch.Tensor, tag: tuple[int, int, int]) -> None:
        key = id(t)
        ref = self.refs.get(key)
        if ref is None or ref() is not t:
            self.refs[key] = weakref.ref(t)
            if len(self.refs) > self.sweep_at:
                self._sweep()
        self.lineage[key] = tag

    def _sweep(self) -> None:
        """Drop the lineage of tensors that died (the dictionary stays within twice the
        number of live tensors, at a cost per entry spread over the entries added)."""
        refs, lineage = self.refs, self.lineage
        for key in [k for k, ref in refs.items() if ref() is None]:
            del refs[key]
            lineage.pop(key, None)
        self.sweep_at = max(_SWEEP_AT, 2 * len(refs))

    def use_site(self, bit: int) -> Site | None:
        """Where parameter ``bit`` was first used (None: never)."""
        found = self.first_use.get(bit)
        if found is None:
            return None
        op, line, module = found
        return Site("op", op, line, self.path_of(module))

    def _host_in(self, args: Any, kwargs: Any) -> tuple[int, int]:
        dep = cuts = 0
        for value in (*args, *(kwargs.values() if kwargs else ())):
            if isinstance(value, _HOST_TYPES) or type(value).__module__ == "numpy":
                hit = self.host.get(id(value))
                if hit is not None and hit[0] is value:
                    dep |= hit[1]
                    cuts |= hit[2]
        return dep, cuts

    # ---------------------------------------------------------------- the user's line
    def enter_call(self, frame: Any) -> None:
        """A module call starts; ``frame``: torch's frame that calls its hooks and its forward
        (None when there is none to stop at)."""
        self.calls.append(frame)
        self.call_lines.append(_UNSET)

    def exit_call(self) -> None:
        if self.calls:
            self.calls.pop()
            self.call_lines.pop()

    def line_of(self, frame: Any) -> str | None:
        """``user_line(frame)``, the same line, found faster: the walk out through torch's
        frames stops at the frame of the innermost module call, whose line (the user's line
        above that frame, which cannot change while the module runs) is found once per module
        call, by the same walk from there."""
        calls, lines = self.calls, self.call_lines
        level = len(calls) - 1
        waiting: list[int] = []  # module calls whose line is the one this walk finds
        internal = INTERNAL_FILES  # ``torch_internal``'s answers, read without a call each
        while True:
            stop: Any = calls[level] if level >= 0 else None
            while frame is not None and frame is not stop:
                code = frame.f_code
                hit = internal.get(code.co_filename)
                if hit is None:
                    hit = torch_internal(code.co_filename)
                if not (hit or code in PASS_THROUGH):
                    break
                frame = frame.f_back
            if frame is not None and frame is stop:
                line = lines[level]
                if line is _UNSET:
                    waiting.append(level)
                    frame = frame.f_back
                    level -= 1
                    continue
            elif frame is None or frame.f_code.co_filename.startswith(OWN_DIR):
                line = None
            else:
                line = _text(frame)
            break
        for at in waiting:
            lines[at] = line
        return line

    # ---------------------------------------------------------------- the mode
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if kwargs is None:
            kwargs = {}
        if self.paused or self.failure is not None or compiling():
            return func(*args, **kwargs)
        try:
            kind = _KINDS.get(func)
        except TypeError:  # an unhashable callable: named each time
            kind = None
        if kind is None:
            kind = _kind_of(func)
        name, raw, flag = kind
        if flag == _IS_BACKWARD:
            return self.on_backward(func, args, kwargs)
        try:
            if kwargs:
                ins = _tensors(args, kwargs)
            else:  # ``_tensors``, inline for the common case
                ins = []
                for value in args:
                    if isinstance(value, torch.Tensor):
                        ins.append(value)
                    elif isinstance(value, (list, tuple)):
                        ins.extend(v for v in value if isinstance(v, torch.Tensor))
            if flag == _GETTER:  # ``.shape``, ``.T``, ``.grad``: writes nothing
                versions = None
            else:
                try:
                    versions = list(map(_version_of, ins))
                except (AttributeError, RuntimeError):  # an inference tensor's: one by one
                    versions = torchcompat.tensor_versions(ins)
        except Exception as exc:  # a tensor the doctor cannot read: never the user's problem
            self._give_up(name, exc)
            return func(*args, **kwargs)
        grad_on = _grad_on()
        # the sequence numbers the call's nodes take: from the counter before it to after it
        first = _next_seq() if grad_on else 0
        try:
            out = func(*args, **kwargs)
        except RuntimeError as exc:
            raised = self.on_error(exc, name, args, sys._getframe(1)) if self.on_error else None
            if raised is not None:
                raise raised from exc
            raise
        end = _next_seq() - _PROBED if grad_on else 0
        try:
            self._record(raw, name, flag, args, kwargs, ins, versions, grad_on, out,
                         sys._getframe(1), first, end)
        except Exception as exc:
            self._give_up(name, exc)
        return out

    def _give_up(self, name: str, exc: Exception) -> None:
        """Stop recording (the step goes on unwatched), and say why in ``failure``."""
        self.failure = (f"the doctor stopped watching at {name}: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}")

    def _at(self, caller: Any) -> _At:
        """The user's line and the module of the call made from ``caller`` (its path, or
        what ``path_of`` names: ``modules``)."""
        modules = self.modules
        if modules is None:
            return self.line_of(caller), self.module_now()
        return self.line_of(caller), (modules[-1] if modules else None)

    def _op_site(self, name: str, at: _At) -> Site:
        """The ``op`` site of call ``name`` at ``at`` (``_at``), its module named."""
        return Site("op", name, at[0], self.path_of(at[1]))

    def _record(self, raw: str | None, name: str, flag: int, args: Any, kwargs: Any,
                ins: list[torch.Tensor], versions: list[int | None] | None, grad_on: bool,
                out: Any, caller: Any, first: int, end: int) -> None:
        """What one call did (see the module docstring): its inputs' lineage, in-place
        writes, the record of the nodes it made (numbers ``[first, end)``), its outputs'
        lineage and the cuts it made. The common case (no cut, no write, no first use) is
        a few dictionary reads per tensor; the rest is in helpers."""
        self.index += 1
        at: _At | None = None  # (line, module), once, when needed

        # inside a custom Function's forward (its ops run with grad off): no cut, the
        # gradient goes on through the Function's own backward (its .apply line, if so)
        inside = None if grad_on else self._custom_node(caller)
        bits = self.bits
        lineage, refs = self.lineage, self.refs
        first_use = self.first_use
        fresh: list[int] | None = None  # watched parameters no call used before
        dep = live = cuts = 0
        for t in ins:
            key = id(t)
            bit = bits.get(key)
            if bit is not None:  # a watched parameter: its own bit
                mask = 1 << bit
                dep |= mask
                if t.requires_grad:
                    live |= mask
                elif bit not in self.frozen_use:
                    if at is None:
                        at = self._at(caller)
                    self.frozen_use[bit] = self._op_site(name, at)
                if bit not in first_use:
                    if fresh is None:
                        fresh = [bit]
                    else:
                        fresh.append(bit)
                continue
            found = lineage.get(key)
            if found is None or refs[key]() is not t:
                continue
            d, lv, c = found
            if lv and inside is None and not t.requires_grad:
                at, lv, c = self._unseen_cut(t, found, name, caller, at)
            dep |= d
            live |= lv
            cuts |= c
        if self.host:
            hd, hc = self._host_in(args, kwargs)
            dep |= hd
            cuts |= hc
        # .shape, .requires_grad...: no use of the tensor
        getter = flag == _GETTER
        if fresh is not None or self.pending:
            if self.pending or getter or self.in_region:
                at = self._first_use(fresh, dep, getter, name, caller, at)
            else:  # ``_first_use``'s common case, inline: parameters used as arguments
                if at is None:
                    at = self._at(caller)
                used = (name, *at)
                for bit in fresh:  # type: ignore[union-attr]
                    first_use.setdefault(bit, used)
        outs = [out] if isinstance(out, torch.Tensor) else _outputs(out)
        if ins and versions is not None:
            try:
                afters = list(map(_version_of, ins))
            except (AttributeError, RuntimeError):
                afters = torchcompat.tensor_versions(ins)
            if afters != versions:
                for t, before, after in zip(ins, versions, afters):
                    if after is not None and after != before:
                        if at is None:
                            at = self._at(caller)
                        self._wrote(t, after, self._op_site(name, at))
        if end != first:  # it made autograd nodes: one record of their numbers
            if at is None:
                at = self._at(caller)
            records = self.records
            if len(records.starts) >= records.limit:
                self._trim()
            key2 = (name, at[0], at[1], _HAS_HOOKS and _saved_hooks_top() is None)
            site = records.site_at.get(key2)
            if site is None:
                site = records.site(key2)
            records.starts.append(first)
            records.info.extend((end, self.index, site, self.iteration))
        if not dep or (getter and not outs):  # a flag read carries no lineage (True is one)
            return
        if inside is not None:
            for t in outs:
                self.set_tag(t, (dep, live, cuts))
                self.custom_made[t] = inside
            return
        some_grad = no_grad = False
        for t in outs:
            if t.requires_grad:
                some_grad = True
            else:
                no_grad = True
        if no_grad or not some_grad:
            self._cuts(raw, name, grad_on, out, outs, dep, live, cuts, some_grad, no_grad,
                       caller, at)
            return
        tag = (dep, live, cuts)
        sweep = False
        for t in outs:  # ``set_tag``, here for the common case: outputs that carry the gradient
            key = id(t)
            ref = refs.get(key)
            if ref is None or ref() is not t:
                refs[key] = weakref.ref(t)
                sweep = True
            lineage[key] = tag
        if sweep and len(refs) > self.sweep_at:
            self._sweep()

    def _cuts(self, raw: str | None, name: str, grad_on: bool, out: Any,
              outs: list[torch.Tensor], dep: int, live: int, cuts: int, some_grad: bool,
              no_grad: bool, caller: Any, at: _At | None) -> None:
        """The outputs' lineage where some of them (or the Python value returned) carry no
        gradient: a cut event where a live parameter's path ends here."""
        live_out = live if some_grad else 0
        lost = 0 if some_grad else live  # live & ~live_out
        if lost and (outs or isinstance(out, _HOST_TYPES) or type(out).__module__ == "numpy"):
            why = _CUT_OPS.get(raw or "", None)
            if not grad_on:
                why = "inference_mode" if torch.is_inference_mode_enabled() else "no_grad"
            elif why is None:
                why = "integer" if any(not (t.is_floating_point() or t.is_complex())
                                       for t in outs) or not outs else "nondiff"
            if at is None:
                at = self._at(caller)
            cuts |= 1 << self._event(lost, why, name, self._op_site(name, at))
        part = 0  # outputs without a gradient beside ones with it: max(dim)'s indices
        if live_out and no_grad:
            ints = any(not (t.is_floating_point() or t.is_complex())
                       for t in outs if not t.requires_grad)
            if at is None:
                at = self._at(caller)
            part = 1 << self._event(live_out, "indices" if ints else "nondiff_output", name,
                                    self._op_site(name, at))
        tag = (dep, live_out, cuts)
        for t in outs:
            self.set_tag(t, tag if t.requires_grad else (dep, 0, cuts | part))
        if not outs and out is not None:
            if len(self.host) >= _HOST_KEPT:
                del self.host[next(iter(self.host))]
            self.host[id(out)] = (out, dep, cuts)

    def _unseen_cut(self, t: torch.Tensor, found: tuple[int, int, int], name: str,
                    caller: Any, at: _At | None
                    ) -> tuple[Any, int, int]:
        """An input live by its lineage, yet without a gradient: a cut no call showed (a
        custom Function's output it marked non-differentiable), found at its first use.
        Returns ``(at, live, cuts)`` of the input from now on."""
        d, lv, c = found
        made = self.custom_made.get(t)
        unseen = "marked_nondiff" if made is not None else "nondiff"
        if made is None and at is None:
            at = self._at(caller)
        c |= 1 << self._event(lv, unseen, made.op if made else name,
                              made if made else self._op_site(name, at))  # type: ignore[arg-type]
        self.set_tag(t, (d, 0, c))
        return at, 0, c

    def _first_use(self, fresh: list[int] | None, dep: int, getter: bool, name: str,
                   caller: Any, at: _At | None
                   ) -> _At | None:
        """Where each parameter was first used: the first call other than a getter whose
        lineage has its bit. A bit enters the lineage as the parameter itself is an argument
        (``fresh``: those no call used before), so only those, and the ones a getter passed
        on (``pending``), are looked for: never the whole of ``dep``, whose bits are those of
        every parameter upstream (a 4,000-layer chain's last layers: 8,000 bits)."""
        pending, in_region = self.pending, self.in_region
        if getter:  # no use: what it returns carries them on
            for bit in fresh or ():
                if bit not in in_region:
                    pending[bit] = None
            return at
        new = [bit for bit in fresh or () if bit not in in_region]
        if pending:
            new.extend(bit for bit in list(pending) if dep >> bit & 1)
        if not new:
            return at
        if at is None:
            at = self._at(caller)
        site = (name, *at)
        for bit in new:
            self.first_use.setdefault(bit, site)
            pending.pop(bit, None)
        return at

    def _event(self, lost: int, why: str, name: str, at: Site) -> int:
        """The index of the cut event at this site: a call repeated at the same line (every
        step's ``p.grad`` reads, a loop) is one event, the first, so that events and the
        ``cuts`` bitsets stay as large as the program's distinct cut sites over a long run."""
        site = Site("cut", name, at.line, at.module)
        key = (lost, why, site)
        found = self.event_at.get(key)
        if found is None:
            found = self.event_at[key] = len(self.events)
            self.events.append(CutEvent(self.index, lost, why, site))
        return found

    def region(self, args: Any, output: Any, own: int, at: Site) -> None:
        """A ``torch.compile``d module ran with the mode off (called at ``at``): its outputs
        depend on its inputs and on its own parameters (bits ``own``), as one call; what
        happens inside is not seen (a parameter cut there is only known to be in the region)."""
        paused, self.paused = self.paused, True  # its own reads (requires_grad) are not calls
        try:
            self._region(args, output, own, at)
        finally:
            self.paused = paused

    def _region(self, args: Any, output: Any, own: int, at: Site) -> None:
        dep = own
        live = 0
        cuts = 0
        for t in _tensors(args, {}):
            d, lv, c = self.tag(t)
            dep |= d
            live |= lv
            cuts |= c
        live |= mask_of(self.bits[id(p)] for p in self.param_list(own) if p.requires_grad)
        for bit in _bits(live):  # its own parameters and those whose path goes through it
            self.compiled_use.setdefault(bit, at)
        for t in _outputs(output):
            self.set_tag(t, (dep, live if t.requires_grad else 0, cuts))
        for bit in _bits(dep):  # used there: no first use of their own from now on
            if bit not in self.first_use:
                self.in_region.add(bit)
                self.pending.pop(bit, None)

    def param_list(self, mask: int) -> list[torch.Tensor]:
        return [self.params[b] for b in _bits(mask) if b < len(self.params)]

    def _wrote(self, t: torch.Tensor, version: int, at: Site) -> None:
        try:
            key = torchcompat.storage_key(t)
        except (RuntimeError, NotImplementedError, TypeError):
            return
        log = self.writes.get(key)
        if log is None:
            if len(self.writes) >= _STORAGES_KEPT:
                for old in list(self.writes)[:_STORAGES_KEPT // 2]:
                    del self.writes[old]
            log = self.writes[key] = []
        log.append(Write(version, self.index, Site("modified", at.op, at.line, at.module),
                         tuple(t.shape)))
        del log[:-_WRITES_KEPT]

    def _custom_node(self, caller: Any) -> Site | None:
        """Inside a custom Function's forward (its ops run with grad disabled): stamp its node
        with the ``.apply`` call's line, before a later op would take it for its own, and
        return that site (None outside one). What it saves is read back at explain time
        (``save_for_backward`` may come later)."""
        found = custom_apply(caller)
        if found is None:
            return None
        ctx, apply_frame = found
        meta = torchcompat.node_metadata(ctx)
        if meta is None:
            return None
        record = meta.get(DOCTOR_KEY)
        if record is None:
            name = f"{type(ctx).__name__.removesuffix('Backward')}.apply"
            line = user_line(apply_frame) if apply_frame is not None else None
            module = self.module_now()
            meta[DOCTOR_KEY] = _stamp(self.iteration, self.index, False, name, line, module)
            return Site("made", name, line, module)
        rec = node_record(ctx)
        return rec.site if rec is not None else None

    def _trim(self) -> None:
        """Keep ``records`` bounded (``CallRecords.trim``): the nodes of the tensors alive in
        the lineage table keep their calls' records."""
        alive = []
        for ref in list(self.refs.values()):
            t = ref()
            fn = t.grad_fn if t is not None else None
            if fn is not None:
                alive.append(fn._sequence_nr())
        self.records.trim(self.iteration - 1, alive)

    def node_record(self, fn: Any) -> NodeRecord | None:
        """The ``NodeRecord`` of autograd node ``fn`` (None: not one the doctor saw made): a
        custom Function's node by its stamp (``node_record``), any other by the call record
        its sequence number falls in (``CallRecords``); the tensors it saved read from the
        node now (``saved_of``)."""
        if fn is None:
            return None
        stamped = node_record(fn)
        if stamped is not None:
            return stamped
        try:
            seq = fn._sequence_nr()
        except (AttributeError, RuntimeError):
            return None
        found = self.records.find(seq) if seq != NO_SEQUENCE_NR else None
        if found is None:
            return None
        index, iteration, (op, line, module, readable) = found
        return NodeRecord(iteration, op, Site("made", op, line, self.path_of(module)), index,
                          saved_of(fn) if readable else [])


def _no_module() -> str | None:
    return None


def _as_path(module: Any) -> str | None:
    """``_DoctorMode.path_of`` without an owner: the module is given by its path."""
    return module


def _run(func: Any, args: Any, kwargs: Any) -> Any:
    return func(*args, **kwargs)


#: by callable the mode was given: its op name, ``__name__``, and what it is (``_kind_of``)
_KINDS: dict[Any, tuple[str, str | None, int]] = {}
_PLAIN_OP, _GETTER, _IS_BACKWARD = 0, 1, 2
_KINDS_KEPT = 4096
compiling = dynamo.compiling


def _kind_of(func: Any) -> tuple[str, str | None, int]:
    """``(op name, __name__, kind)`` of a callable the mode was given (kept in ``_KINDS``):
    ``_IS_BACKWARD`` for a backward call, ``_GETTER`` for a property read other than
    ``.data`` (``.shape``, ``.requires_grad``: no use of the tensor), else ``_PLAIN_OP``."""
    raw = getattr(func, "__name__", None)
    name = raw if raw and raw != "__get__" else op_name(func)
    if name == _BACKWARD or func is torch.autograd.grad:
        flag = _IS_BACKWARD
    elif raw == "__get__" and name != "Tensor.data":
        flag = _GETTER
    else:
        flag = _PLAIN_OP
    kind = (name, raw, flag)
    try:
        if len(_KINDS) >= _KINDS_KEPT:
            _KINDS.clear()
        _KINDS[func] = kind
    except TypeError:  # unhashable
        pass
    return kind


def _bits(mask: int) -> list[int]:
    """The set bits, each found in one step (``mask & -mask``: the lowest set bit), so the
    cost is their count, not the position of the highest: the shift-by-one loop made each call
    linear in the number of parameters, and the forward quadratic (9x a plain step at 2,000
    layers)."""
    found = []
    while mask:
        low = mask & -mask
        found.append(low.bit_length() - 1)
        mask ^= low
    return found


def bits_of(mask: int) -> list[int]:
    """The positions of the set bits of ``mask``, lowest first."""
    return _bits(mask)


def mask_of(bits: Iterable[int]) -> int:
    """The int with ``bits`` set, built in one pass: OR-ing ``1 << bit`` in one at a time
    copies the growing int at each, quadratic in the number of parameters."""
    listed = list(bits)
    if not listed:
        return 0
    flags = bytearray((max(listed) >> 3) + 1)
    for bit in listed:
        flags[bit >> 3] |= 1 << (bit & 7)
    return int.from_bytes(flags, "little")


def bit_text(mask: int, size: int) -> str:
    """``mask``'s bits 0 to ``size - 1`` as ``"0"``/``"1"`` characters, bit ``i`` at ``[i]``:
    read in one pass where ``mask >> i & 1`` for each ``i`` shifts the whole int each time."""
    return format(mask, "b")[::-1].ljust(size, "0")
