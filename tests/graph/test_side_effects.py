"""gs.trace changes nothing process-wide: GC setting, grad mode, recursion limit, also while
other threads run and change them."""

from __future__ import annotations

import gc
import sys
import threading

import pytest
import torch

import gradscope as gs


def chain(n: int) -> torch.Tensor:
    y = torch.ones(2, requires_grad=True)
    for _ in range(n):
        y = y * 1.0
    return y


@pytest.mark.parametrize("gc_on", [True, False])
@pytest.mark.parametrize("grad_on", [True, False])
def test_trace_leaves_gc_grad_mode_and_recursion_limit(gc_on, grad_on):
    y = chain(50)
    limit = sys.getrecursionlimit()
    was = gc.isenabled()
    try:
        (gc.enable if gc_on else gc.disable)()
        with torch.set_grad_enabled(grad_on):
            gs.trace(y)
            assert torch.is_grad_enabled() is grad_on
        assert gc.isenabled() is gc_on
        assert sys.getrecursionlimit() == limit
    finally:
        (gc.enable if was else gc.disable)()


def test_a_trace_in_another_thread_does_not_undo_gc_disable():
    """The user disables GC while traces run back to back in a worker thread: it stays
    disabled (a trace that paused GC itself would turn it back on when it ends)."""
    y = chain(20_000)
    started, stop = threading.Event(), threading.Event()
    seen: list[bool] = []

    def worker() -> None:
        while not stop.is_set():
            gs.trace(y)
            started.set()

    was = gc.isenabled()
    gc.enable()
    try:
        t = threading.Thread(target=worker)
        t.start()
        started.wait(30)
        for _ in range(20):  # while traces run, the setting is the user's
            seen.append(gc.isenabled())
        gc.disable()
        for _ in range(3):  # let a few traces start and end after the user's call
            started.clear()
            started.wait(30)
        stop.set()
        t.join(60)
        assert not gc.isenabled()
        assert all(seen)
    finally:
        (gc.enable if was else gc.disable)()
    gs.release(y)
