"""Course: memory held by saved tensors.

Autograd keeps the tensors backward needs (inputs of Linear, outputs of Tanh...) alive from
the forward until backward frees them. gs.trace shows each node's saved tensors and their bytes:
they grow with the depth of the model, backward frees them (retain_graph=True keeps them for
a second backward), and activation checkpointing keeps only the input of each segment,
recomputing the rest in backward.

    python samples/course/saved_memory.py
"""

from __future__ import annotations

import torch
from rich.console import Console
from torch import nn
from torch.utils.checkpoint import checkpoint

import gradscope as gs


def make_model(depth: int) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[layer for _ in range(depth) for layer in (nn.Linear(64, 64), nn.Tanh())])


def held(output: torch.Tensor) -> int:
    """Bytes the graph behind ``output`` holds in saved tensors (each storage counted once)."""
    return gs.trace(output).saved_bytes()


def main() -> dict[str, object]:
    out = Console(width=100, highlight=False)
    x = torch.randn(32, 64)
    by_depth = {}
    for depth in (2, 4, 8):
        loss = make_model(depth)(x).sum()
        by_depth[depth] = held(loss)
        out.print(f"depth {depth}: saved tensors hold {gs.format_bytes(by_depth[depth])}")

    model = make_model(4)
    loss = model(x).sum()
    before = held(loss)
    loss.backward(retain_graph=True)
    retained = held(loss)
    loss.backward()  # the second backward frees them
    freed_graph = gs.trace(loss)
    n_freed = sum(s.freed for n in freed_graph.nodes for s in n.saved)
    out.print(f"before backward {gs.format_bytes(before)}, after retain_graph=True "
              f"{gs.format_bytes(retained)}, after the last backward "
              f"{gs.format_bytes(freed_graph.saved_bytes())} ({n_freed} saved tensors freed)")

    # checkpointing: each segment's graph is not kept, only its input; backward reruns it
    h = x.detach().requires_grad_(True)
    for i in range(0, len(model), 4):
        h = checkpoint(model[i:i + 4], h, use_reentrant=True)
    ckpt_graph = gs.trace(h.sum())
    checkpointed = ckpt_graph.saved_bytes()
    out.print(f"checkpointed in {len(model) // 4} segments: {gs.format_bytes(checkpointed)} "
              f"(was {gs.format_bytes(before)}); nodes: "
              f"{sorted({n.name for n in ckpt_graph.nodes if n.kind == 'custom'})}")
    out.print(gs.render_tree(freed_graph, max_lines=12))
    return {"by_depth": by_depth, "before": before, "retained": retained,
            "after": freed_graph.saved_bytes(), "n_freed": n_freed, "checkpointed": checkpointed,
            "ckpt_graph": ckpt_graph}


if __name__ == "__main__":
    main()
