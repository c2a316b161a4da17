"""Course: higher-order gradients and the Hessian-vector product.

For f(w1, w2) = w1**2 * sin(w2) at w = (1, pi/2) and v = (0.5, 1): the gradient is
(2 w1 sin w2, w1**2 cos w2) = (2, 0), the Hessian [[2, 0], [0, -1]], and the Hessian-vector
product H v = (1, -1). It takes two grad calls and never builds H: with create_graph=True the
first backward records its own operations, so the gradient has a graph (drawn below) that the
second backward differentiates.

    python samples/course/higher_order.py
"""

from __future__ import annotations

import math

import torch
from rich.console import Console

import gradscope as gs


def f(w: torch.Tensor) -> torch.Tensor:
    return w[0] ** 2 * torch.sin(w[1])


def main() -> dict[str, object]:
    out = Console(width=100, highlight=False)
    w = torch.tensor([1.0, math.pi / 2], requires_grad=True)
    v = torch.tensor([0.5, 1.0])
    (grad_f,) = torch.autograd.grad(f(w), w, create_graph=True)
    out.print(f"grad f = {grad_f.tolist()}")
    graph = gs.trace(grad_f, params={"w": w})
    out.print("the gradient's own graph (built by create_graph=True):")
    out.print(gs.render_tree(graph))
    (hvp,) = torch.autograd.grad(torch.dot(grad_f, v), w)
    out.print(f"H v = {hvp.tolist()}  (expected [1.0, -1.0])")
    hessian = torch.autograd.functional.hessian(f, w.detach())
    out.print(f"full Hessian for comparison: {hessian.tolist()}")
    return {"grad_f": grad_f.detach(), "hvp": hvp, "graph": graph, "w": w.detach(), "v": v}


if __name__ == "__main__":
    main()
