"""A NaN made in the forward: a module takes the log of values that can be negative.

`Mid` computes `log(h)` of a linear layer's output; half its entries are negative, so the forward
is already NaN there, the loss is NaN, and every gradient behind it is NaN. Blaming the first NaN
*gradient* would name the loss (`PowBackward0` at the loss line); gradscope says first where the
forward went non-finite:

    gradscope tree samples/nan_forward.py --backward     # exit 1: "the forward already
                                                          #   produced nan at LogBackward0 in mid"
"""

import torch
from torch import nn

torch.manual_seed(0)


class Mid(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return h.log()  # log of a negative entry is NaN


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.mid = Mid()
        self.out = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.mid(torch.relu(self.inp(x))))


model = Net()
example_input = torch.randn(16, 4)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.pow(2).mean()


if __name__ == "__main__":  # not run by gradscope, which imports this file as a module
    print("loss:", loss_fn(model(example_input)).item())
