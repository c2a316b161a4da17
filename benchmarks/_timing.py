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


def best_of_interleaved(
    fns: list[Callable[[], object]], repeat: int = 5, rounds: int = 3
) -> list[float]:
    """``best_of`` for each of ``fns``, in ``rounds`` alternating rounds of ``repeat`` runs: a
    burst of load from elsewhere on a shared machine then hits every side of a ratio, rather
    than all the runs of one side."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], best_of(fn, repeat))
    return best


def verdict(ratio: float, target: float, higher_is_worse: bool = True) -> str:
    ok = ratio <= target if higher_is_worse else ratio >= target
    return "ok" if ok else "MISSED"
