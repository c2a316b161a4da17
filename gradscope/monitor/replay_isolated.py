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

from collections.abc import Callable

from .._torch.isolated import fork_refused, in_child
from .replay import ReplayResult

#: seconds a forked replay may take before it is ended
TIMEOUT = 300.0

#: what the note says when the replay ran in the process
IN_PROCESS = (
    "replayed in this process ({why}): Python state the forward touches (its own RNGs, "
    "iterators, counters, hooks) ran a second time"
)

__all__ = ["IN_PROCESS", "TIMEOUT", "fork_refused", "replay_isolated"]


def replay_isolated(replay: Callable[[], ReplayResult], *, timeout: float = TIMEOUT
                    ) -> ReplayResult:
    """``replay()``'s result, computed in a forked child when that is safe (see the module's
    docstring, and ``gradscope._torch.isolated``), else in this process with a note saying
    so. Never raises."""
    why = fork_refused()
    if why is not None:
        res = replay()
        if res.replayed:
            extra = IN_PROCESS.format(why=why)
            res.note = f"{res.note}; {extra}" if res.note else extra
        return res
    try:
        answer = in_child(replay, timeout)
    except Exception as exc:  # noqa: BLE001 - the replay itself raised in the child
        return _failed(f"the replay failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"
                       if str(exc) else f"the replay failed: {type(exc).__name__}")
    if answer.failure is not None:
        return _failed(_said(answer.failure))
    if isinstance(answer.value, ReplayResult):
        return answer.value
    return _failed("the replay failed: unknown")


def _said(reason: str) -> str:
    """The incident's note for a child that gave no answer."""
    if reason.startswith("it did not finish"):
        return "the replay did not finish" + reason[len("it did not finish"):]
    if reason.startswith("its process ended"):
        return "the replay's process ended without an answer"
    return f"the replay failed: {reason}"


def _failed(note: str) -> ReplayResult:
    res = ReplayResult()
    res.note = note
    return res
