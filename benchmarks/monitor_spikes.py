"""Spike detection's cost, on the models of ``benchmarks/monitor.py`` (19M MLP, GPT-2 17M).

    .venv/bin/python benchmarks/monitor.py --spikes-only [--rounds R] [--models mlp19m gpt2]

(``benchmarks/monitor.py`` runs these rows after its own unless ``--no-spike-costs``.)

Rows, per model, in one run (AdamW, the batch of ``monitor.py``):

  loss watched     GradMonitor(optimizer=opt) with ``mon.observe_loss(loss)`` each step (the
                   loss signal: its tensor joins the step's one transfer) against the same
                   monitor without it: median over interleaved pairs of the CPU-time ratio
                   (and of wall time). The grad-norm signal needs no extra work on the device:
                   its figure is the total norm the monitor already moves.
  detection on     the same monitor, loss watched, with spike detection on (``spike=10``,
                   the default) against off (``spike=None``): median over the same interleaved
                   rounds of the CPU-time ratio (target: at most 1.02x).
  detection work   the spike rule's own work per logged step (``SpikeRule.update`` and the
                   preview at ``optimizer.step()``'s pre-hook, which decides on a replay), wall
                   time inside those calls, as a share of the plain step: what the step would
                   lose without it, below the noise of the ratio above.
  transfers        device-to-host reads per logged step with the loss watched, less those of
                   the plain step (AdamW reads its step counters), counted as in
                   ``tests/monitor/test_transfers.py``: the target is 1.
  replay           the per-sample replay of a spiking step (``spike_samples.replay_samples``
                   run in-process at the pre-hook, so it can be timed and profiled): wall time
                   against one plain step (B examples: the target is about B+1 steps), its
                   method (vmap or loop), and the peak of the CPU bytes it allocated (torch
                   profiler's allocation events), against the parameter bytes.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch

import gradscope as gs
from gradscope.memory.measure_forward import cpu_allocations
from gradscope.monitor.spike_samples import replay_samples


class _Watched:
    """A Runner-like copy of ``task``'s model with a monitor, the loss observed or not."""

    def __init__(self, task: Any, observe: bool, spike: float | None = 10.0) -> None:
        import copy

        self.model = copy.deepcopy(task.model)
        self.task = task
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.monitor = gs.GradMonitor(self.model, optimizer=self.opt, spike=spike)
        self.observe = observe

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = self.task.loss(self.model, self.task.batch)
        if self.observe:
            self.monitor.observe_loss(loss)
        loss.backward()
        self.opt.step()

    def time_steps(self, k: int) -> tuple[float, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(k):
            self.step()
        wall, cpu = (time.perf_counter() - t0) / k, (time.process_time() - c0) / k
        self.monitor.history.clear()
        return wall, cpu


def spike_costs(task: Any, runner_cls: Any, rounds: int, steps: int) -> dict[str, Any]:
    import random

    on, off = _Watched(task, True), _Watched(task, False)
    undetected = _Watched(task, True, spike=None)
    plain = runner_cls(task, "plain")
    for r in (on, off, undetected, plain):
        r.time_steps(2)
    ratios, walls, detect, plain_s = [], [], [], []
    rng = random.Random(2)
    for _ in range(rounds):
        trio = [on, off, undetected]
        rng.shuffle(trio)
        t = {id(r): r.time_steps(steps) for r in trio}
        ratios.append(t[id(on)][1] / t[id(off)][1])
        walls.append(t[id(on)][0] / t[id(off)][0])
        detect.append(t[id(on)][1] / t[id(undetected)][1])
        plain_s.append(plain.time_steps(1)[0])
    # the rule's own work (wall time inside its calls), six steps
    rules = on.monitor.log.rules.spikes  # its methods are wrapped here to time them
    spent = [0.0]

    def timed(fn: Any) -> Any:
        def run(*a: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return fn(*a)
            finally:
                spent[0] += time.perf_counter() - t0
        return run

    rules.update = timed(rules.update)
    rules.would_start = timed(rules.would_start)
    own = []
    for _ in range(6):
        spent[0] = 0.0
        on.step()
        own.append(spent[0])
    transfers = _transfers(on) - _transfers(plain)  # less torch's own (AdamW's .item())
    replay = _replay(on, plain)
    for r in (on, off, undetected):
        r.monitor.remove()
    plain_med = statistics.median(plain_s)
    return {
        "loss": statistics.median(ratios), "loss_range": (min(ratios), max(ratios)),
        "loss_wall": statistics.median(walls),
        "detect": statistics.median(detect), "detect_range": (min(detect), max(detect)),
        "own_ms": statistics.median(own) * 1e3, "own": 1 + statistics.median(own) / plain_med,
        "transfers": transfers, **replay, "plain_ms": plain_med * 1e3,
    }


def _transfers(run: Any) -> float:
    names = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")
    count = [0]
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def counting(orig: Any) -> Any:
        def f(t: Any, *a: Any, **k: Any) -> Any:
            count[0] += 1
            return orig(t, *a, **k)
        return f

    try:
        for n in names:
            setattr(torch.Tensor, n, counting(saved[n]))
        for _ in range(4):
            run.step()
    finally:
        for n, orig in saved.items():
            setattr(torch.Tensor, n, orig)
    return count[0] / 4


def _replay(run: _Watched, plain: Any) -> dict[str, Any]:
    """The per-sample replay of the step's micro-batch, in-process at the pre-hook."""
    replayer = run.monitor._incidents.replayer  # read: the micro-batch the step kept
    out: dict[str, Any] = {}

    def now(*_: Any) -> None:
        t0 = time.perf_counter()
        res = replay_samples(replayer)
        out["seconds"] = time.perf_counter() - t0
        out["method"], out["batch"], out["note"] = res.method, res.batch, res.note
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    profile_memory=True) as prof:
            replay_samples(replayer)
        live = peak = 0
        for _, _, n in cpu_allocations(prof, "the per-sample replay"):
            live += n
            peak = max(peak, live)
        out["peak"] = peak

    handle = run.opt.register_step_pre_hook(now)
    try:
        run.step()
    finally:
        handle.remove()
    step = statistics.median(plain.time_steps(1)[0] for _ in range(3))
    params = sum(p.numel() * p.element_size() for p in run.model.parameters())
    return {"replay_ms": out["seconds"] * 1e3, "replay": out["seconds"] / step,
            "method": out["method"], "batch": out["batch"], "note": out["note"],
            "replay_peak": out["peak"], "params": params}


def print_spikes(task: Any, runner_cls: Any, rounds: int, steps: int) -> None:
    c = spike_costs(task, runner_cls, rounds, steps)
    print(
        f"    spikes: loss watched {c['loss']:.3f}x the monitor without it "
        f"[{c['loss_range'][0]:.2f}-{c['loss_range'][1]:.2f}] (wall {c['loss_wall']:.3f}x) "
        f"{'ok' if c['loss'] <= 1.02 else 'MISSED'} (target 1.02x); detection on "
        f"{c['detect']:.3f}x off (spike=None) [{c['detect_range'][0]:.2f}-"
        f"{c['detect_range'][1]:.2f}] {'ok' if c['detect'] <= 1.02 else 'MISSED'} (target "
        f"1.02x); detection's own work "
        f"{c['own_ms']:.3f} ms per step = {c['own']:.4f}x a plain step; "
        f"{c['transfers']:g} host transfer(s) per logged step; per-sample replay "
        f"({c['method']}, B={c['batch']}) {c['replay_ms']:.0f} ms = {c['replay']:.1f}x a plain "
        f"step of {c['plain_ms']:.0f} ms, peak {c['replay_peak'] / 2**20:.0f} MiB allocated "
        f"({c['replay_peak'] / c['params']:.2f}x the parameters' {c['params'] / 2**20:.0f} MiB)"
        + (f"; note: {c['note']}" if c["note"] else ""),
        flush=True,
    )
