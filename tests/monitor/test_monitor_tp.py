"""GradMonitor on tensor parallel and FSDP2 x TP meshes: gloo ranks on the CPU.

A block (LayerNorm, a column-parallel and a row-parallel Linear, a head) under
``parallelize_module`` on 2 ranks, with the LayerNorm and the head left out of the plan (plain
tensors beside DTensors, the usual case); and the same block under FSDP2 x TP on a 2 x 2 mesh
(4 ranks: every parameter a DTensor, column-parallel weights with ``_StridedShard``).

Ground truth from plain torch, never from the monitor: each gradient's ``full_tensor()`` (or
the plain tensor), and a single-process copy of the block run on the global batch. Also: one
host transfer per logged step, training bitwise the same as an unmonitored copy, and a NaN
planted in one rank's gradient alerted on every rank (no rank waits on another)."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import read_ranks, spawn_ranks
from torch import nn

import gradscope as gs

try:
    from torch.distributed.tensor import Replicate
except ImportError:  # pragma: no cover
    Replicate = None  # type: ignore[assignment,misc]

STEPS = 3
TOL = 1e-4

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)

_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.down(torch.relu(self.up(self.norm(x)))))


def _batch(dp: int, step: int) -> torch.Tensor:
    return torch.randn(6, 8, generator=torch.Generator().manual_seed(100 * step + dp))


def _parallel(twod: bool) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    model = Block()
    plan = {"up": ColwiseParallel(), "down": RowwiseParallel()}
    if twod:
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], plan)
        fully_shard(model, mesh=mesh["dp"])
    else:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
        parallelize_module(model, mesh, plan)
    return model


def _whole(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _run(rank: int, twod: bool, watched: bool, poison: int | None = None) -> dict:
    """STEPS steps of SGD; with ``watched`` a GradMonitor on it. ``poison``: the step at which
    rank 1 (alone) turns the head's weight gradient to NaN."""
    model = _parallel(twod)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = gs.GradMonitor(model, optimizer=opt, replay=False) if watched else None
    dp = rank // 2 if twod else 0
    truths, reads = [], []
    seen = [0]
    originals = {name: getattr(torch.Tensor, name) for name in _READS}

    def counted(original):
        def read(t, *args, **kwargs):
            seen[0] += 1
            return original(t, *args, **kwargs)

        return read

    for step in range(STEPS):
        opt.zero_grad()
        loss = model(_batch(dp, step)).square().mean()
        if poison == step and rank == 1:
            model.head.weight.register_hook(lambda g: torch.full_like(g, math.nan))
        try:
            for name, original in originals.items():
                setattr(torch.Tensor, name, counted(original))
            before = seen[0]
            loss.backward()
            opt.step()
            reads.append(seen[0] - before)
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)
        truths.append({n: _whole(p.grad).double().norm().item()
                       for n, p in model.named_parameters()})
    out: dict = {"truths": truths, "reads": reads,
                 "weights": {n: _whole(p.detach()).tolist() for n, p in model.named_parameters()},
                 "names": [n for n, _ in model.named_parameters()]}
    if mon is not None:
        out["norms"] = [{n: ps.norm for n, ps in st.params.items()} for st in mon.history]
        out["totals"] = [st.total_norm for st in mon.history]
        out["scopes"] = [st.scope for st in mon.history]
        out["alerts"] = [(a.kind, a.step, a.name) for a in mon.alerts]
        mon.remove()
    return out


def _replayed(rank: int, twod: bool) -> dict:
    """A NaN in the second data-parallel group's input at step 1 (under FSDP2 x TP both of
    its tensor-parallel ranks, 2 and 3, get that batch), the monitor replaying (the default):
    every rank replays together, and every rank's incident is the job's."""
    model = _parallel(twod)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = gs.GradMonitor(model, optimizer=opt)
    dp = rank // 2 if twod else rank
    for step in range(STEPS):
        opt.zero_grad()
        x = _batch(dp, step)
        if step == 1 and dp == 1:
            x[0, 0] = math.nan
        model(x).square().mean().backward()
        opt.step()
    incidents = [i.to_dict() for i in mon.incidents if i.kind == "nonfinite"]
    mon.remove()
    return {"incidents": incidents}


def _reference(twod: bool) -> list[dict[str, float]]:
    """The block on one process, on the global batch of each step: its gradients' norms."""
    torch.manual_seed(0)
    model = Block()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for step in range(STEPS):
        opt.zero_grad()
        x = torch.cat([_batch(0, step), _batch(1, step)]) if twod else _batch(0, step)
        model(x).square().mean().backward()
        out.append({n: p.grad.double().norm().item() for n, p in model.named_parameters()})
        opt.step()
    return out


