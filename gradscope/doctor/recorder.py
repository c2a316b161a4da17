"""What the autograd doctor records while the forward runs (``gs.doctor``'s torch function mode).

For every torch call in the block, a ``TorchFunctionMode`` (``_DoctorMode``) keeps:

- **lineage**: three Python ints per tensor, kept in a weak dictionary (an entry dies with its
  tensor): ``dep``, a bitset over the watched parameters the tensor depends on *by value*, through
  any op (``.detach()``, ``.item()``, ``argmax``, integer casts, ops under ``no_grad`` included);
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
  user's line and module, the version it left), through a view too (``y[0].zero_()``).
- **new autograd nodes**: each node the call created is stamped (``node.metadata``) with a
  ``NodeRecord``: the backward count when it was made, the op, the line, the module, and the
  tensors it saved for backward (read from the graph's own ``_saved_*`` attributes, with their
  version counters at save time). The graph's own saved tensors are read, not
  ``saved_tensors_hooks``: with hooks torch no longer checks versions, and the doctor must leave
  torch's error as it is. While the user has saved-tensor hooks of their own (checkpointing,
  offloading), saved tensors are not read (unpacking would run their hooks).

- **forward errors**: an in-place op torch refuses while the forward runs (a leaf, a view of
  one, an output of ``unbind``/``split``, a custom Function's view) goes to ``on_error``, which
  gives the error to raise in its place (torch's, explained).

The user's line is ``stamps.user_frame``'s: the innermost frame outside torch and gradscope.
"""

from __future__ import annotations

import bisect
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from .._torch import dynamo, torchcompat
from .._torch.stamps import NO_SEQUENCE_NR, custom_apply, user_frame
from .findings import Site

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
    """What the doctor knows of one autograd node it saw made."""

    iteration: int
    op: str
    site: Site
    index: int = 0  # the call that made it (``_DoctorMode.index``)
    saved: list[SavedRecord] = field(default_factory=list)


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


def user_line(frame: Any) -> str | None:
    """``file.py:NN`` of the user's line at or above ``frame`` (``stamps.user_frame``: the
    first frame outside torch; None when gradscope itself made the call)."""
    frame = user_frame(frame)
    if frame is None:
        return None
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


