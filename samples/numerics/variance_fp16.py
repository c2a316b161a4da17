"""A variance computed as E[x^2] - E[x]^2, which loses its precision in half precision.

The features sit near 100 with a spread near 1: E[x^2] is about 10001, where float16's numbers
are 8 apart, so the subtraction cancels every digit the variance had (in float32 the numbers
there are 0.001 apart and the variance keeps three digits). ``x.var()`` (or subtracting the
mean first) keeps them.

    gradscope compare samples/numerics/variance_fp16.py --candidate fp16
"""

import torch
from torch import nn

torch.manual_seed(0)


class NaiveNorm(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.proj = nn.Linear(d, d)
        self.out = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x) + 100.0
        mean = h.mean(dim=-1, keepdim=True)
        var = (h * h).mean(dim=-1, keepdim=True) - mean * mean  # cancels in float16
        return self.out((h - mean) / (var.abs() + 1e-2).sqrt())


model = NaiveNorm()
example_input = torch.randn(16, 32)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.square().mean()
