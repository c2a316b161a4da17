"""A loss without a graph: "element 0 of tensors does not require grad and does not have a
grad_fn". The line marked ``# doctor: VARIANT`` is where the loss lost its graph.

    gradscope doctor samples/doctor/no_grad_fn.py
"""

import torch
from torch import nn

VARIANTS = ("detach", "no_grad", "inference_mode", "item", "frozen")


class Net(nn.Module):
    def __init__(self, variant: str = "detach") -> None:
        super().__init__()
        self.variant = variant
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 1)
        if variant == "frozen":
            self.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.variant == "no_grad":
            with torch.no_grad():  # the whole forward: the loss has no graph at all
                return self.fc2(self.fc1(x).relu())  # doctor: no_grad
        if self.variant == "inference_mode":
            with torch.inference_mode():
                return self.fc2(self.fc1(x).relu())  # doctor: inference_mode
        if self.variant == "frozen":
            h = self.fc1(x).relu()  # doctor: frozen
        else:
            h = self.fc1(x).relu()
        return self.fc2(h)


def build(variant: str = "detach") -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Net(variant), torch.randn(16, 8)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return score(output, "detach")


def score(output: torch.Tensor, variant: str) -> torch.Tensor:
    if variant == "detach":
        return output.detach().pow(2).mean()  # doctor: detach
    if variant == "item":
        return torch.tensor(output.pow(2).mean().item())  # doctor: item
    return output.pow(2).mean()


def program(watch, variant: str = "detach") -> nn.Module:
    model, x = build(variant)
    with watch(model):
        score(model(x), variant).backward()
    return model
