"""The doctor's cost by the size of the program it watches: chains of N x (Linear(16, 16) +
ReLU), forward + backward under ``gs.doctor(model)`` against the plain step, interleaved in
one run, medians of CPU time (one intra-op thread). Linear in N means the ratio stays flat as
N grows; the target (issue 48) is 1.5x at 4,000 layers. The default sizes are issue 48's
tensor-count sweep (250, 1,000, 5,000 layers: two parameter tensors each).

``--steps K`` runs K steps in each block (a training loop inside one ``gs.doctor`` block)
against K plain steps: the block's start (one walk of the model's modules and parameters)
and end are then paid once per K steps. The default, 1, is a block per step.

``--split`` also times, in the same interleaved rounds, what any tool built like the doctor
pays before recording anything: the plain step under an empty ``TorchFunctionMode``
(``mode``), with empty global module forward hooks (``hooks``: torch's slower module-call
path), and with both (``floor``); each as a ratio to the plain step.

    .venv/bin/python benchmarks/doctor_layers.py [--layers 250 1000 5000] [--rounds 5]
        [--steps 1] [--split]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.overrides import TorchFunctionMode

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


class _Empty(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _pre(module, args):
    return None


def _post(module, args, output):
    return None


def under_mode(model: torch.nn.Module, x: torch.Tensor, steps: int = 1) -> None:
    with _Empty():
        plain(model, x, steps)


def under_hooks(model: torch.nn.Module, x: torch.Tensor, steps: int = 1,
                mode: bool = False) -> None:
    pre = register_module_forward_pre_hook(_pre)
    post = register_module_forward_hook(_post)
    try:
        (under_mode if mode else plain)(model, x, steps)
    finally:
        pre.remove()
        post.remove()


def floor(model: torch.nn.Module, x: torch.Tensor, steps: int = 1) -> None:
    under_hooks(model, x, steps, mode=True)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number; give 1 or more")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=_positive, nargs="+", default=[250, 1000, 5000])
    parser.add_argument("--rounds", type=_positive, default=5)
    parser.add_argument("--steps", type=_positive, default=1, help="steps per block (default 1)")
    parser.add_argument("--split", action="store_true",
                        help="also time an empty mode, empty module hooks and both")
    args = parser.parse_args()
    torch.set_num_threads(1)
    k = args.steps
    others = [("mode", under_mode), ("hooks", under_hooks), ("floor", floor)] if args.split else []
    print(f"{k} step(s) per block; CPU milliseconds per step")
    print(f"{'layers':>7} {'plain ms':>9} {'doctor ms':>9} {'ratio':>7}"
          + "".join(f" {name:>7}" for name, _ in others))
    for n in args.layers:
        model, x = chain(n)
        plain(model, x)  # warm-up: both, once (the first block names every op kind)
        doctored(model, x)
        rounds = []
        for _ in range(args.rounds):
            row = [timed(plain, model, x, k) / k, timed(doctored, model, x, k) / k]
            row.extend(timed(fn, model, x, k) / k for _, fn in others)
            rounds.append(row)
        ratios = [statistics.median(r[i] / r[0] for r in rounds) for i in range(1, len(rounds[0]))]
        print(f"{n:>7} {1e3 * statistics.median(r[0] for r in rounds):>9.2f} "
              f"{1e3 * statistics.median(r[1] for r in rounds):>9.2f} {ratios[0]:>6.2f}x"
              + "".join(f" {ratio:>6.2f}x" for ratio in ratios[1:]))


if __name__ == "__main__":
    main()
