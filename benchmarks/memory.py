"""Checkpoint-plan benchmark (issue #22): predicted vs measured activation memory.

    .venv/bin/python benchmarks/memory.py            # CNN, GPT-2, Llama (transformers)
    .venv-214/bin/python benchmarks/memory.py        # + torchvision ResNet-18
    .venv/bin/python benchmarks/memory.py --meta-7b  # + a Llama-7B-shaped model on meta
    .venv/bin/python benchmarks/memory.py --step [--step-7b]   # the whole step's peak

For each model: the baseline (activation bytes held at the end of forward + loss, predicted by
``gs.activation_report`` and measured by ``gs.measure_forward``, i.e. the profiler's CPU
allocations made by the forward and still held at its end, outputs apart), then the plans at
50% and 25% of the baseline and the "checkpoint every block" rule, each applied with real
non-reentrant checkpoints and measured: predicted, measured, error, recompute FLOPs, and
whether the measured bytes fit the budget. "plan @ that" asks the planner for the every-block
rule's own figure with no module freeing more than the largest block (``max_recompute``), so
its backward recomputes no more at once than the rule's. A budget no plan reaches is printed
as a miss with the smallest reachable figure. The planner never sees the measurements.
"""

from __future__ import annotations

import argparse
import resource
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import gradscope as gs
from gradscope.memory.activations import apply_checkpoints

warnings.filterwarnings("ignore")

Model = tuple[nn.Module, tuple[Any, ...], Callable[[Any], Any]]


class ConvBlock(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(torch.relu(self.bn(self.conv1(x))))


class CNN(nn.Module):
    def __init__(self, c: int = 32, n: int = 6) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.blocks = nn.Sequential(*[ConvBlock(c) for _ in range(n)])
        self.head = nn.Linear(c, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(torch.tanh(self.stem(x))).mean((2, 3)))


def cnn() -> Model:
    return CNN(), (torch.randn(16, 3, 32, 32),), lambda out: out.pow(2).mean()


def gpt2() -> Model:
    import transformers as tf

    cfg = tf.GPT2Config(n_layer=6, n_embd=256, n_head=8, n_positions=256, vocab_size=2048,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    return (tf.GPT2LMHeadModel(cfg), (torch.randint(0, 2048, (4, 128)),),
            lambda out: out.logits.pow(2).mean())


def llama() -> Model:
    import transformers as tf

    cfg = tf.LlamaConfig(num_hidden_layers=6, hidden_size=256, intermediate_size=688,
                         num_attention_heads=8, num_key_value_heads=4, vocab_size=2048,
                         max_position_embeddings=256, use_cache=False)
    return (tf.LlamaForCausalLM(cfg), (torch.randint(0, 2048, (4, 128)),),
            lambda out: out.logits.float().pow(2).mean())


def resnet() -> Model:
    import torchvision

    return (torchvision.models.resnet18(weights=None, num_classes=10),
            (torch.randn(8, 3, 112, 112),), lambda out: out.pow(2).mean())


def mib(n: int) -> str:
    return f"{n / 2**20:8.2f}"


def row(name: str, predicted: int, measured: int, flops: int, n: int, budget: int | None) -> str:
    err = 100.0 * (predicted - measured) / measured if measured else 0.0
    fit = "" if budget is None else ("fits" if measured <= budget else "OVER")
    return (f"  {name:<14} {mib(predicted)} {mib(measured)} {err:+6.2f}% "
            f"{flops / 1e9:9.3f} {n:4d}  {fit}")


def bench(label: str, make: Callable[[], Model]) -> None:
    torch.manual_seed(0)
    try:
        model, inputs, loss_fn = make()
    except ImportError as exc:
        print(f"{label}: skipped ({exc})")
        return
    start = time.perf_counter()
    rep = gs.activation_report(model, *inputs, loss_fn=loss_fn)
    t_report = time.perf_counter() - start
    base = gs.measure_forward(model, *inputs, loss_fn=loss_fn)
    print(f"{label}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
          f"{len(rep.rows)} modules, report {t_report:.2f} s")
    print(f"  {'':<14} {'pred MiB':>8} {'meas MiB':>8} {'error':>7} {'GFLOP':>9} {'mods':>4}")
    print(row("baseline", rep.total, base, 0, 0, None))
    for share in ("50%", "25%"):
        start = time.perf_counter()
        try:
            plan = rep.plan(share)
        except gs.BudgetError:
            low = rep.smallest()
            print(f"  plan {share:<9} MISS: no plan reaches {share} of the baseline; the smallest "
                  f"reachable is {mib(low.predicted).strip()} MiB "
                  f"({100 * low.predicted / rep.total:.0f}%)")
            continue
        t_plan = time.perf_counter() - start
        with apply_checkpoints(model, plan.modules):
            measured = gs.measure_forward(model, *inputs, loss_fn=loss_fn)
        print(row(f"plan {share}", plan.predicted, measured, plan.recompute_flops,
                  len(plan.modules), plan.budget) + f"  (planned in {t_plan * 1e3:.0f} ms)")
    blocks = rep.blocks()
    if blocks:
        every = rep.evaluate(blocks)
        with apply_checkpoints(model, every.modules):
            measured = gs.measure_forward(model, *inputs, loss_fn=loss_fn)
        print(row("every block", every.predicted, measured, every.recompute_flops,
                  len(every.modules), None))
        try:
            # the same end-of-forward figure, no module larger than the largest block
            same = rep.plan(every.predicted, max_recompute=every.recompute_bytes)
            with apply_checkpoints(model, same.modules):
                measured = gs.measure_forward(model, *inputs, loss_fn=loss_fn)
            print(row("plan @ that", same.predicted, measured, same.recompute_flops,
                      len(same.modules), same.budget)
                  + f"  ({100 * same.recompute_flops / max(every.recompute_flops, 1):.0f}% "
                  "of every block's recompute)")
        except gs.BudgetError:
            pass
    print()


def bench_step(label: str, make: Callable[[], Model]) -> None:
    """The whole step's peak (issue 31): ``gs.step_memory`` vs ``measure_step`` (the
    profiler), first and steady-state step, SGD with momentum and AdamW."""
    from gradscope.memory.step import measure_step

    for name in ("sgd", "adamw"):
        torch.manual_seed(0)
        try:
            model, inputs, loss_fn = make()
        except ImportError as exc:
            print(f"{label}: skipped ({exc})")
            return
        opt = (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9) if name == "sgd"
               else torch.optim.AdamW(model.parameters()))
        start = time.perf_counter()
        mem = gs.step_memory(model, *inputs, optimizer=opt, loss_fn=loss_fn)
        took = time.perf_counter() - start
        first, steady, _ = measure_step(model, *inputs, optimizer=opt, loss_fn=loss_fn)
        print(f"  {label:<28} {name:<5} first {mib(mem.first_step)} / {mib(first)} MiB "
              f"({100 * (mem.first_step - first) / first:+.2f}%), steady "
              f"{mib(mem.steady_state)} / {mib(steady)} MiB "
              f"({100 * (mem.steady_state - steady) / steady:+.2f}%), peak in the "
              f"{mem.peak_phase}; recorded in {took:.1f} s")


def step_7b() -> None:
    """A Llama-7B-shaped model with AdamW at 1 x 2048 tokens on meta: the step's peak, the
    time, the process's memory, against the floor params + grads + two Adam states."""
    import transformers as tf

    cfg = tf.LlamaConfig(num_hidden_layers=32, hidden_size=4096, intermediate_size=11008,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                         max_position_embeddings=4096, use_cache=False)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with torch.device("meta"):
        model = tf.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 32000, (1, 2048), device="meta")
    opt = torch.optim.AdamW(model.parameters())
    mem = gs.step_memory(model, ids, optimizer=opt, loss_fn=lambda out: out.logits.float().mean())
    took = time.perf_counter() - start
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"Llama-7B shape, AdamW, 1 x 2048 on meta: {took:.1f} s, max RSS grew {grown:.0f} MiB, "
          f"{mem.events} events")
    print(f"  {mem.summary()}")
    print(f"  floor (params + grads + 2 states): {4 * params / 2**30:.2f} GiB; "
          f"peak {mem.peak / 2**30:.2f} GiB")


