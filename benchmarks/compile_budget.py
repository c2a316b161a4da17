"""torch.compile's ``activation_memory_budget`` against ``gs.plan_checkpoints(target="peak")``
(issue 31 item 5): the measured peak of a whole AdamW training step and its time, per budget.

    .venv/bin/python benchmarks/compile_budget.py                  # budgets 0.1, 0.2, ..., 1.0
    .venv-2.14/bin/python benchmarks/compile_budget.py --out docs  # + table (.md) and plot (.png)
    .venv/bin/python benchmarks/compile_budget.py --budgets 0.5 --backend inductor

The model is the step-memory tests' GPT-2 (transformers, 3 layers, d=64, 4 heads, vocab 256,
no dropout) at a batch of 8 x 64 tokens, where the activations are most of the step's peak;
the loss is ``logits.pow(2).mean()``, the optimizer AdamW. A step is the forward, the loss, the
backward, ``optimizer.step()`` and ``zero_grad(set_to_none=True)``.

For each budget ``b``:
- **compile**: a fresh copy of the model, ``torch.compile(copy, backend=...)`` under
  ``torch._functorch.config.activation_memory_budget = b`` (the min-cut partitioner's budget:
  1.0 is its default choice of saved tensors, 0.0 the least memory it can reach by
  recomputing). The default backend is ``aot_eager_decomp_partition`` (AOTAutograd with the
  decompositions and the min-cut partitioner, eager kernels; no C++ compiler in the loop);
  ``--backend inductor`` (CPU inductor) runs here too, slower to compile. The compile and a
  warm-up step run first; the measurement and the timing run with
  ``torch._dynamo.config.error_on_recompile``, so no compilation is measured.
- **ours**: ``gs.plan_checkpoints(model, x, budget=P0 - (1 - b) * A, target="peak",
  optimizer=...)``, where ``P0`` is ``gs.step_memory``'s predicted eager step peak and ``A``
  ``gs.activation_report``'s activations held at the end of the forward: the step peak the
  eager step would have if only a share ``b`` of its activations were held. A budget no plan
  reaches is a miss (``BudgetError``); the row then measures the smallest plan of the report
  (``rep.smallest()``), marked ``miss``.
- **measured peak**: ``measure_step`` (``gradscope.memory.step``): the profiler's CPU
  allocation and free events over the step (the running sum's maximum, plus what was live
  before), the steady state (second step: AdamW's state exists); the same for both sides.
- **step time**: ``--repeat`` rounds, each one eager step without a plan, one compiled step
  and one eager step with the plan, in turn (after a warm-up step each); a side's figure is
  the median over the rounds of its time / the plain eager step's in the same round.

Nothing here is a test: the figures depend on the machine's load; the ratios are what to read.
"""

from __future__ import annotations

import argparse
import copy
import gc
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch._functorch.config
from torch import nn

import gradscope as gs
from gradscope.memory.activations import apply_checkpoints
from gradscope.memory.step import measure_step
from gradscope.output.files import atomic_path

warnings.filterwarnings("ignore")

BUDGETS = tuple(round(0.1 * k, 1) for k in range(1, 11))


