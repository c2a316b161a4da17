"""A regression MLP whose data has one broken example: at step 30 the readings of one example
(id ``ex-00963``) come in the wrong unit, x1000. Its batches carry ids.

    gradscope report samples/spikes/bad_example.py --steps 40

reports one spike at step 30 (the gradient norm x1.7e4 its running median), names
``ex-00963`` as the example that carries 100% of the gradient, and exits 1.
"""

import torch
from torch import nn

torch.manual_seed(0)

BATCH = 32
BAD_STEP = 30
BAD_ROW = 3


model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
example_input = torch.randn(BATCH, 8)
example_target = torch.randn(BATCH, 1)


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


def optimizer(params):
    return torch.optim.AdamW(params, lr=1e-3)


def batches():
    """``(inputs, target, ids)``: a noisy linear task, the examples numbered across the run."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(8, 1, generator=g)
    step = 0
    while True:
        x = torch.randn(BATCH, 8, generator=g)
        y = x @ w + 0.1 * torch.randn(BATCH, 1, generator=g)
        if step == BAD_STEP:
            x[BAD_ROW] *= 1000.0  # a sensor that reported in the wrong unit
            y[BAD_ROW] *= 1000.0
        yield x, y, [f"ex-{step * BATCH + i:05d}" for i in range(BATCH)]
        step += 1


if __name__ == "__main__":  # not run by gradscope, which imports this file as a module
    print(model(example_input).shape)
