"""A parameter its module never uses, in a block that ends with ``optimizer.step()``: the
doctor said "module X was never called in the step" though X ran (issue 47: a Hugging Face
Dinov2's ``embeddings.mask_token``, used only with ``bool_masked_pos``, in the module that
builds every embedding). The modules that ran were counted since the last step, and the
``grad_none`` findings are made when the block ends, after it. Ground truth: the forward
hooks of plain torch record which modules ran."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gradscope as gs


class Embed(nn.Module):
    """A projection and a mask token used only where a mask is given (as Dinov2/BEiT's)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.mask_token = nn.Parameter(torch.zeros(4))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.proj(x)
        if mask is not None:
            h = torch.where(mask[..., None], self.mask_token, h)
        return h


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = Embed()
        self.head = nn.Linear(4, 1)
        self.spare = nn.Linear(4, 1)  # never called

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(x))


@pytest.mark.parametrize("steps", [0, 1, 2])
def test_unused_in_a_module_that_ran_is_not_a_module_never_called(steps):
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ran: set[str] = set()
    names = {m: n for n, m in model.named_modules()}
    hooks = [m.register_forward_hook(lambda m, a, o: ran.add(names[m]))
             for m in model.modules()]
    with gs.doctor(model, optimizer=opt if steps else None) as doc:
        for _ in range(max(steps, 1)):
            opt.zero_grad()
            model(torch.randn(3, 4)).sum().backward()
            if steps:
                opt.step()
    for h in hooks:
        h.remove()
    assert "embed" in ran and "spare" not in ran  # plain torch's account
    why = {f.param: f.message for f in doc.findings if f.kind == "grad_none"}
    assert set(why) == {"embed.mask_token", "spare.weight", "spare.bias"}, why
    assert "never called" not in why["embed.mask_token"], why["embed.mask_token"]
    assert "no op of the forward used it" in why["embed.mask_token"]
    assert "module spare was never called" in why["spare.weight"], why["spare.weight"]
