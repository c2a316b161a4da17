"""The monitor's cost by the number of parameter tensors (mixture-of-experts scale), in one run.

    .venv/bin/python benchmarks/monitor_tensors.py [--layers 250 1000 5000] [--rounds R]
    .venv/bin/python benchmarks/monitor.py --tensors            (the same)

The model: N experts, each an ``nn.Linear(16, 16)`` (2N parameter tensors: a weight and a
bias), all applied to the batch and summed (every expert gets a gradient each step, as in a
dense mixture); batch 8, mean-square loss, AdamW (foreach), one intra-op thread. Small tensors
on purpose: what grows with the tensor count is the host's work per tensor, which large
tensors hide.

Three copies with the same weights train side by side:

  plain          the step alone
  floor          the step, then one ``torch._foreach_norm`` over the gradients and one
                 ``.tolist()`` of the stacked norms: the least a per-parameter gradient-norm
                 logger can do (what issue 48's target is a ratio against)
  gradscope      GradMonitor(model, optimizer=opt) at its defaults (norms every step, full
                 statistics every 50 logged steps, alerts, incidents, spikes)

Each copy first trains 30 steps (the monitor's alert windows fill: the steady state of a long
run). Then per round the three run in a random order, K steps each; printed per size: the
plain step (ms of CPU time, median), and the medians over rounds of floor / plain and
gradscope / floor, of CPU time (``time.process_time``: on a shared machine wall time mostly
measures the other jobs). Target (issue 48): gradscope <= 1.05x floor at 10,000 tensors.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

import torch
from torch import nn

import gradscope as gs

TARGET = 1.05
WARMUP = 30


class Experts(nn.Module):
    """``n`` experts, all applied and summed."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.experts = nn.ModuleList(nn.Linear(16, 16) for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(x)
        for e in self.experts:
            out = out + e(x)
        return out


class Copy:
    """One copy of the model with its optimizer and what runs after its step."""

    def __init__(self, n: int, kind: str) -> None:
        torch.manual_seed(0)
        self.model = Experts(n)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-3, foreach=True)
        self.kind = kind
        self.params = list(self.model.parameters())
        self.monitor = gs.GradMonitor(self.model, optimizer=self.opt) if kind == "gradscope" \
            else None
        self.x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))

    def step(self) -> None:
        self.opt.zero_grad()
        self.model(self.x).square().mean().backward()
        if self.kind == "floor":
            grads = [p.grad for p in self.params if p.grad is not None]
            torch.stack(torch._foreach_norm(grads, 2.0)).tolist()
        self.opt.step()

    def timed(self, k: int) -> float:
        gc.collect()
        t0 = time.process_time()
        for _ in range(k):
            self.step()
        return (time.process_time() - t0) / k


def sweep(layers: int, rounds: int, steps: int, rng: random.Random) -> dict[str, float]:
    copies = {kind: Copy(layers, kind) for kind in ("plain", "floor", "gradscope")}
    for c in copies.values():
        for _ in range(WARMUP):
            c.step()
    times: dict[str, list[float]] = {k: [] for k in copies}
    floor_ratio, ours_ratio = [], []
    for _ in range(rounds):
        order = list(copies)
        rng.shuffle(order)
        now = {k: copies[k].timed(steps) for k in order}
        for k, v in now.items():
            times[k].append(v)
        floor_ratio.append(now["floor"] / now["plain"])
        ours_ratio.append(now["gradscope"] / now["floor"])
    mon = copies["gradscope"].monitor
    assert mon is not None and not mon.alerts, mon.alerts  # healthy: nothing to say
    mon.remove()
    return {
        "tensors": 2 * layers,
        "plain_ms": statistics.median(times["plain"]) * 1e3,
        "floor": statistics.median(floor_ratio),
        "ours": statistics.median(ours_ratio),
        "ours_lo": min(ours_ratio),
        "ours_hi": max(ours_ratio),
        "extra_ms": (statistics.median(times["gradscope"]) - statistics.median(times["floor"]))
        * 1e3,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[250, 1000, 5000])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rng = random.Random(0)
    print(f"torch {torch.__version__}, 1 thread; CPU time, median over {args.rounds} rounds "
          f"of {args.steps} steps per copy, after {WARMUP} warm-up steps")
    for layers in args.layers:
        r = sweep(layers, args.rounds, args.steps, rng)
        verdict = "ok" if r["ours"] <= TARGET else "MISSED"
        print(
            f"{r['tensors']:>6,} tensors: plain step {r['plain_ms']:.1f} ms; floor "
            f"{r['floor']:.3f}x plain; gradscope {r['ours']:.3f}x floor "
            f"[{r['ours_lo']:.2f}-{r['ours_hi']:.2f}], {r['extra_ms']:+.1f} ms a step "
            f"({verdict} against {TARGET}x)",
            flush=True,
        )


if __name__ == "__main__":
    main()
