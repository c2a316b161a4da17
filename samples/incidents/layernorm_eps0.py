"""Planted bug: ``LayerNorm`` with ``eps=0`` on a constant row.

A row whose features are all equal has variance 0; with ``eps=0`` the normalisation divides
0 by 0 and the forward already gives NaN (step 3 feeds a padded, constant row).

    gradscope report samples/incidents/layernorm_eps0.py --steps 5
"""

import torch
from torch import nn

torch.manual_seed(0)
BAD_STEP = 3


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(12, eps=0.0)  # planted: no epsilon
        self.fc = nn.Linear(12, 12)
        self.head = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return self.head(torch.relu(self.fc(h)))


model = Net()
example_input = torch.randn(24, 12)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output, target)


def batches():
    g = torch.Generator().manual_seed(1)
    step = 0
    while True:
        x = torch.randn(24, 12, generator=g)
        if step == BAD_STEP:
            x[7] = 0.5  # a padded row: every feature the same
        yield x, torch.randint(0, 3, (24,), generator=g)
        step += 1


def optimizer(params):
    return torch.optim.SGD(params, lr=1e-2)
