"""Backward-recorder benchmark (issue #4): ratios against anchors measured in the same run.

    .venv/bin/python benchmarks/backward.py [--repeat N]

For each sample model, best-of-N wall times of:

  rec bwd    `gs.record_backward` around `loss.backward()` (the walk, hooks, statistics and the
             annotated graph) / plain `loss.backward()`           (forward not timed)
  gs f+b     forward under `gs.record_forward()` + recorded backward / plain forward+backward
  anomaly    forward+backward under `torch.autograd.detect_anomaly()` / plain forward+backward

Target: the recorder costs less than anomaly mode (gs f+b < anomaly on every sample), although
it also reports Inf, every edge's gradient norm and the engine order.
"""

from __future__ import annotations

import argparse
import gc
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

import gradscope as gs

SAMPLES = Path(__file__).resolve().parent.parent / "samples"
NAMES = ("mlp.py", "cnn.py", "transformer.py", "custom_function.py", "nan_backward.py",
         "inf_backward.py")


def best_interleaved(
    variants: dict[str, tuple[Callable[[], object], Callable[[object], object]]], repeat: int
) -> dict[str, float]:
    """Fastest of ``repeat`` runs of each variant's ``run(setup())``, timing ``run`` only (GC
    off). The variants take turns, so a change of load on a shared machine hits all alike."""
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(repeat):
        for name, (setup, run) in variants.items():
            state = setup()
            gc.collect()
            gc.disable()
            try:
                t0 = time.perf_counter()
                run(state)
                best[name] = min(best[name], time.perf_counter() - t0)
            finally:
                gc.enable()
    return best


class Sample:
    """A model file's forward, loss and backward, each runnable on its own."""

    def __init__(self, name: str) -> None:
        self.mf = gs.load_model_file(SAMPLES / name)
        fwd = self.mf.forward()
        self.model, self.inputs = fwd.model, fwd.inputs
        self.params = list(self.model.parameters())

    def loss(self) -> torch.Tensor:
        for p in self.params:
            p.grad = None
        return self.mf.loss(self.model(*self.inputs))

    def recorded_loss(self) -> torch.Tensor:
        with gs.record_forward():
            return self.loss()

    def record(self, loss: torch.Tensor) -> gs.BackwardTrace:
        with gs.record_backward(loss, model=self.model) as rec:
            loss.backward()
        return rec


def anomaly_forward_backward(s: Sample) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autograd.detect_anomaly():
            try:
                s.loss().backward()
            except RuntimeError:  # NaN found: anomaly mode stops there
                pass


def measure(name: str, repeat: int) -> tuple[float, float, float, str]:
    s = Sample(name)
    nothing: Callable[[], object] = lambda: None  # noqa: E731
    t = best_interleaved(
        {
            "plain bwd": (s.loss, lambda loss: loss.backward()),
            "rec bwd": (s.loss, s.record),
            "plain f+b": (nothing, lambda _: s.loss().backward()),
            "gs f+b": (nothing, lambda _: s.record(s.recorded_loss())),
            "anomaly f+b": (nothing, lambda _: anomaly_forward_backward(s)),
        },
        repeat,
    )
    rec = s.record(s.recorded_loss())
    bad = rec.first_nonfinite
    found = "finite" if bad is None else f"{bad.kind} in {bad.name}"
    saw = f"{found}; {len(rec.steps)} steps"
    plain = t["plain f+b"]
    return t["rec bwd"] / t["plain bwd"], t["gs f+b"] / plain, t["anomaly f+b"] / plain, saw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)  # steadier timings on a shared machine
    head = f"{'sample':20} {'rec bwd':>9} {'gs f+b':>9} {'anomaly':>9}"
    print(head + "  verdict  what the recorder saw")
    missed = 0
    for name in NAMES:
        rec_bwd, gs_fb, anomaly_fb, saw = measure(name, args.repeat)
        ok = gs_fb < anomaly_fb
        missed += not ok
        print(f"{name:20} {rec_bwd:8.2f}x {gs_fb:8.2f}x {anomaly_fb:8.2f}x  "
              f"{'ok' if ok else 'MISSED':7}  {saw}")
    print("ratios: gradscope or anomaly mode / plain PyTorch, best of", args.repeat,
          "runs; target: gs f+b < anomaly" + ("" if not missed else f" (missed on {missed})"))


if __name__ == "__main__":
    main()
