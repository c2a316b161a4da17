"""A residual MLP of six blocks, for ``gradscope memory``: which modules to checkpoint.

    gradscope memory samples/memory_blocks.py                    # activations per module
    gradscope memory samples/memory_blocks.py --budget 40%       # a plan, applied and measured
    gradscope memory samples/memory_blocks.py --budget 40% --plot curve.png
"""

import torch
from torch import nn

torch.manual_seed(0)


class Block(nn.Module):
    """LayerNorm, a 4x wider hidden layer with GELU, back down, plus the residual."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, d: int = 64, n: int = 6) -> None:
        super().__init__()
        self.embed = nn.Linear(16, d)
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])
        self.head = nn.Linear(d, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


model = Net()
example_input = torch.randn(256, 16)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.pow(2).mean()
