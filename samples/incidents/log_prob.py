"""Planted bug: ``log`` of a probability that reaches 0.

The head takes ``softmax`` then ``log`` (instead of ``log_softmax``). At step 3 one input is
so large that a class's probability underflows to exactly 0.0 in float32: ``log`` gives -inf
in the forward, and its backward divides by 0.

    gradscope report samples/incidents/log_prob.py --steps 5
"""

import torch
from torch import nn

torch.manual_seed(0)
BAD_STEP = 3


class LogProbHead(nn.Module):
    def __init__(self, d: int, k: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d, k)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        probs = self.proj(h).softmax(dim=-1)
        return torch.log(probs)  # planted: log(0) = -inf once a probability underflows


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = LogProbHead(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


model = Net()
example_input = torch.randn(32, 8)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.nll_loss(output, target)


def batches():
    g = torch.Generator().manual_seed(1)
    step = 0
    while True:
        x = torch.randn(32, 8, generator=g)
        y = torch.randint(0, 4, (32,), generator=g)
        if step == BAD_STEP:
            x[0] *= 1e4  # the logits spread by far more than 104: exp underflows to 0
        yield x, y
        step += 1


def optimizer(params):
    return torch.optim.SGD(params, lr=1e-2)
