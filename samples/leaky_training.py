"""The classic memory leak of a PyTorch training loop, and its fix.

The leaky loop keeps the loss *tensors* for logging (``history.append(loss)``), and evaluates
the validation loss without ``torch.no_grad()``. Each kept tensor holds its whole autograd
graph: the validation graph keeps every saved activation, so memory grows at every step. The
fixed loop keeps ``loss.item()`` and evaluates under ``torch.no_grad()``.

    python samples/leaky_training.py                   # leak_check on both loops
    gradscope render samples/leaky_training.py          # the model itself is an ordinary MLP
"""

import torch
from torch import nn

torch.manual_seed(0)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)
    )


model = make_model()
example_input = torch.randn(32, 16)
example_target = torch.randn(32, 1)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def batches():
    """Batches for ``gradscope report``: a fixed synthetic regression task."""
    g = torch.Generator().manual_seed(1)
    while True:
        x = torch.randn(32, 16, generator=g)
        yield x, x[:, :1] * 2 - x[:, 1:2]


def train(steps: int = 6, *, fixed: bool = False, on_step=None) -> tuple[nn.Module, list]:
    """Train a fresh model; ``on_step()`` is called at the end of every step.

    Returns the model and the logged history: ``(train loss, validation loss)`` per step,
    as tensors in the leaky loop and as floats in the fixed one.
    """
    net = make_model()
    opt = torch.optim.SGD(net.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(2)
    val_x = torch.randn(256, 16, generator=g)
    val_y = val_x[:, :1] * 2 - val_x[:, 1:2]
    history = []
    data = batches()
    for _ in range(steps):
        x, y = next(data)
        opt.zero_grad()
        loss = loss_fn(net(x), y)
        loss.backward()
        opt.step()
        if fixed:
            with torch.no_grad():
                val = loss_fn(net(val_x), val_y)
            history.append((loss.item(), val.item()))
        else:
            val = loss_fn(net(val_x), val_y)  # bug: builds (and saves tensors for) a graph
            history.append((loss, val))  # bug: the tensors keep their graphs alive
        if on_step is not None:
            on_step()
    return net, history


if __name__ == "__main__":  # not run by gradscope, which imports this file as a module
    from rich.console import Console

    import gradscope as gs

    console = Console()
    for fixed in (False, True):
        with gs.leak_check(warn=False) as check:
            train(fixed=fixed, on_step=check.step)
        console.print(f"[bold]{'fixed' if fixed else 'leaky'} loop[/bold]")
        console.print(check.report())
        for found in check.history:
            console.print(f"  after step {found.step}: {gs.format_bytes(found.held_bytes)} held")