def gpt2(batch: int = 8, tokens: int = 64) -> tuple[nn.Module, torch.Tensor]:
    """The step-memory tests' GPT-2 config (tests/memory/test_memplan.py), at a larger batch."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.GPT2Config(n_layer=3, n_embd=64, n_head=4, n_positions=64, vocab_size=256,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    return tf.GPT2LMHeadModel(cfg), torch.randint(0, 256, (batch, tokens))


def loss_fn(out: Any) -> torch.Tensor:
    return out.logits.pow(2).mean()


def adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3)


def step_fn(model: nn.Module, x: torch.Tensor, opt: torch.optim.Optimizer) -> Callable[[], None]:
    def step() -> None:
        loss_fn(model(x)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def peak_of(model: nn.Module, x: torch.Tensor, opt: torch.optim.Optimizer) -> int:
    """The measured steady-state step peak (profiler), restored afterwards."""
    gc.collect()
    return measure_step(model, x, optimizer=opt, loss_fn=loss_fn)[1]


def interleaved(steps: list[Callable[[], None]], repeat: int) -> list[float]:
    """Each of ``steps`` run in turn (the order rotating), ``repeat`` rounds: the median time of
    the first, and for the others the median over the rounds of their time / the first's in
    the same round (a burst of load from elsewhere hits the steps of one round alike)."""
    times: list[list[float]] = [[] for _ in steps]
    for r in range(repeat):
        for k in range(len(steps)):  # the order turns each round: none always runs first
            i = (r + k) % len(steps)
            t0 = time.perf_counter()
            steps[i]()
            times[i].append(time.perf_counter() - t0)
    ratios = [statistics.median(t / e for t, e in zip(ts, times[0], strict=True))
              for ts in times[1:]]
    return [statistics.median(times[0]), *ratios]


@dataclass
class Row:
    budget: float
    compile_peak: int
    compile_time: float  # median step time / the eager step's, in the same rounds
    graphs: int
    asked: int
    predicted: int
    ours_peak: int
    ours_time: float
    modules: int
    recompute_flops: int
    miss: bool
    eager_ms: float


def compiled_side(model: nn.Module, x: torch.Tensor, budget: float, backend: str
                  ) -> tuple[nn.Module, torch.optim.Optimizer, int, float]:
    """A compiled copy at ``budget`` after its compile and one warm-up step: (module,
    optimizer, graphs compiled, compile seconds)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    twin = copy.deepcopy(model)
    opt = adamw(twin)
    t0 = time.perf_counter()
    with torch._functorch.config.patch(activation_memory_budget=budget):
        compiled: Any = torch.compile(twin, backend=backend)
        step_fn(compiled, x, opt)()  # compiles the forward, partitions, runs the backward
    took = time.perf_counter() - t0
    graphs = int(counters["stats"].get("unique_graphs", 0))
    return compiled, opt, graphs, took


class Peaks:
    """``gs.step_memory`` for the planner, each plan's figure computed once.

    ``plan_checkpoints(target="peak")`` runs its candidate plans (the same for every budget)
    through ``step_memory`` until one fits; the same model, inputs and fresh AdamW give the
    same figure each time, so the benchmark serves a repeated candidate from this cache (the
    planner's choice is unchanged: it sees the very ``StepMemory`` it would compute). The
    cache also gives, on a miss, the lowest peak the planner found."""

    def __init__(self) -> None:
        from gradscope.memory import checkpoint_peak as memplan_peak

        self.module = memplan_peak
        self.real = memplan_peak.step_memory
        self.seen: dict[tuple[str, ...], Any] = {}

    def __call__(self, model: nn.Module, *inputs: Any, plan: Any = None, **kw: Any) -> Any:
        key = tuple(getattr(plan, "modules", plan) or ())
        if key not in self.seen:
            self.seen[key] = self.real(model, *inputs, plan=plan, **kw)
        return self.seen[key]

    def __enter__(self) -> Peaks:
        self.module.step_memory = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.module.step_memory = self.real


def ours_side(model: nn.Module, x: torch.Tensor, rep: Any, base_peak: int, budget: float,
              peaks: Peaks) -> tuple[Any, int, int, bool]:
    """(the plan's modules, the step-peak budget asked for, the predicted step peak, whether
    it was a miss: then the plan the planner found with the lowest step peak)."""
    asked = int(base_peak - (1.0 - budget) * rep.total)
    opt = adamw(model)
    with peaks:
        try:
            plan = gs.plan_checkpoints(model, x, budget=asked, loss_fn=loss_fn, report=rep,
                                       target="peak", optimizer=opt)
            return plan.modules, asked, plan.predicted, False
        except gs.BudgetError:
            modules, mem = min(peaks.seen.items(), key=lambda kv: kv[1].peak)
            return modules, asked, mem.peak, True


