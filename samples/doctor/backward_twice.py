"""A second backward through a freed graph: a tensor carried over from the previous step (a
module's running state, an RNN hidden state) still points into the graph the last backward
freed. The lines marked ``# doctor: VARIANT`` are where the carried tensor was made, where this
step used it, and the backward that freed its graph.

    gradscope doctor samples/doctor/backward_twice.py
"""

import torch
from torch import nn

VARIANTS = ("state", "hidden", "again", "retained")


class Smoothed(nn.Module):
    """Adds a running average of its past outputs to its input, and forgets to detach it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.running: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.running is not None:
            x = x + self.running  # doctor: state
        out = self.fc(x)
        self.running = 0.9 * out.mean(0)  # doctor: state
        return out


model = Smoothed()
example_input = torch.randn(4, 8)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.pow(2).mean()


def optimizer(params):
    return torch.optim.SGD(params, lr=0.01)


def batches():
    g = torch.Generator().manual_seed(1)
    while True:
        yield torch.randn(4, 8, generator=g)


def program(watch, variant: str = "state") -> nn.Module:
    torch.manual_seed(0)
    if variant == "state":
        net = Smoothed()
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        with watch(net, optimizer=opt):
            for _ in range(2):
                opt.zero_grad()
                loss_fn(net(torch.randn(4, 8))).backward()  # doctor: state
                opt.step()
        return net
    cell = nn.RNNCell(8, 8)
    if variant == "hidden":
        h = torch.zeros(1, 8)
        with watch(cell):
            for _ in range(2):
                h = cell(torch.randn(1, 8), h)  # doctor: hidden
                h.pow(2).mean().backward()  # doctor: hidden
        return cell
    if variant == "retained":  # adapted from test_autograd.py's retain_graph cases
        with watch(cell):
            loss = cell(torch.randn(1, 8)).pow(2).mean()
            loss.backward(retain_graph=True)  # kept the graph: not the one that freed it
            loss.backward()  # doctor: retained
            loss.backward()  # doctor: retained
        return cell
    with watch(cell):
        loss = cell(torch.randn(1, 8)).pow(2).mean()
        loss.backward()  # doctor: again
        loss.backward()  # doctor: again
    return cell
