"""An Inf gradient that torch.autograd.detect_anomaly does not report (it only looks for NaN).

A float16 linear regression on raw, unnormalised inputs (pixel values 0-255) with a static loss
scale of 1024, as mixed-precision training without a dynamic scaler does. The forward and the
loss are finite; in backward, the weight and bias gradients of `fc` sum 256 samples of
(value x 4000) and overflow float16 (largest finite value 65504) to Inf, in `AddmmBackward0`.
No NaN ever appears, so `detect_anomaly` stays silent while the next optimizer step would turn
the weights into Inf. gradscope reports the node, the slot, and the parameters that got it:

    gradscope tree samples/inf_backward.py --backward      # exit code 1: Inf found
"""

import torch
from torch import nn

torch.manual_seed(0)

LOSS_SCALE = 1024.0



class Regressor(nn.Module):
    def __init__(self, d_in: int = 64) -> None:
        super().__init__()
        self.fc = nn.Linear(d_in, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)  # float16: its weight gradient overflows in backward


model = Regressor().half()
example_input = torch.randint(0, 256, (256, 64)).half()
example_target = torch.full((256, 1), 500.0)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    # The loss is computed in float32 (as autocast does), then scaled.
    return (output.float() - example_target).pow(2).mean() * LOSS_SCALE


if __name__ == "__main__":  # not run by gradscope, which imports this file as a module
    loss = loss_fn(model(example_input))
    loss.backward()
    grad = model.fc.weight.grad
    print(f"loss {loss.item():.4g} is finite; fc.weight.grad Inf:", grad.isinf().any().item(),
          "NaN:", grad.isnan().any().item())