def _experts(rank: int) -> dict:
    """A DTensor layer beside plain "experts" that differ per rank (expert parallel by hand):
    the monitor says once that they are not replicas."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, {"0": ColwiseParallel(output_layouts=Replicate())})
    mon = gs.GradMonitor(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (model(_batch(0, 0)) * (rank + 1)).sum().backward()  # each rank its own expert
    mon.remove()
    return {"warnings": [str(w.message) for w in caught if w.category is gs.MonitorWarning]}


def _worker(rank: int, world: int, twod: bool, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own notes on redistribution
            result = {
                "plain": _run(rank, twod, watched=False),
                "watched": _run(rank, twod, watched=True),
                "reference": _reference(twod),
            }
            if twod:
                result["replayed"] = _replayed(rank, twod)
            else:
                result["poisoned"] = _run(rank, twod, watched=True, poison=1)
                result["experts"] = _experts(rank)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _spawn(tmp_path_factory, world: int, twod: bool) -> list[dict]:
    out = spawn_ranks(_worker, world, lambda a: tmp_path_factory.mktemp(f"tp{world}_{a}"),
                      lambda d: (world, twod, str(d / "init"), str(d)))
    return read_ranks(out, world)


@pytest.fixture(scope="module", params=[(2, False), (4, True)], ids=["tp", "fsdp2_x_tp"])
def results(request, tmp_path_factory) -> tuple[str, list[dict]]:
    world, twod = request.param
    return ("fsdp2_x_tp" if twod else "tp"), _spawn(tmp_path_factory, world, twod)


def _rel(got: float, want: float) -> float:
    return abs(got - want) / max(abs(want), 1e-30)


def test_norms_are_those_of_the_whole_parameters_on_every_rank(results) -> None:
    _, ranks = results
    for r in ranks:
        w = r["watched"]
        assert len(w["norms"]) == STEPS and w["scopes"] == ["global"] * STEPS
        for norms, truth, total in zip(w["norms"], w["truths"], w["totals"], strict=True):
            assert list(norms) == w["names"]  # the user's names, none missing or twice
            assert max(_rel(norms[n], truth[n]) for n in truth) < TOL
            assert _rel(total, math.sqrt(sum(v * v for v in truth.values()))) < TOL
    assert all(r["watched"]["totals"] == ranks[0]["watched"]["totals"] for r in ranks)


def test_norms_equal_a_single_process_run_on_the_global_batch(results) -> None:
    _, ranks = results
    for r in ranks:
        for norms, ref in zip(r["watched"]["norms"], r["reference"], strict=True):
            assert max(_rel(norms[n], ref[n]) for n in ref) < TOL


def test_training_is_bitwise_the_same_and_one_transfer_per_logged_step(results) -> None:
    _, ranks = results
    for r in ranks:
        assert r["watched"]["weights"] == r["plain"]["weights"]
        extra = [w - p for w, p in zip(r["watched"]["reads"], r["plain"]["reads"], strict=True)]
        assert extra == [1] * STEPS, extra


def test_a_nan_on_one_rank_is_alerted_on_every_rank(results) -> None:
    which, ranks = results
    if which != "tp":
        pytest.skip("planted in the tensor-parallel run")
    for r in ranks:
        poisoned = r["poisoned"]
        assert ["nan", 1, "head.weight"] in poisoned["alerts"], poisoned["alerts"]
        assert math.isnan(poisoned["norms"][1]["head.weight"])


def test_plain_parameters_that_differ_between_ranks_are_said_once(results) -> None:
    which, ranks = results
    if which != "tp":
        pytest.skip("planted in the tensor-parallel run")
    for r in ranks:
        (message,) = r["experts"]["warnings"]
        assert message.startswith("GradMonitor: the plain (non-DTensor) parameters 1.weight")
        assert "not replicas" in message
    # and the replicated plain parameters of the block (LayerNorm, head) said nothing


def test_under_fsdp2_x_tp_the_ranks_replay_together_and_name_the_first_rank(results) -> None:
    """4 ranks on a 2 x 2 mesh: the batch of data-parallel group 1 (ranks 2 and 3) holds a
    NaN. Every rank records one incident naming rank 2 (the lower of the two that got it;
    ranks 0 and 1 stay finite in their replays), the input that held it and the op that read
    it first."""
    which, ranks = results
    if which != "fsdp2_x_tp":
        pytest.skip("planted in the FSDP2 x TP run")
    for r in ranks:
        (inc,) = r["replayed"]["incidents"]
        assert inc["step"] == 1 and inc["rank"] == 2, inc["ranks"]
        assert inc["phase"] == "forward" and inc["input"] == "the input x", inc
        assert inc["op"] == "layer_norm", inc  # the block's first op reads it
        assert inc["replayed"] and inc["note"].startswith("replayed on rank 2"), inc["note"]
        for low in inc["ranks"][:2]:
            assert low.endswith("replayed with every rank, stayed finite on this rank: "
                                "downstream"), inc["ranks"]
        for high in inc["ranks"][2:]:
            assert "its replay: the input x already held nan" in high, inc["ranks"]
    assert all(r["replayed"] == ranks[0]["replayed"] for r in ranks)
