"""Planted bug: division by a norm that reaches 0.

The embedding is normalised as ``v / ||v||`` with no epsilon. At step 3 an all-zero input goes
through a projection without bias: ``v`` is exactly 0 and the division is 0 / 0 = NaN.

    gradscope report samples/incidents/norm_div.py --steps 5
"""

import torch
from torch import nn

torch.manual_seed(0)
BAD_STEP = 3


class Normalize(nn.Module):
    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return v / v.norm(dim=-1, keepdim=True)  # planted: no epsilon, 0 / 0 at v = 0


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 16, bias=False)
        self.normalize = Normalize()
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.normalize(self.proj(x)))


model = Net()
example_input = torch.randn(32, 8)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output, target)


def batches():
    g = torch.Generator().manual_seed(1)
    step = 0
    while True:
        x = torch.randn(32, 8, generator=g)
        if step == BAD_STEP:
            x[5] = 0.0  # an empty example: its projection is exactly 0
        yield x, torch.randint(0, 4, (32,), generator=g)
        step += 1


def optimizer(params):
    return torch.optim.SGD(params, lr=1e-2)
