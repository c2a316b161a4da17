"""Activation checkpointing: the same network with and without ``torch.utils.checkpoint``.

Checkpointing a block keeps only its input for backward and recomputes the rest, so the graph
saves far fewer bytes. See it with:

    gradscope tree samples/checkpointing.py                        # plain: every block saves
    gradscope tree samples/checkpointing.py:build_reentrant        # one saved input per block
    python samples/checkpointing.py                                # live figures, side by side

``build_checkpointed`` uses the recommended non-reentrant checkpoint; ``build_reentrant`` the
older reentrant one, whose graph shows one ``CheckpointFunctionBackward`` node per block.
"""

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

torch.manual_seed(0)

MODES = ("none", "non_reentrant", "reentrant")


class Block(nn.Module):
    """A residual MLP block: the kind of block whose activations dominate memory."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.up = nn.Linear(d, 4 * d)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, d: int = 32, depth: int = 4, mode: str = "none") -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.stem = nn.Linear(d, d)  # so that the first checkpointed input requires grad
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.head = nn.Linear(d, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            if self.mode == "none":
                x = block(x)
            else:
                x = checkpoint(block, x, use_reentrant=self.mode == "reentrant")
        return self.head(x)


def make(mode: str) -> Net:
    """A network in ``mode``, with the same weights whatever the mode."""
    torch.manual_seed(0)
    return Net(mode=mode)


model = make("none")
example_input = torch.randn(64, 32)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.pow(2).mean()


def build():
    return model, example_input


def build_checkpointed():
    return make("non_reentrant"), example_input


def build_reentrant():
    return make("reentrant"), example_input


def compare() -> dict:
    """Saved bytes (live, via gradscope.saved_memory) of one forward in every mode."""
    import gradscope as gs

    figures = {}
    for mode in MODES:
        net = make(mode)
        with gs.saved_memory(net) as mem:
            loss = loss_fn(net(example_input))
        loss.backward()
        figures[mode] = mem.report()
    return figures


if __name__ == "__main__":  # not run by gradscope, which imports this file as a module
    from rich.console import Console

    from gradscope import format_bytes

    console = Console()
    results = compare()
    base = results["none"].total
    for mode, rep in results.items():
        console.print(
            f"{mode:>14}: saved {format_bytes(rep.total):>10} "
            f"({100.0 * rep.total / base:5.1f}% of plain), peak {format_bytes(rep.peak or 0)}"
        )
    console.print(results["none"])
