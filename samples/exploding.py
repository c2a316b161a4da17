"""A deep linear-ReLU stack initialised with too large a gain: exploding gradients.

Every layer multiplies the signal by about ``GAIN`` (forward and backward), so after ten
layers every weight's gradient norm is around 1e6-1e7, far above the default alert level 1e3.

    gradscope report samples/exploding.py --steps 3      # exploding alerts
"""

import torch
from torch import nn

torch.manual_seed(0)

DEPTH = 10
WIDTH = 32
GAIN = 3.0

layers: list[nn.Module] = []
for _ in range(DEPTH):
    lin = nn.Linear(WIDTH, WIDTH)
    nn.init.orthogonal_(lin.weight, gain=GAIN)
    layers += [lin, nn.ReLU()]
model = nn.Sequential(*layers, nn.Linear(WIDTH, 1))
example_input = torch.randn(32, WIDTH)
example_target = torch.zeros(32, 1)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def optimizer(params):
    # a small step so the run shows the large gradients rather than diverging into NaN at once
    return torch.optim.SGD(params, lr=1e-9)
