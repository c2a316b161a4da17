"""In-place ops that torch refuses in the forward, adapted from PyTorch's test/test_autograd.py
(test_inplace_on_view_leaf_errors, test_inplace_on_view_multiple_outputs,
test_autograd_simple_views_python): a parameter re-initialised with autograd on, a view of a
parameter changed, an output of ``split`` changed, a custom Function's view changed. The lines
marked ``# doctor: VARIANT`` are the in-place op and, for a view, the op that made it.

    gradscope doctor samples/doctor/inplace_forward.py
"""

import torch
from torch import nn

VARIANTS = ("leaf", "leaf_view", "split", "custom_view")


class Net(nn.Module):
    def __init__(self, variant: str = "leaf") -> None:
        super().__init__()
        self.variant = variant
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.variant
        if v == "leaf":
            self.fc.weight.mul_(0.5)  # doctor: leaf
            return self.fc(x)
        if v == "leaf_view":
            row = self.fc.bias[:4]  # doctor: leaf_view
            row.zero_()  # doctor: leaf_view
            return self.fc(x)
        if v == "split":
            a, b = self.fc(x).split(4, dim=1)  # doctor: split
            a += 1  # doctor: split
            return a * b
        y = AsIs.apply(self.fc(x))  # doctor: custom_view
        y.clamp_(min=0)  # doctor: custom_view
        return y


class AsIs(torch.autograd.Function):
    """Returns a view of its input: autograd forbids changing it in place."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def build(variant: str = "leaf") -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Net(variant), torch.randn(16, 8)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.pow(2).mean()


def program(watch, variant: str = "leaf") -> nn.Module:
    """One forward and backward under ``watch(model)`` (``gs.doctor``, or a no-op)."""
    model, x = build(variant)
    with watch(model):
        loss_fn(model(x)).backward()
    return model
