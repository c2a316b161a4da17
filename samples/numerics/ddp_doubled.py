"""A data-parallel step whose ``fc2.weight`` gradient is doubled on every rank: after DDP has
averaged the gradients, a second all-reduce sums them again (2 ranks: twice the average). The
loss is the same as one process's; only that gradient is wrong. The same step under FSDP2
(``fully_shard``), with that sharded gradient doubled after its reduce-scatter.

Each of 2 gloo processes on the CPU records both steps with ``gs.record_numerics`` and saves
them; one process runs the same global batch as the reference; ``gs.compare_runs`` names
``fc2.weight`` with the ratio 2.0, and nothing else:

    python samples/numerics/ddp_doubled.py /tmp/ddp      # reference.json, rank0.json, fsdp0.json...
    gradscope compare /tmp/ddp/reference.json /tmp/ddp/rank0.json
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

WORLD = 2
BATCH = 8  # per rank


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def build() -> MLP:
    torch.manual_seed(0)
    return MLP()


def batch(rank: int) -> torch.Tensor:
    return torch.randn(BATCH, 6, generator=torch.Generator().manual_seed(100 + rank))


def loss_fn(output: torch.Tensor) -> torch.Tensor:
    return output.square().mean()


# the model file (gradscope render/doctor/compare): one process on the global batch
model = build()
example_input = torch.cat([batch(r) for r in range(WORLD)])


def reference(out_dir: str) -> None:
    """One process, the global batch: the run every rank is compared with."""
    import gradscope as gs

    m = build()
    with gs.record_numerics(m) as run:
        loss_fn(m(example_input)).backward()
    run.save(os.path.join(out_dir, "reference.json"))


def worker(rank: int, out_dir: str) -> None:
    """One rank: DDP over its half of the batch, then the planted second all-reduce."""
    import gradscope as gs

    dist.init_process_group("gloo", init_method=f"file://{os.path.join(out_dir, 'init')}",
                            rank=rank, world_size=WORLD)
    try:
        ddp = nn.parallel.DistributedDataParallel(build())
        with gs.record_numerics(ddp) as run:
            loss_fn(ddp(batch(rank))).backward()
            dist.all_reduce(ddp.module.fc2.weight.grad)  # the bug: summed again after averaging
        run.save(os.path.join(out_dir, f"rank{rank}.json"))
        grads = {n: p.grad for n, p in ddp.module.named_parameters()}
        torch.save(grads, os.path.join(out_dir, f"grads{rank}.pt"))
        fsdp_step(rank, out_dir)
    finally:
        dist.destroy_process_group()


def fsdp_step(rank: int, out_dir: str) -> None:
    """The same step under FSDP2: each gradient a DTensor holding this rank's rows, summarised
    as the full tensor without gathering it; the bug doubles ``fc2.weight``'s."""
    from torch.distributed.fsdp import fully_shard

    import gradscope as gs

    model = build()
    for layer in (model.fc1, model.fc2):
        fully_shard(layer)
    fully_shard(model)
    with gs.record_numerics(model) as run:
        loss_fn(model(batch(rank))).backward()
        with torch.no_grad():
            model.fc2.weight.grad.mul_(2)  # the bug
    run.save(os.path.join(out_dir, f"fsdp{rank}.json"))
    full = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
    torch.save(full, os.path.join(out_dir, f"fsdp_grads{rank}.pt"))


def main(out_dir: str) -> None:
    import torch.multiprocessing as mp

    os.makedirs(out_dir, exist_ok=True)
    reference(out_dir)
    mp.spawn(worker, args=(out_dir,), nprocs=WORLD, join=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "ddp_runs")
