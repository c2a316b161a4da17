"""A deep MLP with sigmoid activations: the textbook vanishing gradient.

Each sigmoid scales the backward signal by at most 1/4, so twenty of them leave the first
layer with a gradient norm around 1e-17 while the last layer's is around 1e-2.

    gradscope report samples/vanishing.py --steps 5      # vanishing alerts on the first layers
"""

import torch
from torch import nn

torch.manual_seed(0)

DEPTH = 20
WIDTH = 32

layers: list[nn.Module] = []
for _ in range(DEPTH):
    layers += [nn.Linear(WIDTH, WIDTH), nn.Sigmoid()]
model = nn.Sequential(*layers, nn.Linear(WIDTH, 1))
example_input = torch.randn(64, WIDTH)
example_target = torch.randn(64, 1)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)
