"""A torch.compile'd model: its compiled region drawn as the backward graph it really runs.

`torch.compile` turns the whole forward below into one autograd node, `CompiledFunctionBackward`,
which torchviz (and every other tool) draws as one opaque box. gradscope opens it: the cluster
`<compiled>` holds one node per aten op of the AOTAutograd backward graph (`aten.mm.default`,
`aten.threshold_backward.default`...), grouped by the module each op belongs to, with the
forward line that made it and the activations the region saved:

    gradscope tree samples/compiled.py
    gradscope render samples/compiled.py --backward -o compiled.svg   # gradients at the boundary
    gradscope render samples/compiled.py --depth 1 -o region.svg      # the region as one box

`backend="aot_eager"` runs the same AOTAutograd graphs as the default inductor backend without
generating C++, so the sample runs in seconds; drop it to see inductor's graphs.
"""

import torch
from torch import nn

torch.manual_seed(0)


class MLP(nn.Module):
    def __init__(self, d_in: int = 8, hidden: int = 16, d_out: int = 4) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.act = nn.ReLU()
        self.norm = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(self.act(self.fc1(x))))


model = torch.compile(MLP(), backend="aot_eager")
example_input = torch.randn(32, 8)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.pow(2).mean()


if __name__ == "__main__":  # not run by gradscope, which imports this file as a module
    out = model(example_input)
    print(type(out.grad_fn).__name__)  # CompiledFunctionBackward
