"""Course: the autograd engine's backward walk.

z = (x @ w).mean() with w a leaf that requires grad and x an input that does not: backward
starts at z.grad_fn (MeanBackward0), hands its gradient to MmBackward0, which computes the
gradient for w only, and AccumulateGrad adds it into w.grad; x.grad stays None. When a tensor
is used twice, the engine adds the two gradients before going further.

    python samples/course/engine_backward.py
"""

from __future__ import annotations

import torch
from rich.console import Console

import gradscope as gs


def main() -> dict[str, object]:
    out = Console(width=100, highlight=False)
    torch.manual_seed(0)
    w = torch.randn(5, 3, requires_grad=True)
    x = torch.randn(1, 5)
    z = (x @ w).mean()
    with gs.record_backward(z, params={"w": w}) as rec:
        z.backward()
    order = [s.name for s in rec.steps]
    out.print("engine order:", " -> ".join(order))
    for step in rec.steps:
        norms = [None if g is None else round(g.norm, 4) for g in step.grad_inputs]
        out.print(f"  {step.name}: gradient norms it passed on {norms}")
    out.print(f"x.grad is {x.grad}; w.grad norm {w.grad.norm():.4f}")
    out.print(gs.render_tree(rec.graph))

    # a diamond: y is used twice, so two gradients meet at its node and are summed
    a = torch.tensor([1.0, 2.0], requires_grad=True)
    y = a * a
    loss = (y.sin() + y.cos()).sum()
    with gs.record_backward(loss, params={"a": a}) as diamond:
        loss.backward()
    out.print("diamond order:", " -> ".join(s.name for s in diamond.steps))
    return {"order": order, "w_grad": w.grad.clone(), "x_grad": x.grad,
            "diamond": [s.name for s in diamond.steps], "a_grad": a.grad.clone()}


if __name__ == "__main__":
    main()
