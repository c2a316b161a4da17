"""Models behind the structured golden files (clusters, depth, folds, backward annotations).

Kept in a file of their own: the forward lines in the golden files name lines of this file, so
edits elsewhere in the tests never change them.
"""

from __future__ import annotations

import torch

import gradscope as gs


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin, self.act = torch.nn.Linear(4, 4), torch.nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.lin(x))


class _Net(torch.nn.Module):
    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.stem = torch.nn.Linear(3, 4)
        self.blocks = torch.nn.ModuleList([_Block() for _ in range(n)])
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for b in self.blocks:
            x = b(x)
        h = self.head(x)
        # the sqrt branch is never taken, so the forward is finite; its backward is 0 * NaN
        return torch.where(h < 1e3, h, (-h.abs()).sqrt()).sum()


def scoped_net() -> tuple[gs.Graph, torch.Tensor, torch.nn.Module]:
    torch.manual_seed(0)
    net = _Net()
    with gs.scopes(net), gs.record_forward():
        loss = net(torch.randn(2, 3, requires_grad=True))
    return gs.trace(loss, model=net), loss, net
