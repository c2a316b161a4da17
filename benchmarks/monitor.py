"""GradMonitor benchmark: the cost of a monitored training step at real sizes, in one run.

    .venv/bin/python benchmarks/monitor.py [--rounds R] [--steps K] [--threads T] [--models ...]
    .venv/bin/python benchmarks/monitor.py --tensors [--layers ...]   (monitor_tensors.py)

Two models of the sizes people train (built from code, nothing downloaded):

  mlp19m   Linear(1024,2048), 4 x Linear(2048,2048), Linear(2048,10), ReLUs (18.9M parameters);
           batch 64, cross-entropy, AdamW
  gpt2     transformers GPT2LMHeadModel from a small GPT2Config (8 layers, 384 wide, vocab 8192,
           tied embeddings: 17.4M parameters); batch 4 x 64 tokens, AdamW

and, as before, the two samples (samples/mlp.py, samples/transformer.py), whose steps are too
small to show the cost of reading the gradients. Each variant trains its own copy of the model
(same weights, same batch) for the whole run; per round the variants run in a shuffled order,
each as a back-to-back pair with the plain copy (K steps each, the pair's order random too).
Printed: the plain step in ms of CPU time (median), and per variant the median over rounds of
the ratio within each pair, of the process's CPU time (``time.process_time``: on a machine
shared with other jobs a step's wall time mostly measures their load) and of wall time:

  gradscope        GradMonitor(model, optimizer=opt): defaults (norms every step, full
                   statistics every FULL_EVERY logged steps)
  gradscope full   GradMonitor(model, optimizer=opt, full_every=1): max/mean abs, zero
                   fraction and sampled update ratios at every step as well
  foreach_norm     after backward: torch._foreach_norm over the gradients + one .tolist()
                   (the floor for per-parameter norms)
  wandb-style      a per-parameter gradient hook as wandb.watch(log="gradients") installs:
                   .item() for min and max, a 64-bin histc, .tolist(), per parameter per step
  plain copy       a second, unmonitored copy: the control (how far two identical runs differ
                   on this machine, from memory placement and other load)

and the monitor's extra memory: ``retained`` (bytes of tensors the monitor holds between steps,
found by walking the objects it references) and ``peak`` (the most bytes alive at once of the
tensors its own ops allocated, full statistics included), against the parameters' bytes.

Incidents (replay=True, the default with optimizer=; ``--no-replay-costs`` skips them), per
model: a good step with replay=True against the same monitor with replay=False (median of the
ratios of interleaved pairs, CPU and wall time); the bytes the monitor holds at
``optimizer.step()`` with and without replay (the inputs it references and the gradient that
reached the outputs) against the bound "inputs + one micro-batch's output gradients"; and the
replay itself (the step run again under record_forward(check_finite=True) and
record_backward, as on a bad step) against one plain step.

Spikes (``benchmarks/monitor_spikes.py``, ``--spikes-only``; ``--no-spike-costs`` skips
them): the loss watched vs not, the spike rule's own work, host transfers per logged step,
and the per-sample replay's time and memory on a spiking step.

Targets (design.md): gradscope <= 1.05x plain and within about 2% of the foreach_norm floor;
gradscope full <= 1.25x; extra memory <= 1% of the parameter bytes (replay=False: the
replay's references are bounded separately); replay=True <= 1.02x replay=False; the replay
<= 5x a plain step.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import random
import statistics
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import gradscope as gs
from gradscope.monitor.core import FULL_EVERY

ROOT = Path(__file__).resolve().parent.parent
TARGET, TARGET_FULL, TARGET_MEMORY = 1.05, 1.25, 0.01
TARGET_REPLAY_STEP, TARGET_REPLAY = 1.02, 5.0
VARIANTS = ("gradscope", "gradscope full", "foreach_norm", "wandb-style", "plain copy")


# ---------------------------------------------------------------- models
class Task:
    """A model, a fixed batch and its loss."""

    def __init__(
        self, name: str, model: nn.Module, batch: Any, loss: Callable[..., Any], real: bool = True
    ) -> None:
        self.name, self.model, self.batch, self.loss = name, model, batch, loss
        self.real = real  # a model of realistic size (the samples are not)

    def numel(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())


def mlp19m() -> Task:
    torch.manual_seed(0)
    layers: list[nn.Module] = [nn.Linear(1024, 2048), nn.ReLU()]
    for _ in range(4):
        layers += [nn.Linear(2048, 2048), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(2048, 10))
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 1024, generator=g), torch.randint(0, 10, (64,), generator=g)
    return Task("mlp19m", model, (x, y), lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]))


def gpt2() -> Task:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=8192, n_positions=64, n_embd=384, n_layer=8, n_head=6,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(0))
    return Task("gpt2", model, ids, lambda m, b: m(input_ids=b, labels=b).loss)


def _sample(name: str, batch: int) -> Task:
    """A sample model file, its batch doubled from ``batch`` until a plain step takes 12 ms (so
    the timer's resolution and Python overhead do not decide the ratio)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "samples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    while True:
        g = torch.Generator().manual_seed(0)
        if name == "mlp":
            x = torch.randn(batch, 8, generator=g)
            data: Any = (x, x[:, :4].argmax(dim=1))
        else:
            tokens = torch.randint(0, 50, (batch, 8), generator=g)
            data = (tokens, tokens.roll(1, dims=1))
        task = Task(
            f"sample {name} (batch {batch})", mod.model, data,
            lambda m, b: mod.loss_fn(m(b[0]), b[1]), real=False,
        )
        probe = Runner(task, "plain")
        probe.time_steps(2)
        if min(probe.time_steps(3)[1] for _ in range(3)) >= 0.012:
            return task
        batch *= 2


MODELS: dict[str, Callable[[], Task]] = {
    "mlp19m": mlp19m,
    "gpt2": gpt2,
    "sample-mlp": lambda: _sample("mlp", 8192),
    "sample-transformer": lambda: _sample("transformer", 256),
}


# ---------------------------------------------------------------- variants
class Runner:
    """One copy of the task's model with its AdamW optimizer and one variant's monitoring."""

    def __init__(self, task: Task, kind: str) -> None:
        self.model = copy.deepcopy(task.model)
        self.task = task
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.kind = kind
        self.monitor: gs.GradMonitor | None = None
        self.after_backward: Callable[[], None] = lambda: None
        self.kept: list[Any] = []
        if kind in ("plain", "plain copy"):
            pass
        elif kind == "gradscope":
            self.monitor = gs.GradMonitor(self.model, optimizer=self.opt)
        elif kind == "gradscope no replay":
            self.monitor = gs.GradMonitor(self.model, optimizer=self.opt, replay=False)
        elif kind == "gradscope full":
            self.monitor = gs.GradMonitor(self.model, optimizer=self.opt, full_every=1)
        elif kind == "foreach_norm":
            self.after_backward = self._foreach_norm
        elif kind == "wandb-style":
            for p in self.model.parameters():
                p.register_hook(self._histogram)

    def _foreach_norm(self) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        self.kept.append(torch.stack(torch._foreach_norm(grads)).tolist())

    def _histogram(self, grad: torch.Tensor) -> None:
        # what wandb's torch hook does per parameter: drop non-finite, min/max, histc, to host
        flat = grad.detach().reshape(-1).float()
        finite = flat[torch.isfinite(flat)]
        lo, hi = finite.min().item(), finite.max().item()
        self.kept.append(torch.histc(finite, bins=64, min=lo, max=hi).tolist())

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        self.task.loss(self.model, self.task.batch).backward()
        self.after_backward()
        self.opt.step()

    def time_steps(self, k: int) -> tuple[float, float]:
        """(wall seconds, CPU seconds of this process) per step, over ``k`` steps."""
        gc.collect()
        gc.disable()
        try:
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(k):
                self.step()
            wall = (time.perf_counter() - t0) / k
            cpu = (time.process_time() - c0) / k
        finally:
            gc.enable()
        self.kept.clear()
        if self.monitor is not None:  # keep the history from growing across rounds
            self.monitor.history.clear()
        return wall, cpu


# ---------------------------------------------------------------- memory
def retained_bytes(monitor: gs.GradMonitor, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    """Bytes of the tensor storages reachable through the monitor's own objects and containers,
    not counting the model's parameters and gradients or the optimizer's state."""
    skip = {id(model), id(opt), id(opt.state), id(opt.param_groups)}
    owned = set()
    for p in model.parameters():
        owned.add(p.untyped_storage().data_ptr())
        if p.grad is not None:
            owned.add(p.grad.untyped_storage().data_ptr())
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor):
                owned.add(v.untyped_storage().data_ptr())
    seen, stack, storages = set(), [monitor], {}
    while stack:
        obj = stack.pop()
        if id(obj) in seen or id(obj) in skip:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            st = obj.untyped_storage()
            if st.data_ptr() not in owned:
                storages[st.data_ptr()] = st.nbytes()
        elif isinstance(obj, (list, tuple, set, frozenset, dict, deque)):
            stack.extend(obj.values() if isinstance(obj, dict) else obj)
        elif type(obj).__module__.startswith("gradscope"):  # the monitor's own objects
            if hasattr(obj, "__dict__"):
                stack.extend(vars(obj).values())
            for cls in type(obj).__mro__:
                slots = getattr(cls, "__slots__", ())
                stack.extend(getattr(obj, n) for n in slots if hasattr(obj, n))
    return sum(storages.values())


class _Allocations(TorchDispatchMode):
    """Tracks the bytes alive of the tensors allocated by the ops run under it."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                n = t.untyped_storage().nbytes()
                self.live += n
                self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._free, n)
        return out

    def _free(self, n: int) -> None:
        self.live -= n


def peak_bytes(task: Task, kind: str, steps: int = 3) -> int:
    """The peak of the bytes alive of tensors that the monitor's own code allocated over
    ``steps`` steps of variant ``kind`` (its hook bodies run under the allocation tracker)."""
    runner = Runner(task, kind)
    mon = runner.monitor
    assert mon is not None
    tracker = _Allocations()
    for name in ("_measure_after_backward", "_measure_before_step", "_finish_step"):
        method = getattr(mon, name)

        def tracked(*a: Any, _m: Callable[..., Any] = method) -> Any:
            with tracker:
                return _m(*a)

        setattr(mon, name, tracked)
    for _ in range(steps):
        runner.step()
    mon.remove()
    return tracker.peak


def own_ms(task: Task, kind: str, steps: int = 6) -> float:
    """Median CPU milliseconds per step spent in the monitor's own hook bodies (the norms, the
    transfer, the records; for "foreach_norm" the baseline's call), steps after the first.
    Less disturbed by other processes than the step ratios, since it times only that work."""
    runner = Runner(task, kind)
    per_step: list[float] = []
    spent = [0.0]

    def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
        def run(*a: Any) -> Any:
            t0 = time.process_time()  # CPU time, as the step ratios
            try:
                return fn(*a)
            finally:
                spent[0] += time.process_time() - t0

        return run

    mon = runner.monitor
    if mon is not None:
        for name in ("_measure_after_backward", "_measure_before_step", "_finish_step"):
            setattr(mon, name, timed(getattr(mon, name)))
    else:
        runner.after_backward = timed(runner.after_backward)
    for i in range(steps + 1):
        spent[0] = 0.0
        runner.step()
        if i:  # the first logged step is a full-statistics step
            per_step.append(spent[0])
    if mon is not None:
        mon.remove()
    return statistics.median(per_step) * 1e3


# ---------------------------------------------------------------- the run
def bench(task: Task, args: argparse.Namespace) -> dict[str, Any]:
    runners = {k: Runner(task, k) for k in ("plain", *VARIANTS)}
    for r in runners.values():
        r.time_steps(2)  # warm up every variant
    ratios: dict[str, list[float]] = {k: [] for k in VARIANTS}  # of CPU times
    walls: dict[str, list[float]] = {k: [] for k in VARIANTS}  # of wall times
    plain_times: list[float] = []
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(VARIANTS)
        rng.shuffle(order)
        for k in order:
            pair = ["plain", k] if rng.random() < 0.5 else [k, "plain"]
            t = {v: runners[v].time_steps(args.steps) for v in pair}
            plain_times.append(t["plain"][1])
            ratios[k].append(t[k][1] / t["plain"][1])
            walls[k].append(t[k][0] / t["plain"][0])
    # between steps, as the target reads it: what replay=True keeps lives only inside a step
    probe = Runner(task, "gradscope no replay")
    probe.time_steps(2)
    mon = probe.monitor
    assert mon is not None
    retained = retained_bytes(mon, probe.model, probe.opt)
    mon.remove()
    for r in runners.values():
        if r.monitor is not None:
            r.monitor.remove()
    del runners
    gc.collect()
    return {
        "plain_ms": statistics.median(plain_times) * 1e3,
        "median": {k: statistics.median(v) for k, v in ratios.items()},
        "range": {k: (min(v), max(v)) for k, v in ratios.items()},
        "wall": {k: statistics.median(v) for k, v in walls.items()},
        "retained": retained,
        "peak": peak_bytes(task, "gradscope"),
        "peak_full": peak_bytes(task, "gradscope full"),
        "own": {k: own_ms(task, k) for k in ("gradscope", "gradscope full", "foreach_norm")},
    }


def replay_costs(task: Task, args: argparse.Namespace) -> dict[str, Any]:
    """replay=True vs replay=False on good steps, the bytes held at the step, the replay's
    own time against a plain step."""
    runs = {k: Runner(task, k) for k in ("plain", "gradscope", "gradscope no replay")}
    for r in runs.values():
        r.time_steps(2)
    ratios, walls = [], []
    rng = random.Random(1)
    for _ in range(args.rounds):
        pair = ["gradscope", "gradscope no replay"]
        rng.shuffle(pair)
        t = {v: runs[v].time_steps(args.steps) for v in pair}
        ratios.append(t["gradscope"][1] / t["gradscope no replay"][1])
        walls.append(t["gradscope"][0] / t["gradscope no replay"][0])
    # the replay's own work on a good step (its hook bodies, CPU time): less disturbed by
    # other processes than the step ratio
    watch = runs["gradscope"].monitor._incidents  # type: ignore[union-attr]
    spent = [0.0]

    def timed(obj: Any, name: str) -> None:
        fn = getattr(obj, name)

        def run(*a: Any, _fn: Callable[..., Any] = fn) -> Any:
            # wall time: over such short spans the process time also counts the intra-op
            # threads spinning after the last kernel
            c0 = time.perf_counter()
            try:
                return _fn(*a)
            finally:
                spent[0] += time.perf_counter() - c0

        setattr(obj, name, run)

    # the module hooks were registered with the bound methods: time through the handles' dicts
    replayer = watch.replayer
    for name in ("before_step", "after_backward", "end_step", "record"):
        timed(watch, name)
    for hooks in (runs["gradscope"].model._forward_pre_hooks,
                  runs["gradscope"].model._forward_hooks):
        for key, fn in list(hooks.items()):
            if getattr(fn, "__self__", None) is replayer:
                holder = type("H", (), {})()
                holder.f = fn
                timed(holder, "f")
                hooks[key] = holder.f
    own = []
    for _ in range(6):
        spent[0] = 0.0
        runs["gradscope"].step()
        own.append(spent[0])
    held: dict[str, int] = {}
    for k in ("gradscope", "gradscope no replay"):
        r = runs[k]
        seen: list[int] = []
        handle = r.opt.register_step_pre_hook(
            lambda *_, _r=r, _s=seen: _s.append(retained_bytes(_r.monitor, _r.model, _r.opt))
        )
        r.step()
        handle.remove()
        held[k] = seen[0]
    # the bound: the batch's tensors and the gradient that reached the outputs
    inputs = sum(t.untyped_storage().nbytes() for t in tree_leaves(task.batch)
                 if isinstance(t, torch.Tensor))
    on = runs["gradscope"]
    replayer = on.monitor._incidents.replayer  # type: ignore[union-attr]
    out_grads = 0
    replay_s: list[float] = []

    def replay_now(*_: Any) -> None:
        nonlocal out_grads
        out_grads = sum(g.untyped_storage().nbytes() for mb in replayer.batches
                        for g in mb.grads.values())
        c0 = time.process_time()
        res = replayer.replay()
        replay_s.append(time.process_time() - c0)
        assert res.replayed, res.note

    handle = on.opt.register_step_pre_hook(replay_now)
    plain_s = []
    for _ in range(3):
        on.step()
        plain_s.append(runs["plain"].time_steps(1)[1])
    handle.remove()
    for r in runs.values():
        if r.monitor is not None:
            r.monitor.remove()
    return {
        "step": statistics.median(ratios),
        "step_range": (min(ratios), max(ratios)),
        "step_wall": statistics.median(walls),
        "held": held["gradscope"] - held["gradscope no replay"],
        "bound": inputs + out_grads,
        "inputs": inputs,
        "out_grads": out_grads,
        "replay": statistics.median(replay_s) / statistics.median(plain_s),
        "own_ms": statistics.median(own) * 1e3,
        "own": 1 + statistics.median(own) / statistics.median(plain_s),
        "replay_ms": statistics.median(replay_s) * 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--no-replay-costs", action="store_true", help="skip the incident costs")
    ap.add_argument("--replay-only", action="store_true", help="only the incident costs")
    ap.add_argument("--no-spike-costs", action="store_true", help="skip the spike rows")
    ap.add_argument("--spikes-only", action="store_true",
                    help="only the spike rows (benchmarks/monitor_spikes.py)")
    ap.add_argument("--tensors", action="store_true",
                    help="only the tensor-count sweep (benchmarks/monitor_tensors.py)")
    if "--tensors" in sys.argv[1:]:  # its own options (--layers, --rounds, --steps)
        _load("monitor_tensors").main([a for a in sys.argv[1:] if a != "--tensors"])
        return
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {args.threads} thread(s); ratio = CPU time of a variant "
        f"step / of a plain step (process time: what other processes on a shared machine "
        f"disturb least), median over {args.rounds} interleaved pairs of {args.steps} steps "
        f"[min-max], and the same with wall time; full statistics every {FULL_EVERY} logged "
        "steps by default"
    )
    for name in args.models:
        task = MODELS[name]()
        if args.replay_only or args.spikes_only:
            print(f"{task.name}: {task.numel() / 1e6:.1f}M parameters", flush=True)
            if args.replay_only:
                _print_replay(task, args)
            if args.spikes_only:
                _print_spikes(task, args)
            continue
        r = bench(task, args)
        med = r["median"]
        cells = ", ".join(
            f"{k} {med[k]:.3f}x [{r['range'][k][0]:.2f}-{r['range'][k][1]:.2f}] "
            f"(wall {r['wall'][k]:.3f}x)"
            for k in VARIANTS
        )
        gap = med["gradscope"] - med["foreach_norm"]
        verdict = [
            f"defaults {'ok' if med['gradscope'] <= TARGET else 'MISSED'} "
            f"({gap * 100:+.1f} points vs foreach_norm)",
            f"full {'ok' if med['gradscope full'] <= TARGET_FULL else 'MISSED'}",
        ]
        mem = max(r["retained"], r["peak"])
        if task.real:
            verdict.append(
                f"memory {'ok' if mem <= TARGET_MEMORY * task.nbytes() else 'MISSED'}"
            )
        print(
            f"{task.name}: {task.numel() / 1e6:.1f}M parameters, plain step "
            f"{r['plain_ms']:.1f} ms of CPU; {cells}; extra memory: retained {r['retained']:,} B, "
            f"peak {r['peak']:,} B at defaults ({100 * mem / task.nbytes():.2f}% of the "
            f"{task.nbytes():,} B of parameters), {r['peak_full']:,} B with full statistics "
            f"({100 * r['peak_full'] / task.nbytes():.2f}%); {', '.join(verdict)}",
            flush=True,
        )
        own = r["own"]
        print(
            f"    own work per step (median): gradscope {own['gradscope']:.2f} ms, gradscope "
            f"full {own['gradscope full']:.2f} ms, foreach_norm + .tolist() "
            f"{own['foreach_norm']:.2f} ms; as a share of the plain step: "
            + ", ".join(f"{k} {1 + v / r['plain_ms']:.3f}x" for k, v in own.items()),
            flush=True,
        )
        if not args.no_replay_costs:
            _print_replay(task, args)
        if not args.no_spike_costs:
            _print_spikes(task, args)


def _load(name: str) -> Any:
    """A sibling benchmark module, loaded by path."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _print_spikes(task: Task, args: argparse.Namespace) -> None:
    """The spike rows (benchmarks/monitor_spikes.py)."""
    _load("monitor_spikes").print_spikes(task, Runner, args.rounds, args.steps)


def _print_replay(task: Task, args: argparse.Namespace) -> None:
    c = replay_costs(task, args)
    print(
        f"    incidents: a good step with replay=True {c['step']:.3f}x replay=False "
        f"[{c['step_range'][0]:.2f}-{c['step_range'][1]:.2f}] (wall {c['step_wall']:.3f}x) "
        f"{'ok' if c['step'] <= TARGET_REPLAY_STEP else 'MISSED'} (its own work, wall "
        f"{c['own_ms']:.2f} ms per step: {c['own']:.4f}x a plain step); held at the step: "
        f"{c['held']:,} B more (bound: inputs {c['inputs']:,} B + output gradients "
        f"{c['out_grads']:,} B = {c['bound']:,} B: "
        f"{'ok' if c['held'] <= c['bound'] + 8192 else 'MISSED'}); the replay "
        f"{c['replay_ms']:.1f} ms of CPU = {c['replay']:.2f}x a plain step "
        f"{'ok' if c['replay'] <= TARGET_REPLAY else 'MISSED'}",
        flush=True,
    )


if __name__ == "__main__":
    sys.setrecursionlimit(10000)
    main()
