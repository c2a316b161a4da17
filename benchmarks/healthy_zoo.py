"""Alerts on healthy training of outside models: the count a user would see, and the count the
rules before issue 33's seventh round give on the same logs.

    .venv-2.14/bin/python benchmarks/healthy_zoo.py [--steps 40] [--models convnext bert ...]

Each model is built from its config with random weights (nothing downloaded) and trained from
seed 0 on random batches (8 images of 64x64 and 10 random labels, or 8 sequences of 32 random
tokens as their own labels) under a linear warm-up over 10 steps: AdamW (lr 3e-4, weight decay
0.05) or SGD (lr 0.05, momentum 0.9), every step logged with its loss and with module and
activation statistics on. Nothing in such a run is pathological: every alert is a false one.
"Before" replays the same log (``alerts(mon.log)``) with the four guards taken out: no
significance gate on exploding (``SPIKE_SIGNIFICANT = 0``), each bias judged alone, a window
whose median is kept five steps as soon as it holds five values, and the vanishing level 1e-7
under every optimizer (now AdamW's eps, 1e-8).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

import gradscope as gs
from gradscope.monitor import alerts as rules

Task = tuple[torch.nn.Module, Callable[[], Any], Callable[..., Any] | None]


def _vision(model: torch.nn.Module) -> Task:
    def batch() -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        return (torch.randn(8, 3, 64, 64),), torch.randint(0, 10, (8,))

    return model, batch, lambda out, y: torch.nn.functional.cross_entropy(out, y)


def _text(model: torch.nn.Module) -> Task:
    def batch() -> tuple[tuple[()], dict[str, torch.Tensor]]:
        ids = torch.randint(0, 512, (8, 32))
        return (), {"input_ids": ids, "labels": ids}

    return model, batch, None


def build(name: str) -> tuple[Task, str]:
    import timm
    import torchvision
    import transformers as tf

    if name == "resnet18-zero-init":
        return _vision(torchvision.models.resnet18(num_classes=10, zero_init_residual=True)), "sgd"
    if name == "mobilenet-v3":
        return _vision(torchvision.models.mobilenet_v3_small(num_classes=10)), "sgd"
    if name == "efficientnet-b0":
        return _vision(torchvision.models.efficientnet_b0(num_classes=10)), "adamw"
    if name in ("convnext", "convnext-sgd"):
        model = timm.create_model("convnext_atto", pretrained=False, num_classes=10)
        return _vision(model), "sgd" if name == "convnext-sgd" else "adamw"
    if name in ("deit3", "vit-tiny"):
        arch = "deit3_small_patch16_224" if name == "deit3" else "vit_tiny_patch16_224"
        model = timm.create_model(arch, pretrained=False, num_classes=10, img_size=64)
        return _vision(model), "adamw"
    if name == "gpt2":
        return _text(tf.GPT2LMHeadModel(tf.GPT2Config(
            n_layer=4, n_embd=128, n_head=4, vocab_size=512, n_positions=64,
            bos_token_id=0, eos_token_id=0))), "adamw"
    if name == "bert":
        return _text(tf.BertForMaskedLM(tf.BertConfig(
            num_hidden_layers=4, hidden_size=128, num_attention_heads=4,
            intermediate_size=256, vocab_size=512))), "adamw"
    raise SystemExit(f"unknown model {name!r}")


MODELS = ["resnet18-zero-init", "mobilenet-v3", "efficientnet-b0", "convnext", "convnext-sgd",
          "deit3", "vit-tiny", "gpt2", "bert"]


def before(log: Any) -> list[gs.Alert]:
    saved = rules.SPIKE_SIGNIFICANT, rules._weight_of, rules._SPIKE_WINDOW
    rules.SPIKE_SIGNIFICANT, rules._weight_of, rules._SPIKE_WINDOW = 0.0, lambda n: n, 5
    try:  # and the vanishing level 1e-7 whatever the optimizer
        return rules.alerts(log, dataclasses.replace(log.thresholds, vanish=1e-7))
    finally:
        rules.SPIKE_SIGNIFICANT, rules._weight_of, rules._SPIKE_WINDOW = saved


def run(name: str, steps: int) -> tuple[int, int]:
    torch.manual_seed(0)
    (model, batch, loss_of), kind = build(name)
    model.train()
    opt: torch.optim.Optimizer = (
        torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.05) if kind == "adamw"
        else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 10))
    t0 = time.perf_counter()
    with gs.GradMonitor(model, optimizer=opt, modules=True, activations=True) as mon:
        for _ in range(steps):
            args, y = batch()
            opt.zero_grad()
            loss = model(*args, **y).loss if loss_of is None else loss_of(model(*args), y)
            mon.observe_loss(loss)
            loss.backward()
            opt.step()
            sched.step()
    old = before(mon.log)
    now = collections.Counter(a.kind for a in mon.alerts)
    was = collections.Counter(a.kind for a in old)
    print(f"{name:19} {kind:5} {steps} steps {time.perf_counter() - t0:5.1f} s  "
          f"alerts {dict(now) or 'none'}; before {dict(was) or 'none'}")
    for a in mon.alerts:
        print(f"    {a.kind}: {a.message[:110]}")
    return len(mon.alerts), len(old)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s)")
    totals = [run(name, args.steps) for name in args.models]
    print(f"in all: {sum(n for n, _ in totals)} alerts, {sum(o for _, o in totals)} before")


if __name__ == "__main__":
    main()
