"""A naive softmax, ``exp(x) / exp(x).sum()``, that overflows in half precision.

In float32 ``exp(12)`` is 162754.8; float16 stops at 65504, so the ``exp`` line gives inf and
the division NaN. Subtracting the row's maximum first (what ``torch.softmax`` does) keeps every
``exp`` at most 1.

    gradscope compare samples/numerics/softmax_fp16.py --candidate fp16
"""

import torch
from torch import nn

torch.manual_seed(0)


class NaiveSoftmaxHead(nn.Module):
    def __init__(self, d_in: int = 16, classes: int = 8) -> None:
        super().__init__()
        self.proj = nn.Linear(d_in, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.proj(x) + 12.0
        e = torch.exp(logits)  # overflows in float16
        return e / e.sum(dim=-1, keepdim=True)


model = NaiveSoftmaxHead()
example_input = torch.randn(32, 16)
example_target = torch.randint(0, 8, (32,))


def loss_fn(probs: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return -probs.gather(1, target[:, None]).clamp_min(1e-3).log().mean()
