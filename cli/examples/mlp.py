"""A small multilayer perceptron: the smallest real model to look at.

    gradscope render samples/mlp.py -o mlp.svg
    gradscope tree samples/mlp.py
"""

import torch
from torch import nn

torch.manual_seed(0)


class MLP(nn.Module):
    def __init__(self, d_in: int = 8, hidden: int = 16, d_out: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


model = MLP()
example_input = torch.randn(32, 8)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(output, target)


example_target = torch.randint(0, 4, (32,))


def batches():
    """Batches for `gradscope report`: a fixed synthetic classification task."""
    g = torch.Generator().manual_seed(1)
    while True:
        x = torch.randn(32, 8, generator=g)
        yield x, (x[:, :4].argmax(dim=1))


if __name__ == "__main__":  # not run by gradscope, which imports this file as a module
    print(model(example_input).shape)
