"""A NaN that only the backward pass sees: the "safe" square root behind torch.where.

`torch.where(h > 0, h.sqrt(), 0)` keeps the output finite, but `h.sqrt()` is still computed for
the negative entries (NaN, made in the forward) and its backward runs for them: `SqrtBackward0`
returns 0 / (2 * NaN) = NaN, and every weight of `fc` gets a NaN gradient. `detect_anomaly`
names the node (after a 2-5x slower run); gradscope names it and the line that made it:

    gradscope tree samples/nan_backward.py --backward      # exit code 1: NaN found
    gradscope render samples/nan_backward.py --backward -o nan.svg
"""

import torch
from torch import nn

torch.manual_seed(0)


class SqrtFeatures(nn.Module):
    def __init__(self, d_in: int = 6, hidden: int = 8) -> None:
        super().__init__()
        self.fc = nn.Linear(d_in, hidden)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        r = torch.where(h > 0, h.sqrt(), torch.zeros_like(h))  # forward finite, backward NaN
        return self.head(r)


model = SqrtFeatures()
example_input = torch.randn(16, 6)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.pow(2).mean()


if __name__ == "__main__":  # not run by gradscope, which imports this file as a module
    loss = loss_fn(model(example_input))
    loss.backward()
    print(f"loss {loss.item():.4f} is finite, yet fc.weight.grad has NaN:",
          model.fc.weight.grad.isnan().any().item())
