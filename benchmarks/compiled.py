"""Tracing a compiled model (issue #15): ratios against the same model traced eagerly, one run.

    .venv/bin/python benchmarks/compiled.py [--layers N] [--repeat N] [--backend aot_eager]

A GPT-2-style model built from a small ``transformers.GPT2Config`` (no download), compiled with
``torch.compile`` (``aot_eager`` by default: inductor compiles the same AOTAutograd graphs,
slowly on a small CPU). Best-of-N wall times of:

  eager      ``gs.trace(loss, model=model)`` of the eager model's graph
  compiled   ``gs.trace`` of the compiled model's graph: the walk, and the region expanded
             into its AOTAutograd backward graph (read once per compiled graph, then cached)
  first      the same, the first time a compiled graph is read (the FX graph parsed)

Also the node counts of both pictures: the expanded region has one node per aten op of the
backward graph, where the eager graph has one per autograd node. Compile time is not timed.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import best_of_interleaved  # noqa: E402

import gradscope as gs  # noqa: E402
from gradscope.graph import compiled  # noqa: E402


def gpt2(layers: int) -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        n_layer=layers, n_embd=128, n_head=4, vocab_size=1000, n_positions=128,
        bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    torch.manual_seed(0)
    return GPT2LMHeadModel(cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--backend", default="aot_eager")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", module="transformers")
    model = gpt2(args.layers)
    ids = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(1))

    def loss_of(fn: torch.nn.Module) -> torch.Tensor:
        return fn(input_ids=ids).logits.float().square().mean()

    eager_loss = loss_of(model)
    opt = torch.compile(model, backend=args.backend)
    with gs.scopes(opt):
        compiled_loss = loss_of(opt)  # compiles here (not timed)
    regions = [n for n in gs.trace(compiled_loss, model=opt).nodes if n.compiled is not None]

    def first() -> gs.Graph:
        compiled._REGIONS.clear()
        return gs.trace(compiled_loss, model=opt)

    t_eager, t_compiled, t_first = best_of_interleaved(
        [lambda: gs.trace(eager_loss, model=model),
         lambda: gs.trace(compiled_loss, model=opt),
         first],
        repeat=args.repeat,
    )
    g_eager = gs.trace(eager_loss, model=model)
    g_compiled = gs.trace(compiled_loss, model=opt)
    ops = sum(r.compiled.ops for r in regions)
    print(f"GPT-2 style, {args.layers} layers, n_embd 128, batch 2 x 64 tokens, "
          f"backend {args.backend}, torch {torch.__version__}")
    print(f"  eager     {len(g_eager.nodes):6d} nodes  trace {t_eager * 1e3:8.1f} ms")
    print(f"  compiled  {len(g_compiled.nodes):6d} nodes  trace {t_compiled * 1e3:8.1f} ms  "
          f"({len(regions)} region(s), {ops} aten ops)  ratio {t_compiled / t_eager:.2f}x")
    print(f"  first     {'':6s}        trace {t_first * 1e3:8.1f} ms  "
          f"(backward graph read for the first time)  ratio {t_first / t_eager:.2f}x")


if __name__ == "__main__":
    main()
