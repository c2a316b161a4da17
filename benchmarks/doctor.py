"""The autograd doctor's cost: forward + backward under ``gs.doctor(model)`` against the plain
step, measured in the same run (target: at most 5x).

Models (random weights, nothing downloaded): a GPT-2-style ``transformers.GPT2LMHeadModel``
(``GPT2Config`` 6 x 256, 4 heads, vocab 2048; batch 4 x 128 tokens, the LM loss) and
torchvision's ResNet-50 (batch 4 x 3 x 128 x 128, cross-entropy), each in train mode. Every
round times a plain step and a doctored step back to back (``--rounds`` pairs, interleaved, so
load from elsewhere on a shared machine hits both sides); the ratio is the median of the
per-pair ratios of CPU time (``time.process_time``), the wall-time ratio beside it, with the
garbage collector on (its collections caused by the doctor's records are part of the cost). Each
doctored step must give no finding (both models are healthy) and gradients bitwise those of the
plain step.

    .venv-2.14/bin/python benchmarks/doctor.py [--rounds 7] [--models gpt2 resnet50]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

import torch

import gradscope as gs

TARGET = 5.0


def gpt2() -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=6, n_embd=256, n_head=4, n_positions=256, vocab_size=2048,
                     attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0, bos_token_id=0,
                     eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    ids = torch.randint(0, 2048, (4, 128), generator=torch.Generator().manual_seed(0))
    return model, lambda m: m(input_ids=ids, labels=ids).loss


def resnet50() -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    import torchvision

    model = torchvision.models.resnet50(weights=None)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 128, 128, generator=g)
    y = torch.randint(0, 1000, (4,), generator=g)
    return model, lambda m: torch.nn.functional.cross_entropy(m(x), y)


MODELS = {"gpt2": gpt2, "resnet50": resnet50}


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    """CPU and wall seconds of ``fn()``, the garbage collector on (as in a user's program: the
    doctor's records are Python objects, and the collections they cause are its cost)."""
    gc.collect()
    c0, w0 = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - c0, time.perf_counter() - w0


def measure(name: str, rounds: int) -> dict[str, object]:
    model, loss_of = MODELS[name]()
    model.train()
    params = list(model.parameters())

    def plain() -> None:
        model.zero_grad(set_to_none=True)
        loss_of(model).backward()

    findings: list[gs.Finding] = []

    def doctored() -> None:
        model.zero_grad(set_to_none=True)
        with gs.doctor(model) as doc:
            loss_of(model).backward()
        findings.extend(doc.findings)

    plain()  # warm-up (allocator, lazy imports)
    reference = [p.grad.clone() for p in params]
    doctored()
    same = all(torch.equal(p.grad, r) for p, r in zip(params, reference))
    cpu, wall, plain_cpu, doc_cpu = [], [], [], []
    for _ in range(rounds):
        pc, pw = _timed(plain)
        dc, dw = _timed(doctored)
        cpu.append(dc / pc)
        wall.append(dw / pw)
        plain_cpu.append(pc)
        doc_cpu.append(dc)
    ratio = statistics.median(cpu)
    return {"model": name, "params": sum(p.numel() for p in params), "ratio": ratio,
            "wall": statistics.median(wall), "spread": (min(cpu), max(cpu)),
            "plain": statistics.median(plain_cpu), "doctor": statistics.median(doc_cpu),
            "findings": len(findings), "grads_equal": same}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} pairs")
    for name in args.models:
        r = measure(name, args.rounds)
        lo, hi = r["spread"]  # type: ignore[misc]
        verdict = "ok" if r["ratio"] <= TARGET else "MISSED"  # type: ignore[operator]
        print(f"{name:9s} {r['params'] / 1e6:5.1f}M params: plain {r['plain'] * 1e3:7.0f} ms "
              f"CPU, doctor {r['doctor'] * 1e3:7.0f} ms -> {r['ratio']:.2f}x "
              f"[{lo:.2f}-{hi:.2f}] (wall {r['wall']:.2f}x); findings {r['findings']}, "
              f"gradients equal {r['grads_equal']}; target <= {TARGET:g}x: {verdict}")


if __name__ == "__main__":
    main()