def op_name(func: Any) -> str:
    """``sigmoid``, ``Tensor.data`` for the ``.data`` getter, ``__setitem__``..."""
    name = getattr(func, "__name__", None) or str(func)
    if name == "__get__":
        owner = getattr(getattr(func, "__self__", None), "__name__", None)
        return f"Tensor.{owner}" if owner else name
    return name


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter; None for an inference tensor (``inference_mode``), which has
    none."""
    return None if t.is_inference() else torchcompat.tensor_version(t)


def _tensors(args: Any, kwargs: Any) -> list[torch.Tensor]:
    """The tensor arguments of a call (one level into lists and tuples: ``torch.cat``)."""
    found = []
    for value in (*args, *(kwargs.values() if kwargs else ())):
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


_SAVED_NAMES: dict[type, tuple[str, ...]] = {}


def _saved_names(node: Any) -> tuple[str, ...]:
    cls = type(node)
    names = _SAVED_NAMES.get(cls)
    if names is None:
        names = tuple(n for n in dir(cls) if n.startswith("_saved_"))
        _SAVED_NAMES[cls] = names
    return names


def _saved_record(t: torch.Tensor) -> SavedRecord:
    try:
        storage: int | None = torchcompat.storage_key(t)
    except (RuntimeError, NotImplementedError, TypeError):
        storage = None
    fn = t.grad_fn
    return SavedRecord(storage, _version(t), tuple(t.shape),
                       str(t.dtype), type(fn).__name__ if fn is not None else None,
                       t.output_nr if fn is not None else 0)


def saved_of(node: Any) -> list[SavedRecord]:
    """The tensors ``node`` saved for backward, read from the graph itself."""
    found: list[SavedRecord] = []
    values: list[Any] = []
    if torchcompat.is_custom_ctx(node):
        try:
            values.extend(node.saved_tensors)
        except RuntimeError:
            pass
    else:
        for name in _saved_names(node):
            try:
                value = getattr(node, name)
            except RuntimeError:  # released, or not a saved value of this node
                continue
            if isinstance(value, (list, tuple)):
                values.extend(value)
            else:
                values.append(value)
    for value in values:
        if isinstance(value, torch.Tensor) and value.layout == torch.strided:
            found.append(_saved_record(value))
    return found


class _DoctorMode(TorchFunctionMode):
    """The doctor's torch function mode (see the module docstring). ``on_backward`` is the
    owner's: backward calls (``Tensor.backward``, ``torch.autograd.grad``) go to it."""

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
        self.tags: WeakIdKeyDictionary = WeakIdKeyDictionary()  # tensor -> (dep, live, cuts)
        self.host: dict[int, tuple[Any, int, int]] = {}  # id -> (object, dep, cuts)
        self.events: list[CutEvent] = []
        self.event_at: dict[tuple[int, str, Site], int] = {}  # (lost, why, site) -> its index
        self.writes: dict[int, list[Write]] = {}
        self.first_use: dict[int, Site] = {}  # bit -> where the parameter was first used
        self.frozen_use: dict[int, Site] = {}  # bit -> first use while requires_grad=False
        self.compiled_use: dict[int, Site] = {}  # bit -> first compiled region on its path
        self.touched = 0
        self.paused = False  # an optimizer step runs: calls go through unrecorded
        self.failure: str | None = None
        self.last_seq = torchcompat.next_sequence_nr() - 1
        dynamo.eager_only(_DoctorMode.__torch_function__)

    # ---------------------------------------------------------------- lineage
    def tag(self, t: torch.Tensor) -> tuple[int, int, int]:
        """``(dep, live, cuts)`` of a tensor (a watched parameter: its own bit)."""
        bit = self.bits.get(id(t))
        if bit is not None:
            mask = 1 << bit
            return mask, (mask if t.requires_grad else 0), 0
        found = self.tags.get(t)
        return found if found is not None else (0, 0, 0)

    def _host_in(self, args: Any, kwargs: Any) -> tuple[int, int]:
        dep = cuts = 0
        for value in (*args, *(kwargs.values() if kwargs else ())):
            if isinstance(value, _HOST_TYPES) or type(value).__module__ == "numpy":
                hit = self.host.get(id(value))
                if hit is not None and hit[0] is value:
                    dep |= hit[1]
                    cuts |= hit[2]
        return dep, cuts

    # ---------------------------------------------------------------- the mode
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if self.paused or self.failure is not None or dynamo.compiling():
            return func(*args, **kwargs)
        name = op_name(func)
        if name == _BACKWARD or func is torch.autograd.grad:
            return self.on_backward(func, args, kwargs)
        try:
            ins = _tensors(args, kwargs)
            versions = [_version(t) for t in ins]
        except Exception as exc:  # a tensor the doctor cannot read: never the user's problem
            self._give_up(name, exc)
            return func(*args, **kwargs)
        grad_on = torch.is_grad_enabled()
        try:
            out = func(*args, **kwargs)
        except RuntimeError as exc:
            raised = self.on_error(exc, name, args, sys._getframe(1)) if self.on_error else None
            if raised is not None:
                raise raised from exc
            raise
        try:
            self._record(func, name, args, kwargs, ins, versions, grad_on, out,
                         sys._getframe(1))
        except Exception as exc:
            self._give_up(name, exc)
        return out

    def _give_up(self, name: str, exc: Exception) -> None:
        """Stop recording (the step goes on unwatched), and say why in ``failure``."""
        self.failure = (f"the doctor stopped watching at {name}: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}")

    def _record(self, func: Any, name: str, args: Any, kwargs: Any, ins: list[torch.Tensor],
                versions: list[int | None], grad_on: bool, out: Any, caller: Any) -> None:
        self.index += 1
        site: list[Site] = []

        def where() -> Site:  # looked up once per call, only when needed
            if not site:
                site.append(Site("op", name, user_line(caller), self.module_now()))
            return site[0]

        # inside a custom Function's forward (its ops run with grad off): no cut, the
        # gradient goes on through the Function's own backward (its .apply line, if so)
        inside = None if grad_on else self._custom_node(caller)
        dep = live = cuts = 0
        for t in ins:
            d, lv, c = self.tag(t)
            if lv and not t.requires_grad and inside is None and id(t) not in self.bits:
                # live by its lineage, yet without a gradient: a cut no call showed (a custom
                # Function's output it marked non-differentiable), found at its first use
                made = self.custom_made.get(t)
                unseen = "marked_nondiff" if made is not None else "nondiff"
                c |= 1 << self._event(lv, unseen, made.op if made else name,
                                      made if made else where())
                lv = 0
                self.tags[t] = (d, 0, c)
            dep |= d
            live |= lv
            cuts |= c
            if d and not lv and id(t) in self.bits and not t.requires_grad:
                self.frozen_use.setdefault(self.bits[id(t)], where())
        if self.host:
            hd, hc = self._host_in(args, kwargs)
            dep |= hd
            cuts |= hc
        getter = _is_getter(func, name)  # .shape, .requires_grad...: no use of the tensor
        if dep & ~self.touched and not getter:
            for bit in _bits(dep & ~self.touched):
                self.first_use[bit] = where()
            self.touched |= dep
        outs = _outputs(out)
        written = []
        for t, before in zip(ins, versions):
            after = _version(t)
            if after is not None and after != before:
                self._wrote(t, after, where())
                written.append(t)
        made = outs + written if written else outs  # ``y[:, 0] = 0`` returns None: y's node
        if grad_on and made:
            self._new_nodes(made, name, where)
        if not dep or (getter and not outs):  # a flag read carries no lineage (True is one)
            return
        if inside is not None:
            for t in outs:
                self.tags[t] = (dep, live, cuts)
                self.custom_made[t] = inside
            return
        live_out = live if any(t.requires_grad for t in outs) else 0
        lost = live & ~live_out
        if lost and (outs or isinstance(out, _HOST_TYPES) or type(out).__module__ == "numpy"):
            why = _CUT_OPS.get(getattr(func, "__name__", ""), None)
            if not grad_on:
                why = "inference_mode" if torch.is_inference_mode_enabled() else "no_grad"
            elif why is None:
                why = "integer" if any(not (t.is_floating_point() or t.is_complex())
                                       for t in outs) or not outs else "nondiff"
            cuts |= 1 << self._event(lost, why, name, where())
        part = 0  # outputs without a gradient beside ones with it: max(dim)'s indices
        if live_out and any(not t.requires_grad for t in outs):
            ints = any(not (t.is_floating_point() or t.is_complex())
                       for t in outs if not t.requires_grad)
            part = 1 << self._event(live_out, "indices" if ints else "nondiff_output", name,
                                    where())
        for t in outs:
            self.tags[t] = ((dep, live_out, cuts) if t.requires_grad
                            else (dep, 0, cuts | part))
        if not outs and out is not None:
            if len(self.host) >= _HOST_KEPT:
                del self.host[next(iter(self.host))]
            self.host[id(out)] = (out, dep, cuts)

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
        live |= sum(1 << self.bits[id(p)] for p in self.param_list(own) if p.requires_grad)
        for bit in _bits(live):  # its own parameters and those whose path goes through it
            self.compiled_use.setdefault(bit, at)
        for t in _outputs(output):
            self.tags[t] = (dep, live if t.requires_grad else 0, cuts)
        self.touched |= dep

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
            record = meta[DOCTOR_KEY] = NodeRecord(
                self.iteration, name, Site("made", name, line, self.module_now()), self.index)
        return record.site

    def _new_nodes(self, outs: list[torch.Tensor], name: str, where: Callable[[], Site]) -> None:
        """Stamp the nodes this call made with a ``NodeRecord`` (saved tensors included)."""
        floor = self.last_seq
        stack: list[Any] = [t.grad_fn for t in outs if t.grad_fn is not None]
        if not stack:
            return
        read_saved = torchcompat.HAS_SAVED_HOOKS and torchcompat.top_saved_hooks() is None
        seen: set[int] = set()
        while stack:
            fn = stack.pop()
            if fn is None:
                continue
            seq = fn._sequence_nr()
            if seq <= floor or seq == NO_SEQUENCE_NR or id(fn) in seen:
                continue
            seen.add(id(fn))
            meta = torchcompat.node_metadata(fn)
            if meta is None or DOCTOR_KEY in meta:
                continue
            at = where()
            record = NodeRecord(self.iteration, name, Site("made", name, at.line, at.module),
                                self.index)
            if read_saved:
                record.saved = saved_of(fn)
            meta[DOCTOR_KEY] = record
            self.last_seq = max(self.last_seq, seq)
            stack.extend(nxt for nxt, _ in fn.next_functions)


def _is_getter(func: Any, name: str) -> bool:
    """A tensor attribute read other than ``.data`` (``.shape``, ``.requires_grad``, ``.grad``):
    reading a parameter's attributes is not using it in the forward."""
    return getattr(func, "__name__", None) == "__get__" and name != "Tensor.data"


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
