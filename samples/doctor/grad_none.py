"""Parameters whose ``.grad`` stays None after ``backward()``, without any error. The lines marked
``# doctor: VARIANT`` are where the path from the parameters to the loss was cut (or, for
``unused``, where their output was made and then dropped).

    gradscope doctor samples/doctor/grad_none.py
"""

import torch
from torch import nn

VARIANTS = ("cut", "argmax", "no_grad", "unused", "never_called", "frozen_upstream")


class Net(nn.Module):
    def __init__(self, variant: str = "cut") -> None:
        super().__init__()
        self.variant = variant
        self.encoder = nn.Linear(8, 16)
        if variant in ("cut", "argmax", "no_grad"):
            self.gate = nn.Linear(8, 16)
        if variant in ("unused", "never_called"):
            self.aux = nn.Linear(16, 4)  # an auxiliary head
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.variant
        h = self.encoder(x).relu()  # doctor: frozen_upstream
        if v == "cut":
            h = h * self.gate(x).sigmoid().detach()  # doctor: cut
        elif v == "argmax":
            pick = self.gate(x).argmax(dim=1, keepdim=True)  # doctor: argmax
            h = h * (pick.float() / 16)
        elif v == "no_grad":
            with torch.no_grad():
                scale = self.gate(x).sigmoid()  # doctor: no_grad
            h = h * scale
        elif v == "unused":
            extra = self.aux(h)  # doctor: unused
            del extra  # computed, then dropped: the loss never sees it
        out = self.head(h)
        return out


def build(variant: str = "cut") -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Net(variant), torch.randn(16, 8)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.pow(2).mean()


def program(watch, variant: str = "cut") -> nn.Module:
    model, x = build(variant)
    if variant == "frozen_upstream":
        model.encoder.requires_grad_(False)  # frozen for the forward...
    with watch(model):
        loss = loss_fn(model(x))
        if variant == "frozen_upstream":
            model.encoder.requires_grad_(True)  # ...unfrozen too late
        loss.backward()
    return model
