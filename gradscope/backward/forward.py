"""``record_forward()``: where each autograd node was created (file, line, code).

While the forward runs, a ``TorchFunctionMode`` stamps each new autograd node's ``metadata``
with the user's file and line, so the first non-finite gradient can name the line of the
model's code, at a fraction of the cost of ``torch.autograd.detect_anomaly``, which formats a
full Python stack for every node and checks every gradient for NaN with a host sync.

Under ``torch.compile`` the mode must not change what Dynamo compiles: a torch function mode
is part of Dynamo's guards, so while a ``torch.compile(module)`` wrapper runs the mode is taken
off the stack (global module hooks, ``dynamo.ModuleHooks``) and the compiled region's node is
stamped with the line that called the module; the ops inside get their lines from the
compiled graph's own ``stack_trace``. Traced anyway (a compiled function, ``module.compile()``),
``__torch_function__`` only calls through.
"""

from __future__ import annotations

import functools
import itertools
import linecache
import os
import sys
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .._torch import dynamo, torchcompat
from .._torch.handles import HookHandle
from .._torch.stamps import (
    CREATED_KEY,
    FORWARD_NONFINITE_KEY,
    MODULE_KEY,
    NO_SEQUENCE_NR,
    custom_apply,
    outside_gradscope,
    user_frame,
)
from ..graph import compiled
from ..graph.tensor_facts import checkable, holds_data
from .records import ForwardNonFinite


# ---------------------------------------------------------------------------- reading
def created_at(fn: Any) -> str | None:
    """``file:line: code`` recorded by ``record_forward`` for ``fn``, or None."""
    loc = fn.metadata.get(CREATED_KEY)
    if loc is None:
        return None
    return _location_text(*loc)


@functools.lru_cache(maxsize=4096)
def _location_text(filename: str, lineno: int) -> str:
    code = linecache.getline(filename, lineno).strip()
    return f"{_short_path(filename)}:{lineno}: {code}"


@functools.lru_cache(maxsize=4096)
def location_text(filename: str, lineno: int, code: str | None = None) -> str:
    """``file:line: code`` as ``record_forward`` writes it; ``code`` defaults to the line's
    text (a compiled graph's ``stack_trace`` carries its own)."""
    if code is None:
        return _location_text(filename, lineno)
    return f"{_short_path(filename)}:{lineno}: {code}"


