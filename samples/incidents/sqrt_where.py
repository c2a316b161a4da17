"""Planted bug: ``sqrt`` under a ``where`` (the forward is finite, the backward is NaN).

At step 3 one input sits exactly on a prototype: its squared distance is 0, the ``where``
picks 0.0, but ``sqrt``'s backward divides by 2 * sqrt(0) and multiplies by the zero the
``where`` sent back: 0 / 0 = NaN.

    gradscope report samples/incidents/sqrt_where.py --steps 5
"""

import torch
from torch import nn

torch.manual_seed(0)
BAD_STEP = 3


class Distance(nn.Module):
    def __init__(self, d: int, k: int) -> None:
        super().__init__()
        self.prototypes = nn.Parameter(torch.randn(k, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d2 = (x[:, None, :] - self.prototypes[None]).pow(2).sum(-1)
        return torch.where(d2 > 0, d2.sqrt(), 0.0)  # planted: sqrt's backward at 0 is NaN


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dist = Distance(6, 5)
        self.head = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dist(x))


model = Net()
example_input = torch.randn(16, 6)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output, target)


def batches():
    g = torch.Generator().manual_seed(1)
    step = 0
    while True:
        x = torch.randn(16, 6, generator=g)
        if step == BAD_STEP:
            x[0] = model.dist.prototypes.detach()[2]  # exactly on a prototype
        yield x, torch.randint(0, 3, (16,), generator=g)
        step += 1


def optimizer(params):
    return torch.optim.SGD(params, lr=1e-2)
