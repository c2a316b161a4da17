"""A healthy training step: the doctor finds nothing (exit code 0).

    gradscope doctor samples/doctor/healthy.py
"""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 4))
example_input = torch.randn(16, 8)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.pow(2).mean()


def optimizer(params):
    return torch.optim.AdamW(params, lr=1e-3)
