"""Double backward: a Hessian-vector product, the graph that `create_graph=True` builds.

`torch.autograd.grad(loss, w, create_graph=True)` records the backward pass itself as a graph:
its nodes (`TanhBackwardBackward0`, `MulBackward1`, ...) compute the gradient and link back to
the forward nodes whose saved tensors they use. Differentiating `g . v` through that graph gives
the Hessian-vector product H v without ever forming H.

    gradscope render samples/double_backward.py -o hvp.svg     # the second-order graph
    gradscope tree samples/double_backward.py

`record_hvp()` shows how to watch both backward passes with `gs.record_backward`.
"""

import torch

import gradscope as gs

torch.manual_seed(0)

x = torch.randn(8, 3)
w = torch.randn(3, 4, requires_grad=True)
v = torch.randn(3, 4)  # the direction of the Hessian-vector product


def loss_of(w: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ w).pow(2).mean()


def build() -> torch.Tensor:
    """The second-order output `g . v`, whose gradient with respect to w is H v."""
    (g,) = torch.autograd.grad(loss_of(w), w, create_graph=True)
    return (g * v).sum()


def record_hvp() -> tuple[gs.BackwardTrace, gs.BackwardTrace, torch.Tensor]:
    """H v, with a recorder around each backward pass: the first (create_graph=True) runs the
    forward graph's nodes; the second runs the nodes that the first one created."""
    loss = loss_of(w)
    with gs.record_backward(loss, params={"w": w}) as first:
        (g,) = torch.autograd.grad(loss, w, create_graph=True)
    gv = (g * v).sum()
    with gs.record_backward(gv, params={"w": w}) as second:
        (hv,) = torch.autograd.grad(gv, w)
    return first, second, hv


if __name__ == "__main__":  # not run by gradscope, which imports this file as a module
    first, second, hv = record_hvp()
    print(first.summary())
    print(second.summary())
    print("engine order of the second pass:", [s.name for s in second.steps])
