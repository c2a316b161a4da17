"""Timing helpers for the ratio benchmarks: best-of-N wall time, measured in the same run."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable


def best_of(fn: Callable[[], object], repeat: int = 5) -> float:
    """The fastest of ``repeat`` runs of ``fn`` in seconds (GC off while timing).

    What ``fn`` returns is freed after the clock stops: freeing a large result (a graph of
    thousands of objects) is not part of the work being timed."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            result = fn()
            best = min(best, time.perf_counter() - t0)
            del result
        finally:
            gc.enable()
    return best


def verdict(ratio: float, target: float, higher_is_worse: bool = True) -> str:
    ok = ratio <= target if higher_is_worse else ratio >= target
    return "ok" if ok else "MISSED"
