"""Planted bug: an exploding learning rate.

A hand-written schedule multiplies the learning rate by 1000 in the update of step 2 (a
misplaced warm-up factor). The weights jump, and at step 3 the gradient norm leaves its range
by orders of magnitude: an "exploding" incident, naming the modules whose norm grew most.

    gradscope report samples/incidents/exploding_lr.py --steps 5
"""

import torch
from torch import nn

torch.manual_seed(0)
BAD_STEP = 3


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 32)
        self.out = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


model = Net()
example_input = torch.randn(64, 8)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output.squeeze(-1), target)


def batches():
    g = torch.Generator().manual_seed(1)
    while True:
        x = torch.randn(64, 8, generator=g)
        yield x, x[:, 0] - 2 * x[:, 1]


def optimizer(params):
    opt = torch.optim.SGD(params, lr=1e-2)
    steps = [0]

    def schedule(optimizer, args, kwargs):
        steps[0] += 1
        if steps[0] == BAD_STEP:  # the update of step BAD_STEP - 1
            for group in optimizer.param_groups:
                group["lr"] *= 1000.0  # planted: x1000 instead of x1.0 at the end of warm-up

    opt.register_step_pre_hook(schedule)
    return opt
