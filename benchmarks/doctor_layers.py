"""The doctor's cost by the size of the program it watches: chains of N x (Linear(16, 16) +
ReLU), forward + backward under ``gs.doctor(model)`` against the plain step, interleaved in
one run, medians of CPU time (one intra-op thread). Linear in N means the ratio stays flat as
N grows; the target (issue 48) is 1.5x at 4,000 layers. The default sizes are issue 48's
tensor-count sweep (250, 1,000, 5,000 layers: two parameter tensors each).

``--steps K`` runs K steps in each block (a training loop inside one ``gs.doctor`` block)
against K plain steps: the block's start (one walk of the model's modules and parameters)
and end are then paid once per K steps. The default, 1, is a block per step.

    .venv/bin/python benchmarks/doctor_layers.py [--layers 250 1000 5000] [--rounds 5] [--steps 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import gradscope as gs


def chain(n: int) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    layers = [torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU()) for _ in range(n)]
    return torch.nn.Sequential(*layers), torch.randn(8, 16)


def timed(fn, *args) -> float:
    start = time.process_time()
    fn(*args)
    return time.process_time() - start


def plain(model: torch.nn.Module, x: torch.Tensor, steps: int = 1) -> None:
    for _ in range(steps):
        model(x).square().mean().backward()


def doctored(model: torch.nn.Module, x: torch.Tensor, steps: int = 1) -> None:
    with gs.doctor(model) as doc:
        for _ in range(steps):
            model(x).square().mean().backward()
    assert not doc.findings, doc.findings  # a healthy chain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[250, 1000, 5000])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1, help="steps per block (default 1)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    k = args.steps
    print(f"{k} step(s) per block; CPU milliseconds per step")
    print(f"{'layers':>7} {'plain ms':>9} {'doctor ms':>9} {'ratio':>7}")
    for n in args.layers:
        model, x = chain(n)
        plain(model, x)  # warm-up: both, once (the first block names every op kind)
        doctored(model, x)
        pairs = [(timed(plain, model, x, k) / k, timed(doctored, model, x, k) / k)
                 for _ in range(args.rounds)]
        ratio = statistics.median(d / p for p, d in pairs)
        print(f"{n:>7} {1e3 * statistics.median(p for p, _ in pairs):>9.2f} "
              f"{1e3 * statistics.median(d for _, d in pairs):>9.2f} {ratio:>6.2f}x")


if __name__ == "__main__":
    main()
