"""A custom torch.autograd.Function inside a model: it shows up in the graph as
`ScaledTanhBackward` with its saved tensors and the non-tensor `scale` it kept on ctx.

    gradscope render samples/custom_function.py -o custom.svg
    gradscope check samples/custom_function.py:ScaledTanh
"""

import torch
from torch import nn

torch.manual_seed(0)


class ScaledTanh(torch.autograd.Function):
    """y = tanh(scale * x); dy/dx = scale * (1 - y^2), computed from the saved output."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
        y = torch.tanh(scale * x)
        ctx.save_for_backward(y)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (y,) = ctx.saved_tensors
        return grad_out * ctx.scale * (1 - y * y), None


def ScaledTanh_inputs():
    return (torch.randn(3, 4, dtype=torch.float64, requires_grad=True), 1.5)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 12)
        self.fc2 = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(ScaledTanh.apply(self.fc1(x), 0.5))


model = Net()
example_input = torch.randn(5, 6)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.pow(2).mean()