def run(budgets: tuple[float, ...], backend: str, repeat: int, batch: int, tokens: int,
        log: Callable[[str], None] = print) -> tuple[list[Row], dict[str, Any]]:
    import torch._dynamo

    model, x = gpt2(batch, tokens)
    pristine = copy.deepcopy(model.state_dict())
    rep = gs.activation_report(model, x, loss_fn=loss_fn)
    base = gs.step_memory(model, x, optimizer=adamw(model), loss_fn=loss_fn)
    eager_peak = peak_of(model, x, adamw(model))
    info = {"torch": torch.__version__, "backend": backend, "threads": torch.get_num_threads(),
            "params": sum(p.numel() for p in model.parameters()), "batch": (batch, tokens),
            "activations": rep.total, "predicted_peak": base.peak, "eager_peak": eager_peak,
            "peak_phase": base.peak_phase, "compile_s": []}
    log(f"eager, no plan: step peak {mib(eager_peak)} MiB measured ({mib(base.peak)} "
        f"predicted, in the {base.peak_phase}), activations {mib(rep.total)} MiB")
    rows: list[Row] = []
    peaks = Peaks()
    for b in budgets:
        compiled, copt, graphs, took = compiled_side(model, x, b, backend)
        info["compile_s"].append(took)
        t0 = time.perf_counter()
        modules, asked, predicted, miss = ours_side(model, x, rep, base.peak, b, peaks)
        planned = time.perf_counter() - t0
        plain, planned_model = copy.deepcopy(model), model
        handle = apply_checkpoints(planned_model, modules) if modules else None
        try:
            opt = adamw(planned_model)
            with torch._dynamo.config.patch(error_on_recompile=True), \
                    torch._functorch.config.patch(activation_memory_budget=b):
                c_peak = peak_of(compiled, x, copt)
                o_peak = peak_of(planned_model, x, opt)
                steps = [step_fn(plain, x, adamw(plain)), step_fn(compiled, x, copt),
                         step_fn(planned_model, x, opt)]
                steps[0]()
                steps[2]()
                e_s, c_s, o_s = interleaved(steps, repeat)  # eager seconds, two ratios
        finally:
            if handle is not None:
                handle.remove()
            model.load_state_dict(pristine)
        row = Row(b, c_peak, c_s, graphs, asked, predicted, o_peak, o_s,
                  len(modules), rep.flops(list(modules)) if modules else 0, miss, 1e3 * e_s)
        rows.append(row)
        log(line(row) + f"   (compiled in {took:.1f} s, planned in {planned:.1f} s)")
        del compiled, copt, plain
    torch._dynamo.reset()
    info["eager_ms"] = statistics.median(r.eager_ms for r in rows)
    return rows, info


def mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def line(r: Row) -> str:
    return (f"budget {r.budget:.1f}: compile {mib(r.compile_peak)} MiB {r.compile_time:.2f}x "
            f"({r.graphs} graphs) | ours {mib(r.ours_peak)} MiB {r.ours_time:.2f}x, asked "
            f"{mib(r.asked)} predicted {mib(r.predicted)}, {r.modules} modules"
            + (" (miss: the lowest peak found)" if r.miss else "")
            + f" | eager {r.eager_ms:.1f} ms")


