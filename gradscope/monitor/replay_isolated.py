"""The replay's contract: it leaves training exactly as it was.

A replay runs the user's forward (and loss, backward) a second time. Whatever that code
touches besides torch's tensors — a buffer reassigned out of place, a ``torch.Generator`` the
module owns, Python's ``random`` or NumPy's RNG (LayerDrop), an iterator it pulls from, a
counter, a ``.data`` write to a parameter, the user's own forward and tensor hooks — would
run twice, and training would go on from a different state than without the monitor.

So, where it can, the replay runs in a **forked child process** (``os.fork``): the child
inherits the whole process as it is at ``optimizer.step()``'s pre-hook (copy-on-write, so it
costs page tables, not memory), replays, sends the ``ReplayResult`` (plain data) back through a
pipe and ends with ``os._exit``. The child computes on one thread (the parent's intra-op
thread pool does not survive a fork), so its figures may differ from the step's in the last
bits; where the NaN or Inf starts does not. Nothing the child does reaches the parent: every
one of the cases above is exact by construction, and the parent's parameters, buffers, gradients,
optimizer state, every RNG, iterators and Python objects are untouched. The child's standard
output and error go to ``/dev/null`` (a forward that prints does not print twice). Effects
outside the process (a file the forward appends to, a network call) do happen in the child:
the replay cannot take those back.

Where a fork is not safe the replay runs in the process (``Replayer.replay``: torch's CPU and
CUDA RNG, buffers and training flags put back; the parameters are not changed by a forward)
and the incident's note says what may have run twice:

- CUDA (or another accelerator) initialised: a forked child cannot use the device;
- ``torch.distributed`` initialised: a collective in the child's forward (DDP's buffer
  broadcast) would talk to the parent's process group;
- no ``os.fork`` (Windows), or ``GRADSCOPE_REPLAY_FORK=0``.

A child that does not answer within ``TIMEOUT`` seconds (a lock another thread held at the
fork, say) is ended, and the incident says the replay did not finish.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import time
from collections.abc import Callable

import torch

from .replay import ReplayResult

#: seconds a forked replay may take before it is ended
TIMEOUT = 300.0

#: what the note says when the replay ran in the process
IN_PROCESS = (
    "replayed in this process ({why}): Python state the forward touches (its own RNGs, "
    "iterators, counters, hooks) ran a second time"
)


def fork_refused() -> str | None:
    """Why the replay cannot run in a forked child here, or None when it can."""
    if not hasattr(os, "fork"):
        return "no os.fork on this platform"
    if os.environ.get("GRADSCOPE_REPLAY_FORK", "1") == "0":
        return "GRADSCOPE_REPLAY_FORK=0"
    if torch.cuda.is_initialized():
        return "CUDA is initialised, and a forked process cannot use it"
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return "torch.distributed is initialised"
    return None


def replay_isolated(replay: Callable[[], ReplayResult], *, timeout: float = TIMEOUT
                    ) -> ReplayResult:
    """``replay()``'s result, computed in a forked child when that is safe (see the module's
    docstring), else in this process with a note saying so. Never raises."""
    why = fork_refused()
    if why is not None:
        res = replay()
        if res.replayed:
            extra = IN_PROCESS.format(why=why)
            res.note = f"{res.note}; {extra}" if res.note else extra
        return res
    return _in_child(replay, timeout)


def _in_child(replay: Callable[[], ReplayResult], timeout: float) -> ReplayResult:
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: replay, answer, leave without running any exit handler
        code = 0
        try:
            os.close(read_end)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            # the parent's intra-op thread pool did not survive the fork (its next parallel
            # region would wait forever): the child computes on one thread
            torch.set_num_threads(1)
            try:
                payload = pickle.dumps(("ok", replay()))
            except BaseException as exc:  # noqa: BLE001 - whatever happens, the parent hears
                payload = pickle.dumps(("error", f"{type(exc).__name__}: {exc}"))
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
        return _failed(f"the replay did not finish within {timeout:g} s and was ended")
    try:
        kind, value = pickle.loads(data)
    except Exception:  # noqa: BLE001 - a child that died mid-answer
        return _failed("the replay's process ended without an answer")
    if kind == "ok" and isinstance(value, ReplayResult):
        return value
    return _failed(f"the replay failed: {str(value).splitlines()[0] if value else 'unknown'}")


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
        _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


def _failed(note: str) -> ReplayResult:
    res = ReplayResult()
    res.note = note
    return res
