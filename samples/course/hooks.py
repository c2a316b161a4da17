"""Course: tensor hooks and module hooks.

A tensor hook (``t.register_hook``) sees the gradient of t and may replace it: here one doubles
the gradient flowing back through an intermediate tensor, and x.grad doubles with it. Module
hooks see a layer's inputs and outputs in forward (``register_forward_hook``) and their
gradients in backward (``register_full_backward_hook``); the gradients the backward hook
reports are the ones gs.record_backward sees flowing out of the layer's nodes. Every
``register_*`` returns a handle; ``remove()`` it when done. Full backward hooks work by
wrapping the module's inputs and outputs in BackwardHookFunctionBackward nodes, which gs.trace
shows.

    python samples/course/hooks.py
"""

from __future__ import annotations

import torch
from rich.console import Console
from torch import nn

import gradscope as gs


def tensor_hook_demo(out: Console) -> dict[str, torch.Tensor]:
    x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x * x
    seen: list[torch.Tensor] = []
    handle = y.register_hook(lambda g: seen.append(g.clone()) or g * 2)  # record, then double
    y.sum().backward()
    handle.remove()
    out.print(f"hook saw dL/dy = {seen[0].tolist()}; x.grad = {x.grad.tolist()} (= 2 * 2x)")
    return {"seen": seen[0], "x_grad": x.grad.clone(), "x": x.detach()}


def module_hook_demo(out: Console) -> dict[str, object]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    shapes: list[tuple[int, ...]] = []
    grads: list[torch.Tensor] = []
    fwd = model[1].register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape)))
    bwd = model[2].register_full_backward_hook(lambda m, gi, go: grads.append(gi[0].clone()))
    x = torch.randn(3, 4)
    loss = model(x).pow(2).mean()
    graph = gs.trace(loss, model=model)
    hook_nodes = [n.name for n in graph.nodes if n.name.startswith("BackwardHookFunction")]
    out.print(f"forward hook on Tanh saw output shape {shapes[0]}")
    out.print(f"full backward hooks add {len(hook_nodes)} {hook_nodes[0]} nodes to the graph")
    with gs.record_backward(loss, model=model) as rec:
        loss.backward()
    fwd.remove()
    bwd.remove()
    out.print(f"backward hook on the last Linear: |grad_input| = {grads[0].norm():.4f}")
    out.print(gs.render_tree(rec.graph))
    return {"shapes": shapes, "grad_input": grads[0], "graph": graph, "rec": rec,
            "hook_nodes": hook_nodes, "model": model}


def main() -> dict[str, object]:
    out = Console(width=100, highlight=False)
    return {"tensor": tensor_hook_demo(out), "module": module_hook_demo(out)}


if __name__ == "__main__":
    main()
