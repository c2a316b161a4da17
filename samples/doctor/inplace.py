"""A tensor saved for backward, then modified in place: autograd's "modified by an inplace
operation" error. Each variant changes it another way; the lines marked ``# doctor: VARIANT``
are the op that saved the tensor and the op that modified it.

    gradscope doctor samples/doctor/inplace.py
"""

import torch
from torch import nn

# the last two adapted from PyTorch's test/test_autograd.py (an op's saved input, save_for_backward)
VARIANTS = ("view", "setitem", "iadd", "module_inplace", "hook", "autocast", "loop", "input_saved",
            "custom_saved")


class Net(nn.Module):
    def __init__(self, variant: str = "view") -> None:
        super().__init__()
        self.variant = variant
        self.fc = nn.Linear(8, 8)
        self.act = nn.Sigmoid()
        self.relu = nn.ReLU(inplace=True)
        if variant == "hook":
            self.act.register_forward_hook(_double)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.variant
        if v == "view":
            y = torch.sigmoid(self.fc(x))  # doctor: view
            y[0].zero_()  # doctor: view
        elif v == "setitem":
            y = torch.tanh(self.fc(x))  # doctor: setitem
            y[:, 0] = 0  # doctor: setitem
        elif v == "iadd":
            y = torch.exp(self.fc(x))  # doctor: iadd
            y += 1  # doctor: iadd
        elif v == "module_inplace":
            y = torch.sigmoid(self.fc(x))  # doctor: module_inplace
            y = self.relu(y)  # doctor: module_inplace
        elif v == "hook":
            y = self.act(self.fc(x))  # doctor: hook
        elif v == "input_saved":  # an op saved its INPUT, then the input was changed in place
            z = self.fc(x)
            y = z.pow(2)  # doctor: input_saved
            z += 1  # doctor: input_saved
        elif v == "custom_saved":
            z = self.fc(x)
            y = Scale.apply(z)  # doctor: custom_saved
            z.mul_(2)  # doctor: custom_saved
        elif v == "loop":
            y = self.fc(x)
            for _ in range(3):
                y = torch.sigmoid(y)  # doctor: loop
            y.mul_(2)  # doctor: loop
        else:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = torch.sigmoid(self.fc(x))  # doctor: autocast
                y.mul_(2)  # doctor: autocast
        return y


def _double(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
    output.mul_(2)  # doctor: hook


def build(variant: str = "view") -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Net(variant), torch.randn(16, 8)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.float().pow(2).mean()


def program(watch, variant: str = "view") -> nn.Module:
    """One forward and backward under ``watch(model)`` (``gs.doctor``, or a no-op)."""
    model, x = build(variant)
    with watch(model):
        loss_fn(model(x)).backward()
    return model


class Scale(torch.autograd.Function):
    """A custom Function that saves its input with ``save_for_backward``."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 3

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 + 0 * x
