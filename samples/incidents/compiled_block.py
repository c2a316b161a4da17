"""Planted bug: a NaN inside a ``torch.compile``d block (backend ``aot_eager``).

The block computes a soft distance ``where(d > 0, sqrt(d), 0)``; the block is compiled, so
``detect_anomaly`` cannot look inside it. At step 3 an input sits exactly on the block's
anchor: the backward of ``sqrt`` at 0 makes NaN inside the compiled region.

    gradscope report samples/incidents/compiled_block.py --steps 5
"""

import torch
from torch import nn

torch.manual_seed(0)
BAD_STEP = 3


class SoftDistance(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.anchor = nn.Parameter(torch.randn(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d2 = (x - self.anchor).pow(2).sum(-1, keepdim=True)
        return torch.where(d2 > 0, d2.sqrt(), 0.0)  # planted: sqrt's backward at 0 is NaN


class Net(nn.Module):
    def __init__(self, compile_block: bool = True) -> None:
        super().__init__()
        block = SoftDistance(6)
        self.block = torch.compile(block, backend="aot_eager") if compile_block else block
        self.head = nn.Linear(7, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([x, self.block(x)], dim=-1))


model = Net()
example_input = torch.randn(16, 6)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output, target)


def batches():
    g = torch.Generator().manual_seed(1)
    step = 0
    while True:
        x = torch.randn(16, 6, generator=g)
        if step == BAD_STEP:
            x[3] = _anchor().detach()  # exactly on the anchor
        yield x, torch.randint(0, 2, (16,), generator=g)
        step += 1


def _anchor() -> torch.Tensor:
    block = model.block
    return getattr(block, "_orig_mod", block).anchor


def optimizer(params):
    return torch.optim.SGD(params, lr=1e-2)
