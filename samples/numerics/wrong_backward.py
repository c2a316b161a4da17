"""A custom SiLU whose backward is subtly wrong: it takes the sigmoid of the saved *output*
instead of the input. The forward is right, the loss is right, only the gradients are off.

``model`` uses the wrong Function, ``reference_model`` the right one, with the same weights;
``gs.compare_runs`` of the two runs names the backward's ``sigmoid`` line:

    import gradscope as gs
    from wrong_backward import model, reference_model, example_input, loss_fn
    def run(m):
        with gs.record_numerics(m) as r:
            loss_fn(m(example_input)).backward()
        return r
    gs.compare_runs(run(reference_model), run(model)).first
"""

import copy

import torch
from torch import nn

torch.manual_seed(0)


class SiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x * torch.sigmoid(x)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * (s * (1 + x * (1 - s)))


class WrongSiLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x * torch.sigmoid(x)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, y = ctx.saved_tensors
        s = torch.sigmoid(y)  # wrong: the sigmoid of the output, not of the input
        return grad * (s * (1 + x * (1 - s)))


class MLP(nn.Module):
    def __init__(self, act: type[torch.autograd.Function] = WrongSiLU) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act.apply(self.fc1(x)))


model = MLP(WrongSiLU)
reference_model = copy.deepcopy(model)
reference_model.act = SiLU
example_input = torch.randn(32, 8)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.square().mean()
