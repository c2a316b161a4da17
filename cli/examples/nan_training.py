"""A training run that produces a NaN gradient in one parameter at step 3.

The model scales its output by ``1 + sqrt(gain * s)``, where ``s`` is the mean magnitude of the
batch's first feature. The fourth batch (step 3) has that feature all zero: the forward value is
fine (``sqrt(0) = 0``), but d/d(gain) of ``sqrt(gain * s)`` is ``s / (2 sqrt(gain * s)) = 0/0``,
so ``gain.grad`` is NaN while every other gradient stays finite. The SGD step then writes the NaN
into ``gain`` and from step 4 on every gradient is NaN.

    gradscope report samples/nan_training.py --steps 6     # exit code 1, names gain and step 3
"""

import torch
from torch import nn

torch.manual_seed(0)

NAN_STEP = 3


class GatedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.act = nn.Tanh()
        self.fc2 = nn.Linear(16, 1)
        self.gain = nn.Parameter(torch.tensor(1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x[:, 0].abs().mean()
        return self.fc2(self.act(self.fc1(x))) * (1 + torch.sqrt(self.gain * s))


model = GatedMLP()
example_input = torch.randn(16, 8)
example_target = torch.randn(16, 1)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def batches():
    g = torch.Generator().manual_seed(1)
    step = 0
    while True:
        x = torch.randn(16, 8, generator=g)
        if step == NAN_STEP:
            x[:, 0] = 0.0
        yield x, x[:, 1:2] * 0.5
        step += 1
