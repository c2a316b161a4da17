"""``record_forward()``: where each autograd node was created (file, line, code).

While the forward runs, a ``TorchFunctionMode`` stamps each new autograd node's ``metadata``
with the user's file and line, so the first non-finite gradient can name the line of the
model's code, at a fraction of the cost of ``torch.autograd.detect_anomaly``, which formats a
full Python stack for every node and checks every gradient for NaN with a host sync.
"""

from __future__ import annotations

import functools
import linecache
import os
import sys
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .handles import HookHandle
from .stamps import CREATED_KEY


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


def _short_path(filename: str) -> str:
    try:
        rel = os.path.relpath(filename)
    except ValueError:  # another drive on Windows
        return filename
    return filename if rel.startswith("..") else rel


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
# the gradscope package (the CLI's model-file loader calls torch from there)
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
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


class RecordForward:
    """An open-able ``record_forward`` block: enters the stamping ``TorchFunctionMode`` on
    ``__enter__`` and leaves it on ``__exit__`` (also when the forward raises)."""

    def __init__(self) -> None:
        self.handle = HookHandle()

    def __enter__(self) -> RecordForward:
        mode = _ForwardMode()
        mode.__enter__()
        self.handle.add(lambda: mode.__exit__(None, None, None))
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


def record_forward() -> RecordForward:
    """Record where each autograd node created in the block comes from (file, line, code).

    ``record_backward`` then puts ``file:line: code`` on ``NonFinite.traceback`` and on
    ``Node.created_at``. Only the innermost frame outside torch is kept, so it costs
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
    return RecordForward()
