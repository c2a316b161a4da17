"""Alerts on a healthy outside model trained until it fits its data (torchvision ResNet-18).

    .venv-2.14/bin/python benchmarks/false_alarms.py [--steps 400] [--lrs 0.05 0.01]

A 10-class task of 10 random prototype images plus noise (0.5), batches of 16, SGD with
momentum 0.9 and weight decay 5e-4, every step logged with the loss observed. The model fits
the task, so many batches reach a loss near 0 and every gradient with it. For each learning
rate: the alerts by kind, the loss of each alert's step (ground truth: what the batch was), and
the "vanishing" alerts the same log gives with the loss left out (``alerts`` replayed over the
steps without their loss: the absolute level unscaled, as before the loss scaled it).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import time

import torch

import gradscope as gs
from gradscope.monitor.alerts import alerts


def run(lr: float, steps: int) -> None:
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    protos = torch.randn(10, 3, 32, 32)
    losses = []
    t0 = time.perf_counter()
    with gs.GradMonitor(model, optimizer=opt) as mon:
        for _ in range(steps):
            y = torch.randint(0, 10, (16,))
            x = protos[y] + 0.5 * torch.randn(16, 3, 32, 32)
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            mon.observe_loss(loss)
            loss.backward()
            losses.append(loss.item())
            opt.step()
    seconds = time.perf_counter() - t0
    log = mon.log
    fitted = sum(v < 1e-3 for v in losses)
    kinds = collections.Counter(a.kind for a in mon.alerts)
    print(f"lr {lr:g}: {steps} steps in {seconds:.0f} s, {fitted} batches with a loss below "
          f"1e-3; alerts: {dict(kinds) or 'none'}")
    for a in mon.alerts:
        print(f"  step {a.step:4} loss {losses[a.step]:9.3g}  {a.kind:9} {a.message[:90]}")
    unscaled = dataclasses.replace(
        log, steps=[dataclasses.replace(st, loss=None) for st in log.steps]
    )
    old = [a for a in alerts(unscaled) if a.kind == "vanishing"]
    at = sorted({f"{losses[a.step]:.1g}" for a in old}, key=float)
    print(f"  without the loss: {len(old)} vanishing alerts, at steps whose loss was "
          f"{', '.join(at) or '-'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--lrs", type=float, nargs="+", default=[0.05, 0.01])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s)")
    for lr in args.lrs:
        run(lr, args.steps)


if __name__ == "__main__":
    main()