def _short_path(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        return filename
    return filename if rel.startswith("..") else rel


_UNSET = object()
compiling = dynamo.compiling


_wrapped = torchcompat.is_functorch_wrapped

#: Ops whose output is uninitialised memory, about to be written: never a finding themselves.
_UNINITIALISED = frozenset(
    {"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided"}
)


#: Where FSDP's own code lies: the calls it makes work on its communication buffers
#: (``all_gather_copy_in``'s output, uninitialised until a collective fills it on another
#: thread, and views of it), not on the model's values, which reach the model as the gathered
#: parameters and are checked where an op reads them.
_FSDP_DIR = os.path.join(os.path.dirname(torch.__file__), "distributed", "fsdp", "")


#: In-place ops that overwrite every element of the tensor they are called on without reading
#: it, and the ``nn.init`` functions built on them (a parameter made by ``torch.empty`` is
#: filled by one; some reach the mode themselves, the tensor given as ``tensor=``): that
#: tensor's old values are nobody's finding, only what the op writes (checked as its output).
_OVERWRITING = frozenset(
    {"normal_", "uniform_", "fill_", "zero_", "random_", "bernoulli_", "exponential_",
     "geometric_", "cauchy_", "log_normal_", "copy_",
     "constant_", "ones_", "zeros_", "eye_", "dirac_", "trunc_normal_", "orthogonal_",
     "sparse_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_"}
)

#: Tensor properties that compute a tensor from the one they are read on (``x.T``); reading
#: any other (``x.shape``, ``x.dtype``, ``x.data``) computes nothing from its values.
_COMPUTING_PROPERTIES = frozenset({"T", "mT", "H", "mH", "real", "imag"})


#: Calls that make a tensor from another's shape, dtype and device alone, never its values
#: (``nn.init.orthogonal_`` and ``trunc_normal_`` call them on the tensor they fill).
_SHAPE_ONLY = frozenset(
    {"new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "new_tensor",
     "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
     "randint_like"}
)


def _computing_op(func: Any, out: Any) -> str | None:
    """The name of ``func`` when the call computed a tensor from its arguments' values, else
    None: a property getter other than ``x.T`` and friends (``__get__`` of ``shape``), a call
    that returned no tensor (``size``, ``dim``, ``__len__``, ``is_floating_point``), or one
    that read only a shape (``x.new_zeros(3)``, ``torch.ones_like(x)``)."""
    name = getattr(func, "__name__", str(func))
    if name in _SHAPE_ONLY:
        return None
    if name in ("__get__", "__set__", "__delete__"):
        prop = getattr(getattr(func, "__self__", None), "__name__", None)
        return prop if name == "__get__" and prop in _COMPUTING_PROPERTIES else None
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return name if any(isinstance(t, torch.Tensor) for t in outs) else None


def _overwritten(t: torch.Tensor, op: str, args: Any, kwargs: Any) -> bool:
    """Whether the call ``op`` wrote over all of ``t`` without reading it: ``t`` is the
    tensor an overwriting in-place op was called on, or the ``out=`` of a call."""
    kwargs = kwargs or {}
    if op in _OVERWRITING and (args[0] if args else kwargs.get("tensor", kwargs.get("self"))) is t:
        return True
    out = kwargs.get("out")
    return out is t or (isinstance(out, (tuple, list)) and any(o is t for o in out))


def _whole_view(out: Any, t: torch.Tensor) -> bool:
    """Whether ``out`` is a view of all of ``t`` (``t.view_as(q)``, ``t.reshape(-1)``)."""
    if not isinstance(out, torch.Tensor) or out is t or not out._is_view():
        return False
    base = t._base if t._is_view() and t._base is not None else t
    return out._base is base and out.numel() == t.numel() == base.numel()


def _grad_fn(t: torch.Tensor) -> Any:
    """``t.grad_fn``, or None where torch refuses to say (a view made under ``no_grad`` whose
    base was then changed in place: reading its ``grad_fn`` raises, and what a recorder reads
    must never raise in the user's code)."""
    try:
        return t.grad_fn
    except RuntimeError:
        return None


def _in_fsdp(frame: Any) -> bool:
    """Whether a call comes from FSDP's own code (its caller or, through torch's op and
    autograd helpers, one of the next few frames up): its communication buffers."""
    for _ in range(4):
        if frame is None:
            return False
        if frame.f_code.co_filename.startswith(_FSDP_DIR):
            return True
        frame = frame.f_back
    return False


def _checkable(t: Any) -> torch.Tensor | None:
    """A floating, dense tensor whose values can be tested for NaN/Inf here (float8 widened),
    detached; None for anything else."""
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
        return None
    if not (t.is_floating_point() or t.is_complex()) or t.device.type == "meta":
        return None
    if _wrapped(t):  # a torch.func transform's tensor (vmap, grad): not checkable here
        return None
    # a DTensor: this rank's shard (its global values would be a collective per call)
    d = torchcompat.local_tensor(t.detach())
    if d.device.type == "meta" or not holds_data(d):  # FSDP2's freed gathered parameter
        return None
    return checkable(d)


def _arguments(args: Any, kwargs: Any) -> Iterator[torch.Tensor]:
    """The tensors a call was given: its arguments and keyword values, and one level into
    lists and tuples (``torch.cat([a, b])``)."""
    for a in itertools.chain(args, kwargs.values() if kwargs else ()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    yield b


def _flags(d: torch.Tensor) -> torch.Tensor:
    """``[has NaN, has Inf]`` of ``d``, left on its device (no host sync)."""
    with torch.no_grad():
        return torch.stack([d.isnan().any(), d.isinf().any()])


class _ForwardMode(TorchFunctionMode):
    """Stamps each autograd node created by a torch call with the user's file and line.

    Nodes are numbered (``_sequence_nr``) in creation order per thread: a call whose output node
    is numbered right after the last one stamped created just that node, so only calls that
    skipped numbers (composite ops, custom Functions) need a look at the nodes below.
    """

    def __init__(self, check_finite: bool = False) -> None:
        super().__init__()
        self.start = torchcompat.next_sequence_nr()
        self.last = self.start - 1
        self.check_finite = check_finite
        # with check_finite: per floating value checked, its [has NaN, has Inf] flags (left on
        # the device), and what made it: [op name, grad_fn or None, (file, line) or None,
        # None, or for a tensor the forward was given (no op of the block made it) its
        # label and the index of its flags]; an input's op, grad_fn and line are those of the
        # first call that computed from it ("", None, None while none has: reading x.shape
        # computes nothing), its flags set when its values held NaN/Inf both when it was
        # first touched and just before that call
        self.flags: list[torch.Tensor] = []
        self.made_by: list[list[Any]] = []
        # tensors the block has seen (made by a call, or checked as an input), by id: a
        # tensor given to a call and not seen before came from outside the forward
        self.seen: dict[int, weakref.ref[torch.Tensor]] = {}
        self.names: dict[int, tuple[weakref.ref[torch.Tensor], str]] = {}
        # tensors the forward was given that no call has computed from yet (only their shape
        # or size was read): their entry of made_by, named by the first call that does
        self.unread: dict[int, tuple[weakref.ref[torch.Tensor], list[Any]]] = {}
        # whole views of those inputs (``p.view_as(q)``, as ``nn.init.orthogonal_`` makes to
        # fill ``p``): the index of the view's own flags, cleared if it is written over unread
        self.views: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}
        self.paused: list[Any] = []  # torch.compile wrappers running with the mode off
        dynamo.eager_only(_ForwardMode.__torch_function__)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if compiling():  # Dynamo traces this: call through, stamp nothing
            return func(*args, **(kwargs or {}))
        check = self.check_finite and not _in_fsdp(sys._getframe(1))
        read = self._flag_inputs(func, args, kwargs) if check else None
        out = func(*args, **(kwargs or {}))
        if torch.is_grad_enabled():
            self._stamp_outputs(out)
        else:
            self._stamp_custom()  # custom Function forwards run with grad disabled
        if check:
            before = len(self.made_by)
            self._flag(func, out)
            if read:  # the index of the flags of the call's one checked output, if one
                made = before if len(self.made_by) == before + 1 else None
                self._attribute(func, out, read, args, kwargs, made)
        return out

    def name(self, named: Iterator[tuple[str, torch.Tensor]]) -> None:
        """Labels for tensors the forward may be given (``the input example_input``,
        ``the parameter fc.weight``): a NaN already in one of them is said with its name."""
        for label, t in named:
            self.names.setdefault(id(t), (weakref.ref(t), label))

    def _seen(self, t: torch.Tensor) -> bool:
        ref = self.seen.get(id(t))
        return ref is not None and ref() is t

    def _see(self, t: torch.Tensor) -> None:
        try:
            self.seen[id(t)] = weakref.ref(t)
        except TypeError:  # a tensor type that takes no weak reference: left unseen
            pass

    def _label(self, t: torch.Tensor) -> str:
        found = self.names.get(id(t))
        if found is not None and found[0]() is t:
            return found[1]
        if isinstance(t, torch.nn.Parameter):
            return "a parameter"
        return "a tensor given to the forward"

    def _flag_inputs(
        self, func: Any, args: Any, kwargs: Any
    ) -> list[tuple[list[Any], Any, torch.Tensor]] | None:
        """Before the call: queue flags of the floating tensors it reads that no call of the
        block made (the batch, parameters, buffers), each once, so that a NaN that came in
        with them is said as such, not blamed on the first op that read it. Returns each such
        tensor's entry of ``made_by`` still to be named (``_attribute``), with this call's
        line: new ones, and earlier ones no call has computed from yet."""
        read: list[tuple[list[Any], Any, torch.Tensor]] | None = None
        loc: Any = _UNSET
        if self.views:
            self._drop_written_views(func, args, kwargs)
        for t in _arguments(args, kwargs):
            if self._seen(t):
                entry = self._unread_entry(t) if self.unread else None
                if entry is None:
                    continue  # made in the block, or an input already named
                d = _checkable(t)
                if d is not None:  # held NaN/Inf when first touched and still now: what an
                    # alias (``p.data.normal_()``) wrote over since is no finding, and what
                    # one wrote in is the writer's
                    self.flags[entry[4]] = self.flags[entry[4]] & _flags(d)
            elif _grad_fn(t) is not None:
                continue  # made by an earlier forward: its op is known
            else:
                self._see(t)
                d = _checkable(t)
                if d is None:
                    continue
                entry = ["", None, None, self._label(t), len(self.flags)]
                self.made_by.append(entry)
                self.flags.append(_flags(d))
            if loc is _UNSET:
                user = user_frame(sys._getframe(2))  # 2: the caller of __torch_function__
                loc = None if user is None else (user.f_code.co_filename, user.f_lineno)
            if read is None:
                read = []
            read.append((entry, loc, t))
        return read

    def _drop_written_views(self, func: Any, args: Any, kwargs: Any) -> None:
        """A whole view of an unread input, written over by this call before anything read
        it: what its maker saw there (uninitialised memory) is no finding."""
        op = getattr(func, "__name__", "")
        for t in list(_arguments(args, kwargs)):
            found = self.views.get(id(t))
            if found is not None and found[0]() is t:
                if _overwritten(t, op, args, kwargs):
                    self._clear(found[1])
                del self.views[id(t)]  # read or written: settled either way

    def _clear(self, index: int) -> None:
        """No finding from the values flagged at ``index`` (written over before any read)."""
        self.flags[index] = torch.zeros_like(self.flags[index])

    def _leave_unread(self, read: list[tuple[list[Any], Any, torch.Tensor]]) -> None:
        """Inputs the call did not compute from: the next call that does names them."""
        for entry, _, t in read:
            if id(t) not in self.unread:
                try:
                    self.unread[id(t)] = (weakref.ref(t), entry)
                except TypeError:  # no weak reference: stays unnamed
                    pass

    def _unread_entry(self, t: torch.Tensor) -> list[Any] | None:
        found = self.unread.get(id(t))
        return found[1] if found is not None and found[0]() is t else None

    def _attribute(
        self,
        func: Any,
        out: Any,
        read: list[tuple[list[Any], Any, torch.Tensor]],
        args: Any,
        kwargs: Any,
        made: int | None = None,
    ) -> None:
        """After the call: name the inputs it read by it (op, grad_fn: the module, line) when
        it computed from them; a call that only read their metadata (``x.shape``,
        ``x.size(0)``, ``x.dim()``) leaves them to the next call that reads them. An input
        the call only wrote over (``p.uniform_()`` on a ``torch.empty`` parameter, the
        ``out=`` of a call) was never read: its old values are dropped from the findings."""
        op = _computing_op(func, out)
        if op is None and args and getattr(func, "__name__", None) == "__setitem__":
            # ``y[i] = x`` computes y's new values from x: x is read, y only written in part
            self._leave_unread([r for r in read if r[2] is args[0]])
            read = [r for r in read if r[2] is not args[0]]
            op = "__setitem__"
        if op is None:
            self._leave_unread(read)
            return
        fn = self._first_grad_fn(out)  # the module of the reader: its output's node knows it
        for entry, loc, t in read:
            if not entry[0]:
                entry[0], entry[1], entry[2] = op, fn, loc
            if made is not None and _whole_view(out, t):
                # a view reads no value: t stays unread (its flags follow its values), and the
                # view, written over next, is no finding
                try:
                    self.views[id(out)] = (weakref.ref(out), made)
                    if id(t) not in self.unread:
                        self.unread[id(t)] = (weakref.ref(t), entry)
                    continue
                except TypeError:  # no weak reference: named by the view, as any call
                    pass
            self.unread.pop(id(t), None)
            if _overwritten(t, op, args, kwargs):
                self._clear(entry[4])

    @staticmethod
    def _first_grad_fn(out: Any) -> Any:
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for t in outs:
            if isinstance(t, torch.Tensor):
                fn = _grad_fn(t)
                if fn is not None:
                    return fn
        return None

    def _flag(self, func: Any, out: Any, frame: Any = None) -> None:
        """Queue device-side NaN/Inf flags of the call's floating outputs (no host sync)."""
        outs = out if isinstance(out, (tuple, list)) else (out,)
        loc: Any = _UNSET  # the user's line, looked up once per call (only if one is checked)
        name = getattr(func, "__name__", str(func))
        if name == "__get__" and _computing_op(func, out) is None:
            return  # a property read (``p.data``, ``x.grad``): no op made its tensor, which
            # is checked as a tensor given to the forward if a call computes from it
        for t in outs:
            if not isinstance(t, torch.Tensor):
                continue
            self._see(t)
            if name in _UNINITIALISED:
                continue  # uninitialised memory, written next: what is written is checked
            d = _checkable(t)
            if d is None:
                continue
            if loc is _UNSET:
                user = user_frame(sys._getframe(2) if frame is None else frame)  # 2: the caller
                loc = None if user is None else (user.f_code.co_filename, user.f_lineno)
            # an op run without grad made no node: its output's grad_fn is not this op's
            fn = _grad_fn(t) if torch.is_grad_enabled() else None
            self.made_by.append([name, fn, loc, None])
            self.flags.append(_flags(d))

    def first_nonfinite(self) -> ForwardNonFinite | None:
        """The first flagged output that held a NaN or Inf: all flags come to the host in one
        transfer per device, now."""
        if not self.flags:
            return None
        by_device: dict[torch.device, list[int]] = {}
        for i, f in enumerate(self.flags):
            by_device.setdefault(f.device, []).append(i)
        # inputs no call computed from: NaN/Inf when first touched and still as the forward
        # leaves them (an alias, ``p.data[:] = 0``, may have written over them since), and
        # none of a tensor gone since (a temporary only written into: nothing read it)
        for ref, entry in self.unread.values():
            t = ref()
            if t is None:
                self._clear(entry[4])
            elif (d := _checkable(t)) is not None:
                self.flags[entry[4]] = self.flags[entry[4]] & _flags(d)
        bad: dict[int, str] = {}
        for indices in by_device.values():
            values = torch.stack([self.flags[i] for i in indices]).tolist()
            for i, (nan, inf) in zip(indices, values):
                if nan or inf:
                    bad[i] = "nan" if nan else "inf"
        if not bad:
            return None
        first = min(bad)
        op, fn, loc, given = self.made_by[first][:4]
        module = node = None
        if fn is not None:
            meta = fn.metadata
            module = meta.get(MODULE_KEY)
            if given is None:  # an op made it: its node is marked; an input is no op's
                node = type(fn).__name__
                meta[FORWARD_NONFINITE_KEY] = bad[first]
        where = _location_text(*loc) if loc is not None else None
        return ForwardNonFinite(op, node, bad[first], module, where, first, given)

    # ---------------------------------------------------------------- compiled modules
    def before_module(self, module: Any, args: Any) -> None:
        """Off the stack while a ``torch.compile`` wrapper runs (Dynamo guards on modes)."""
        if dynamo.unwrap(module) is not None and dynamo.mode_on_top(self):
            dynamo.pop_mode()
            self.paused.append(module)

    def after_module(self, module: Any, args: Any, output: Any) -> None:
        if not self.paused or self.paused[-1] is not module:
            return
        self.paused.pop()
        try:  # still off the stack: the checks' own torch calls are not the forward's
            if torch.is_grad_enabled():
                # the region's node: the user's line that called the compiled module
                frame = outside_gradscope(sys._getframe(1))
                tensors = list(_tensors(output))
                self._stamp_outputs(tensors, frame)
                if self.check_finite:  # the region's outputs, as one call of the module
                    self._flag("torch.compile region", tensors, frame)
                for t in tensors:
                    if t.grad_fn is not None:
                        compiled.remember(t.grad_fn)  # its graph, while the metadata is intact
        finally:
            dynamo.push_mode(self)

    def _stamp_outputs(self, out: Any, frame: Any = None) -> None:
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
            if seq <= self.last or seq == NO_SEQUENCE_NR:
                continue  # made before this call (or a leaf's AccumulateGrad): not this line's
            if loc is _UNSET:
                # frame 2 is the caller of __torch_function__; None (no user line) is stamped
                # too, so that the next call does not take these nodes for its own
                frame = user_frame(sys._getframe(2) if frame is None else frame)
                loc = None if frame is None else (frame.f_code.co_filename, frame.f_lineno)
            # torch's stub declares Node.metadata a method; it is a dict attribute
            fn.metadata[CREATED_KEY] = loc  # type: ignore[index]
            if seq > self.last + 1:
                self._stamp_below(fn, loc, seq - self.last - 1)
            self.last = max(self.last, seq)

    def _stamp_below(self, top: Any, loc: tuple[str, int] | None, missing: int) -> None:
        """Stamp the ``missing`` nodes numbered between the last stamped one and ``top``: nodes
        created since the block began, not yet stamped, below ``top``."""
        stack = [nxt for nxt, _ in top.next_functions]
        while stack and missing > 0:
            fn = stack.pop()
            if fn is None or not self.start <= fn._sequence_nr() < NO_SEQUENCE_NR:
                continue
            meta = fn.metadata
            if CREATED_KEY in meta:
                continue
            meta[CREATED_KEY] = loc
            missing -= 1
            stack.extend(nxt for nxt, _ in fn.next_functions)

    def _stamp_custom(self) -> None:
        """Inside a custom Function's forward, stamp its node (``ctx``) with the line that
        called ``.apply`` (``stamps.custom_apply``)."""
        found = custom_apply(user_frame(sys._getframe(2)))
        if found is None:
            return
        ctx, site = found
        if CREATED_KEY not in ctx.metadata and site is not None:
            ctx.metadata[CREATED_KEY] = (site.f_code.co_filename, site.f_lineno)


class RecordForward:
    """An open-able ``record_forward`` block: enters the stamping ``TorchFunctionMode`` on
    ``__enter__`` and leaves it on ``__exit__`` (also when the forward raises).

    Attributes:
        first_nonfinite: with ``check_finite=True``, once the block has closed: the first op
            whose output held a NaN or Inf (``ForwardNonFinite``), or None.
    """

    def __init__(self, check_finite: bool = False) -> None:
        self.check_finite = check_finite
        self.first_nonfinite: ForwardNonFinite | None = None
        self.handle = HookHandle()
        self._mode: _ForwardMode | None = None

    def name_inputs(self, named: Any) -> None:
        """With ``check_finite=True``: labels (``(label, tensor)`` pairs, e.g.
        ``("the input example_input", x)``) of tensors the forward is given, so that a NaN
        or Inf already in one is said with its label (``ForwardNonFinite.input``). Tensors
        given without a label are said as ``a parameter`` or ``a tensor given to the
        forward``."""
        if self._mode is not None:
            self._mode.name(iter(named))

    def __enter__(self) -> RecordForward:
        mode = _ForwardMode(self.check_finite)
        self._mode = mode
        # hooks first: a compile inside the block then sees neither the mode nor the hooks
        self.handle.add(dynamo.ModuleHooks(mode.before_module, mode.after_module).install())
        try:
            mode.__enter__()
        except BaseException:
            self.handle.remove()
            raise
        self.handle.add(lambda: self._close(mode))
        return self

    def _close(self, mode: _ForwardMode) -> None:
        mode.__exit__(None, None, None)
        try:
            self.first_nonfinite = mode.first_nonfinite()
        finally:
            mode.flags.clear()
            mode.made_by.clear()
            mode.seen.clear()
            mode.names.clear()
            mode.unread.clear()
            mode.views.clear()
            self._mode = None

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


def record_forward(*, check_finite: bool = False) -> RecordForward:
    """Record where each autograd node created in the block comes from (file, line, code).

    ``record_backward`` then puts ``file:line: code`` on ``NonFinite.traceback`` and on
    ``Node.created_at``. Only the innermost frame outside torch is kept, so it costs
    far less than ``torch.autograd.detect_anomaly`` (see ``benchmarks/backward.py``).

    With ``check_finite=True`` it also finds the first op whose output held a NaN or Inf during
    the forward (op, module path, file:line): each floating output gets device-side flags,
    read with one host transfer (per device) when the block ends, never one sync per op. The
    result is ``.first_nonfinite`` of the object the ``with`` gives; the node it made is
    marked (``Node.forward_nonfinite``) in a later ``record_backward``'s graph.

    Args:
        check_finite: also look for the first non-finite forward value.

    Example:
        >>> import torch, gradscope as gs
        >>> x = torch.tensor([-1.0], requires_grad=True)
        >>> with gs.record_forward():
        ...     y = torch.where(x > 0, x.sqrt(), 0.0).sum()
        >>> with gs.record_backward(y) as rec:
        ...     y.backward()
        >>> rec.first_nonfinite.name
        'SqrtBackward0'
        >>> with gs.record_forward(check_finite=True) as fw:
        ...     z = (x.log() * 2).sum()           # log(-1) is NaN
        >>> fw.first_nonfinite.node, fw.first_nonfinite.kind
        ('LogBackward0', 'nan')
    """
    return RecordForward(check_finite=check_finite)


def _tensors(output: Any) -> Iterator[torch.Tensor]:
    from ..graph.nest import iter_tensors

    return (t for _, t in iter_tensors(output))