def table(rows: list[Row], info: dict[str, Any]) -> str:
    head = (f"torch {info['torch']}, CPU, {info['threads']} threads; GPT-2 (3 x 64, "
            f"{info['params'] / 1e6:.2f}M parameters), batch {info['batch'][0]} x "
            f"{info['batch'][1]} tokens, AdamW, steady-state step; compile backend "
            f"`{info['backend']}`. Eager without a plan: peak {mib(info['eager_peak'])} MiB "
            f"(activations {mib(info['activations'])} MiB), {info['eager_ms']:.1f} ms per step "
            "(median over the rows). Times are step time / the eager step's without a plan, "
            "the median over rounds of the three run in turn.")
    out = [head, "",
           "| budget | compile: peak MiB | compile: time | ours: peak asked MiB | "
           "ours: predicted MiB | ours: peak MiB | ours: time | ours: modules | "
           "lower peak | faster |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lower = "ours" if r.ours_peak < r.compile_peak else (
            "compile" if r.compile_peak < r.ours_peak else "tie")
        faster = "ours" if r.ours_time < r.compile_time else "compile"
        out.append(f"| {r.budget:.1f} | {mib(r.compile_peak)} | {r.compile_time:.2f}x | "
                   f"{mib(r.asked)} | {mib(r.predicted)}{' (miss)' if r.miss else ''} | "
                   f"{mib(r.ours_peak)} | {r.ours_time:.2f}x | {r.modules} | {lower} | "
                   f"{faster} |")
    return "\n".join(out) + "\n"


def plot(rows: list[Row], info: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    xs = [r.budget for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    try:
        left.plot(xs, [r.compile_peak / 2**20 for r in rows], "o-",
                  label=f"torch.compile ({info['backend']})")
        left.plot(xs, [r.ours_peak / 2**20 for r in rows], "s-",
                  label='plan_checkpoints(target="peak")')
        left.plot(xs, [r.asked / 2**20 for r in rows], ":", color="grey",
                  label="our budget: P0 - (1 - b) x activations")
        left.axhline(info["eager_peak"] / 2**20, color="black", linestyle="--", linewidth=1,
                     label="eager, no plan")
        misses = [r for r in rows if r.miss]
        if misses:
            left.scatter([r.budget for r in misses], [r.ours_peak / 2**20 for r in misses],
                         marker="x", s=80, color="red", zorder=4,
                         label="no plan fits: the lowest found")
        left.set(xlabel="activation_memory_budget", ylabel="measured step peak (MiB)",
                 title="peak of an AdamW step (profiler)")
        left.legend(fontsize=7)
        right.plot(xs, [r.compile_time for r in rows], "o-", label="torch.compile")
        right.plot(xs, [r.ours_time for r in rows], "s-", label="ours (eager + checkpoints)")
        right.axhline(1.0, color="black", linestyle="--", linewidth=1, label="eager, no plan")
        right.set(xlabel="activation_memory_budget", ylabel="step time / eager step time",
                  title="step time (interleaved medians, ratio)", ylim=(0, None))
        right.legend(fontsize=7)
        fig.suptitle(f"GPT-2 3 x 64, batch {info['batch'][0]} x {info['batch'][1]}, "
                     f"torch {info['torch']}, CPU", fontsize=9)
        fig.tight_layout()
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
    finally:
        plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budgets", type=float, nargs="+", default=list(BUDGETS))
    parser.add_argument("--backend", default="aot_eager_decomp_partition",
                        help="torch.compile backend with the min-cut partitioner "
                             "(aot_eager_decomp_partition or inductor)")
    parser.add_argument("--repeat", type=int, default=11, help="timed rounds")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None,
                        help="a folder: writes compile-budget.md and compile-budget.png")
    args = parser.parse_args(argv)
    if not all(0.0 <= b <= 1.0 for b in args.budgets):
        parser.error("budgets are between 0 and 1")
    if not hasattr(torch._functorch.config, "activation_memory_budget"):
        print(f"torch {torch.__version__} has no activation_memory_budget")
        return 2
    start = time.perf_counter()
    rows, info = run(tuple(args.budgets), args.backend, args.repeat, args.batch, args.tokens)
    text = table(rows, info)
    print()
    print(text)
    print(f"in {time.perf_counter() - start:.0f} s (compiles {sum(info['compile_s']):.0f} s)")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        with atomic_path(args.out / "compile-budget.md") as tmp:
            tmp.write_text(text)
        plot(rows, info, args.out / "compile-budget.png")
        print(f"wrote {args.out / 'compile-budget.md'} and {args.out / 'compile-budget.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
