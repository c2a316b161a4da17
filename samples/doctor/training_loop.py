"""Silent training-loop slips: a head added after the optimizer was built
(``not_in_optimizer``), a backbone frozen after a warm-up step, still in the optimizer with its
zero-filled gradients (``frozen_in_optimizer``: its weight decay still shrinks it), no
``zero_grad()`` between steps (``grads_accumulate``), and a model left in ``eval()`` mode
(``eval_mode``). The lines marked ``# doctor: VARIANT`` are what each finding names.

    gradscope doctor samples/doctor/training_loop.py
"""

import torch
from torch import nn

VARIANTS = ("not_in_optimizer", "frozen_in_optimizer", "grads_accumulate", "eval_mode")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.backbone(x).relu())  # doctor: eval_mode
        return self.head(h)


# the file as gradscope doctor runs it: the optimizer was built before the head existed
model = Net()
example_input = torch.randn(16, 8)


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.pow(2).mean()


def optimizer(params):
    return torch.optim.SGD(model.backbone.parameters(), lr=0.01)


def program(watch, variant: str = "not_in_optimizer") -> nn.Module:
    torch.manual_seed(0)
    net = Net()
    params = (net.backbone.parameters() if variant == "not_in_optimizer"
              else net.parameters())
    opt = torch.optim.SGD(params, lr=0.01, weight_decay=1e-2)
    if variant == "frozen_in_optimizer":  # a warm-up step trained it all, then the freeze
        loss_fn(net(torch.randn(16, 8))).backward()
        net.backbone.requires_grad_(False)
    if variant == "eval_mode":
        net.eval()  # left over from a validation pass
    g = torch.Generator().manual_seed(1)
    with watch(net, optimizer=opt):
        for _ in range(2):
            if variant == "frozen_in_optimizer":
                opt.zero_grad(set_to_none=False)  # zeros: the frozen .grad stays a tensor
            elif variant != "grads_accumulate":
                opt.zero_grad()
            loss_fn(net(torch.randn(16, 8, generator=g))).backward()  # doctor: grads_accumulate
            if variant in ("not_in_optimizer", "frozen_in_optimizer"):
                opt.step()  # doctor: not_in_optimizer, frozen_in_optimizer
            else:
                opt.step()
    return net
