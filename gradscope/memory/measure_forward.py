"""``measure_forward``: the bytes a forward allocates and still holds at its end, outputs
apart, seen by the profiler (CPU) or the CUDA allocator: a means independent of the saved-tensor
counting of ``activation_report``, against which its figures and a plan's (``.verify``) are
checked.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from typing import Any

import torch

from .._torch import torchcompat
from ..errors import GradscopeError
from ..graph.nest import device_of, iter_tensors
from .activations_recorder import (
    LossFn,
    _forward,
    _key,
    _preserved,
    new_objects_collected,
)
from .untouched import isolated, restored


def measure_forward(model: torch.nn.Module, *inputs: Any, loss_fn: LossFn = None) -> int:
    """Bytes allocated by one forward (and ``loss_fn``) and still held at its end, the
    outputs' storages apart: on the CPU from the profiler's allocation events (matched by
    address), on CUDA from ``torch.cuda.memory_allocated``. Independent of the saved-tensor
    accounting ``activation_report`` uses. Runs where it changes nothing, like
    ``step_memory``: in a forked child, else here with what the forward can change put back
    (buffers, reassigned attributes, generators, RNG states, the inputs' ``.grad``)."""
    if not isinstance(model, torch.nn.Module):
        raise GradscopeError(f"measure_forward needs an nn.Module, got {type(model).__name__}")

    def run() -> int:
        with restored(model, None, inputs), _preserved(model):
            return _measure(model, inputs, loss_fn)[0]

    return int(isolated(run, "the forward"))


def _measure(model: torch.nn.Module, inputs: tuple[Any, ...], loss_fn: LossFn,
             keep: list[torch.Tensor] | None = None) -> tuple[int, str]:
    """(bytes, method); with ``keep``, detached copies of the output tensors are appended to
    it, once the measurement is taken."""
    device = device_of(model, inputs)
    if device.type == "meta":
        raise GradscopeError(
            "a model on the meta device allocates nothing: build it on a real device to "
            "measure (the report and the plan work on meta)"
        )
    if device.type == "cuda":
        with new_objects_collected():
            torch.cuda.synchronize(device)
            before = torch.cuda.memory_allocated(device)
            root = _forward(model, inputs, loss_fn)
            gc.collect()
            torch.cuda.synchronize(device)
            after = torch.cuda.memory_allocated(device)
        outs = {_key(t)[0]: _key(t)[1] for _, t in iter_tensors(root) if t.device == device}
        _keep(root, keep)
        del root
        return after - before - sum(outs.values()), "cuda"
    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with new_objects_collected():
        with _quiet_stderr():  # kineto prints a line on start and stop at the C level
            prof.start()
        try:
            root = _forward(model, inputs, loss_fn)
            gc.collect()
        finally:
            with _quiet_stderr():
                prof.stop()
    out_ptrs = {t.untyped_storage().data_ptr() for _, t in iter_tensors(root)}
    events = cpu_allocations(prof, "the forward")
    live: dict[int, int] = {}
    for _, ptr, size in events:
        if size > 0:
            live[ptr] = size
        else:
            live.pop(ptr, None)
    _keep(root, keep)
    del root
    return sum(n for p, n in live.items() if p not in out_ptrs), "profiler"


def _keep(root: Any, keep: list[torch.Tensor] | None) -> None:
    if keep is not None:
        keep.extend(t.detach().clone() for _, t in iter_tensors(root))


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 sent to /dev/null for the block (only the profiler's start and stop
    run inside it, never the user's code)."""
    import os
    import sys

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def cpu_allocations(prof: Any, what: str) -> list[tuple[int, int, int]]:
    """The profiler's CPU allocation and free events, ``(time ns, pointer, bytes)`` in time
    order (a free has negative bytes); ``what`` names the measured code in the error."""
    results = prof.profiler.kineto_results if prof.profiler is not None else None
    if results is None:
        raise GradscopeError(f"the profiler recorded nothing; cannot measure {what}")
    events: list[tuple[int, int, int]] = []
    stack = list(results.experimental_event_tree())
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.typed[0] == torchcompat.PROFILER_ALLOCATION:
            f: Any = e.typed[1]
            if f.device.type == "cpu":
                events.append((e.start_time_ns, f.ptr, f.alloc_size))
    events.sort()
    return events