def meta_7b() -> None:
    import transformers as tf

    cfg = tf.LlamaConfig(num_hidden_layers=32, hidden_size=4096, intermediate_size=11008,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                         max_position_embeddings=4096, use_cache=False)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with torch.device("meta"):
        model = tf.LlamaForCausalLM(cfg)
    ids = torch.randint(0, 32000, (1, 2048), device="meta")
    rep = gs.activation_report(model, ids, loss_fn=lambda out: out.logits.float().mean())
    t_report = time.perf_counter() - start
    start = time.perf_counter()
    every = rep.evaluate(rep.blocks())
    plan = rep.plan("8GiB", max_recompute=every.recompute_bytes)
    t_plan = time.perf_counter() - start
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
    print(f"Llama-7B shape on meta ({sum(p.numel() for p in model.parameters()) / 1e9:.2f}B "
          f"params, batch 1 x 2048 tokens, float32): build+report {t_report:.1f} s, "
          f"plan {t_plan:.2f} s, max RSS grew {grown:.0f} MiB")
    print(f"  baseline {rep.total / 2**30:.2f} GiB; plan for 8 GiB: {len(plan.modules)} modules, "
          f"{plan.predicted / 2**30:.2f} GiB, {plan.recompute_flops / 1e12:.2f} TFLOP; every "
          f"block: {every.predicted / 2**30:.2f} GiB, {every.recompute_flops / 1e12:.2f} TFLOP")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meta-7b", action="store_true")
    parser.add_argument("--step", action="store_true",
                        help="the whole step's peak (step_memory vs the profiler) instead")
    parser.add_argument("--step-7b", action="store_true",
                        help="with --step: also a Llama-7B-shaped step with AdamW on meta")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, CPU, {torch.get_num_threads()} threads\n")
    models = (("CNN (6 residual conv blocks)", cnn), ("GPT-2 (6 layers, d=256)", gpt2),
              ("Llama (6 layers, d=256)", llama), ("ResNet-18 (torchvision)", resnet))
    if args.step:
        print("step peaks: predicted / measured (profiler)")
        for label, make in models:
            bench_step(label, make)
        if args.step_7b:
            step_7b()
        return
    for label, make in models:
        bench(label, make)
    if args.meta_7b:
        meta_7b()


if __name__ == "__main__":
    main()
