"""Planted bug: attention scores computed in float16 overflow.

The attention casts queries and keys to float16 (to save memory) and scales the scores after
the product instead of before. At step 3 the activations are large: q . k passes 65504, the
float16 maximum, and becomes Inf; softmax of a row with Inf gives NaN.

    gradscope report samples/incidents/fp16_attention.py --steps 5
"""

import math

import torch
from torch import nn

torch.manual_seed(0)
BAD_STEP = 3


class Attention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.scale = 1.0 / math.sqrt(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k = self.q(x).half(), self.k(x).half()
        scores = q @ k.transpose(-2, -1)  # planted: float16 product, scaled only after
        weights = (scores * self.scale).float().softmax(dim=-1)
        return weights @ self.v(x)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention(16)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(x).mean(dim=1))


model = Net()
example_input = torch.randn(4, 6, 16)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output, target)


def batches():
    g = torch.Generator().manual_seed(1)
    step = 0
    while True:
        x = torch.randn(4, 6, 16, generator=g)
        if step == BAD_STEP:
            x[1] *= 300.0  # large activations: q . k is far beyond 65504
        yield x, torch.randint(0, 4, (4,), generator=g)
        step += 1


def optimizer(params):
    return torch.optim.SGD(params, lr=1e-2)
