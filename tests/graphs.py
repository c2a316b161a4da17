"""Graph builders shared by the tests: each returns ``(outputs, params)`` on a fresh graph."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, namedtuple

import torch
from torch import nn


def mlp():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return m(torch.randn(3, 4)).pow(2).mean(), dict(m.named_parameters())


def lstm_cell():
    torch.manual_seed(0)
    cell = nn.LSTMCell(3, 5)
    h, c = torch.zeros(2, 5), torch.zeros(2, 5)
    for x in torch.randn(3, 2, 3):
        h, c = cell(x, (h, c))
    return (h, c), dict(cell.named_parameters())


def double_backward():
    x = torch.randn(4, requires_grad=True)
    y = (x**3).sum()
    (g,) = torch.autograd.grad(y, x, create_graph=True)
    v = torch.ones(4)
    return (g * v).sum(), {"x": x}


def views():
    x = torch.randn(4, 6, requires_grad=True)
    y = x.exp()
    z = y.view(6, 4).t()[1:3]  # a view of a view of a non-leaf
    return z, {"x": x}


def inplace():
    x = torch.randn(5, requires_grad=True)
    y = x * 2
    y.add_(1).mul_(3)
    z = y.sin()
    z[1:3].mul_(2)  # in-place on a view: CopySlices in the graph
    return z.sum(), {"x": x}


def tuple_dict_output():
    a = torch.randn(3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    return ({"sum": (a + b).sum(), "prod": [a * b, None, 3]}, (a.exp(),)), {"a": a, "b": b}


class Scale2(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, None, w)
        ctx.note = "kept on ctx"
        return x * w * 2

    @staticmethod
    def backward(ctx, g):
        x, _, w = ctx.saved_tensors
        return g * w * 2, g * x * 2


def custom_saved_none():
    x = torch.randn(3, requires_grad=True)
    w = torch.randn(3, requires_grad=True)
    return Scale2.apply(x.sin(), w).sum(), {"x": x, "w": w}


ALL = {
    "mlp": mlp,
    "lstm_cell": lstm_cell,
    "double_backward": double_backward,
    "views": views,
    "inplace": inplace,
    "tuple_dict_output": tuple_dict_output,
    "custom_saved_none": custom_saved_none,
}


@dataclasses.dataclass
class Out:
    logits: torch.Tensor
    aux: object = None


Pair = namedtuple("Pair", "first second")


class FakeModelOutput(OrderedDict):
    """What transformers.ModelOutput is: an OrderedDict subclass (and a dataclass)."""


def chain(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A linear chain of ``n`` ops on one leaf."""
    x = torch.randn(2, requires_grad=True)
    y = x
    for _ in range(n):
        y = y * 1.0001
    return y, x
