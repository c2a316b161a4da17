"""Planted bug: a NaN made by the loss, outside the model.

The loss divides the squared error by the targets' standard deviation (a "scale-free" MSE).
At step 3 every target of the batch is the same: the deviation is 0, the loss is Inf, and the
gradient reaching the model's outputs is already non-finite.

    gradscope report samples/incidents/loss_nan.py --steps 5
"""

import torch
from torch import nn

torch.manual_seed(0)
BAD_STEP = 3

model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
example_input = torch.randn(16, 6)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    err = (output.squeeze(-1) - target).pow(2).mean()
    return err / target.std()  # planted: the deviation of a constant batch is 0


def batches():
    g = torch.Generator().manual_seed(1)
    step = 0
    while True:
        x = torch.randn(16, 6, generator=g)
        y = x.sum(dim=1)
        if step == BAD_STEP:
            y = torch.full((16,), 2.0)  # a batch of one repeated target
        yield x, y
        step += 1


def optimizer(params):
    return torch.optim.SGD(params, lr=1e-2)
