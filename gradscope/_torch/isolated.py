"""Running a piece of the user's program where it cannot change the user's process: a forked
child (``os.fork``).

The child inherits the whole process as it is (copy-on-write: page tables, not memory), runs
``fn``, sends its result (plain, picklable data) back through a pipe, and ends with
``os._exit``. Nothing it does reaches the parent: parameters, buffers (reassigned ones too),
gradients and their version counters, optimizer state and the optimizer's hooks, every RNG
(torch's, a module's own ``torch.Generator``, Python's, NumPy's), iterators and Python objects
stay exactly as they were. The child computes on one thread (the parent's intra-op thread
pool does not survive a fork), and its standard output and error go to ``/dev/null``. An error
``fn`` raises is raised again in the parent with a traceback through the child's frames (file,
line and function; not their locals), so the user's line is named as if it ran here.
Effects outside the process (a file appended to, a network call) do happen in the child.

Where a fork is not safe (``fork_refused``: no ``os.fork``, ``GRADSCOPE_FORK=0`` (or the
older ``GRADSCOPE_REPLAY_FORK=0``), CUDA initialised, ``torch.distributed`` initialised) the
caller runs ``fn`` in the process and says so.

``optimizer_hooks_paused``: an optimizer's own step hooks (``register_step_pre_hook`` /
``register_step_post_hook``) and the global ones (``register_optimizer_step_*_hook``) kept from
firing for a block: the steps a measurement runs are not the user's (an EMA, a monitor on the
same optimizer would count them). It reads the optimizer's hook dictionaries by name, behind a
probe: on a torch without them the hooks are left as they are.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Answer:
    """What a forked child gave: ``value`` (``fn()``'s result), or ``failure`` (why there is
    none: the child died without an answer, ran past its time, or ``fn`` raised an error that
    does not pickle, named by its type and first line)."""

    value: Any = None
    failure: str | None = None


def fork_refused() -> str | None:
    """Why a forked child cannot run here, or None when it can."""
    if not hasattr(os, "fork"):
        return "no os.fork on this platform"
    for name in ("GRADSCOPE_FORK", "GRADSCOPE_REPLAY_FORK"):
        if os.environ.get(name, "1") == "0":
            return f"{name}=0"
    if torch.cuda.is_initialized():
        return "CUDA is initialised, and a forked process cannot use it"
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return "torch.distributed is initialised"
    return None


def in_child(fn: Callable[[], Any], timeout: float) -> Answer:
    """``fn()``'s result, computed in a forked child (call ``fork_refused`` first).

    Raises:
        the exception ``fn`` raised in the child, as it was raised, when it pickles (else the
        answer's ``failure`` names it).
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, answer, leave without running any exit handler
        code = 0
        try:
            os.close(read_end)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            os.environ["GRADSCOPE_FORK"] = "0"  # what fn calls runs here, not in a grandchild
            # the parent's intra-op thread pool did not survive the fork (its next parallel
            # region would wait forever): the child computes on one thread
            torch.set_num_threads(1)
            try:
                payload = pickle.dumps(("ok", fn()))
            except BaseException as exc:  # noqa: BLE001 - whatever happens, the parent hears
                first = str(exc).splitlines()[0] if str(exc) else ""
                frames = [(f.filename, f.lineno, f.name)
                          for f in traceback.extract_tb(exc.__traceback__)]
                payload = pickle.dumps(("error", (type(exc).__name__, first,
                                                  exc if _picklable(exc) else None, frames)))
            view = memoryview(payload)
            while view:
                view = view[os.write(write_end, view):]
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        data = _read_all(read_end, pid, timeout)
    finally:
        os.close(read_end)
    if data is None:
        return Answer(failure=f"it did not finish within {timeout:g} s and was ended")
    try:
        kind, value = pickle.loads(data)
    except Exception:  # noqa: BLE001 - a child that died mid-answer
        return Answer(failure="its process ended without an answer")
    if kind == "ok":
        return Answer(value)
    name, first, raised, frames = value
    if isinstance(raised, BaseException):  # the user's error, as it was raised, and where
        raise _with_frames(raised, frames)
    return Answer(failure=f"{name}: {first}" if first else name)


def _with_frames(exc: BaseException, frames: list[tuple[str, int | None, str]]) -> BaseException:
    """``exc`` with a traceback through ``frames`` (``(file, line, function)``, outermost
    first: where the child raised it), so that what reads the traceback (the CLI's
    ``file:line`` of the user's code, a printed traceback) sees the child's lines. Each frame
    is a one-line ``raise`` compiled at that file and line (the frames' locals are not there);
    a frame that cannot be made is left out."""
    tb: types.TracebackType | None = None
    for filename, lineno, name in reversed(frames):
        if not lineno or lineno < 1:
            continue
        try:
            code = compile("\n" * (lineno - 1) + "raise __exc", filename, "exec")
            code = code.replace(co_name=name)
        except (SyntaxError, ValueError, TypeError):
            continue
        made: types.TracebackType | None = None
        try:
            exec(code, {"__exc": exc})  # noqa: S102 - one raise, of exc
        except BaseException:  # noqa: BLE001 - exc itself
            made = sys.exc_info()[2]
        entry = made.tb_next if made is not None else None
        if entry is None:
            continue
        entry.tb_next = tb
        tb = entry
    return exc.with_traceback(tb)


def _picklable(exc: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001
        return False
    return True


def _read_all(fd: int, pid: int, timeout: float) -> bytes | None:
    """The child's whole answer (it closes the pipe at exit), or None after ``timeout``
    (the child is then killed). The child is always reaped."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                return None
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    except BaseException:  # Ctrl-C while waiting: the child goes too
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


#: where torch keeps an optimizer's step hooks (on the instance), and the global ones (in
#: ``torch.optim.optimizer``)
_STEP_HOOKS = ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks")
_GLOBAL_STEP_HOOKS = ("_global_optimizer_pre_hooks", "_global_optimizer_post_hooks")


@contextlib.contextmanager
def optimizer_hooks_paused(optimizer: Any) -> Iterator[None]:
    """The block runs ``optimizer.step()`` without its step hooks, nor the global optimizer
    step hooks: each hook dictionary is swapped for an empty one and put back (the same
    object, hooks registered meanwhile dropped) afterwards. ``optimizer`` may be None."""
    import torch.optim.optimizer as opt_module

    owners: list[tuple[Any, str]] = []
    if optimizer is not None:
        owners += [(optimizer, name) for name in _STEP_HOOKS]
    owners += [(opt_module, name) for name in _GLOBAL_STEP_HOOKS]
    saved: list[tuple[Any, str, dict[Any, Any]]] = []
    for owner, name in owners:
        hooks = getattr(owner, name, None)
        if isinstance(hooks, dict):
            saved.append((owner, name, hooks))
    try:
        for owner, name, hooks in saved:
            setattr(owner, name, type(hooks)())
        yield
    finally:
        for owner, name, hooks in saved:
            setattr(owner, name, hooks)
