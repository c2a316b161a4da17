"""One incident for the job under torch.distributed: every rank records the same incident
and names the rank where the step first went bad (2 gloo ranks on the CPU).

A NaN is planted in rank 1's input at one step; rank 0's data stays clean. Ground truth is
the plant itself (checked in plain torch below: rank 1's forward output is NaN, rank 0's is
finite), under DDP (replication detected, and declared), and under tensor parallel (the
evidence rides in the step's all-gather). Under DDP each rank also replays its own
micro-batch alone (the wrapped module: no collective), and the replays are exchanged on the
bad step: every rank records rank 1's op, module and what held the NaN. A second plant makes
the NaN in rank 1's *backward* only (sqrt at 0: a finite forward and loss on every rank, so
no forward evidence can tell): the replays name rank 1, the backward op and its line."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import read_ranks, spawn_ranks
from torch import nn

import gradscope as gs

BAD = 2
STEPS = 4

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _batch(rank: int, step: int) -> torch.Tensor:
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(10 * step + rank))
    if rank == 1 and step == BAD:
        x[2, 3] = math.nan
    return x


def _ddp(rank: int, **options) -> dict:
    model = nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = gs.GradMonitor(model.module, optimizer=opt, activations=True, **options)
    outputs_finite = []
    for step in range(STEPS):
        opt.zero_grad()
        out = model(_batch(rank, step))
        outputs_finite.append(bool(torch.isfinite(out).all()))
        loss = out.square().mean()
        mon.observe_loss(loss)
        loss.backward()
        opt.step()
    incidents = [i.to_dict() for i in mon.incidents]
    mon.remove()
    return {"incidents": incidents, "finite": outputs_finite}


def _incidents(model: nn.Module, rank: int, watched: nn.Module | None = None,
               observe: bool = False, batch=_batch, steps: int = STEPS,
               losses: list[float] | None = None, **options) -> dict:
    """``steps`` steps of SGD on ``model`` (inputs ``batch(rank, step)``) with a GradMonitor
    on ``watched`` (the model itself by default; ``observe``: each loss given to
    ``observe_loss``; ``losses``: each loss's value appended); every incident, as dicts."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = gs.GradMonitor(model if watched is None else watched, optimizer=opt, **options)
    for step in range(steps):
        opt.zero_grad()
        loss = model(batch(rank, step)).square().mean()
        if losses is not None:
            losses.append(loss.item())
        if observe:
            mon.observe_loss(loss)
        loss.backward()
        opt.step()
    incidents = [i.to_dict() for i in mon.incidents]
    mon.remove()
    return {"incidents": incidents}


def _loss_only(rank: int) -> dict:
    """No activations=: only the losses say which rank."""
    model = nn.parallel.DistributedDataParallel(_model())
    return _incidents(model, rank, model.module, observe=True)


def _fully_shard(model: nn.Module) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
    for m in model.children():
        if any(True for _ in m.parameters()):
            fully_shard(m, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _fsdp(rank: int) -> dict:
    """FSDP2: the forward gathers every layer's parameters from both ranks, so the ranks
    replay together. No activations=, no loss observed: only the replays can say which."""
    return _incidents(_fully_shard(_model()), rank)


def _tp(rank: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    model = _model()
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    return _incidents(model, rank, observe=True, activations=True)


class _SqrtNet(nn.Module):
    """Its forward is finite for every input; its backward is NaN where ``x[:, 8]`` is 0
    (d sqrt(z)/dz at 0 is inf, times 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 4)
        self.drop = nn.Dropout(0.25)  # draws from torch's RNG: a replay must put it back

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(self.drop(x[:, :8]))
        return torch.sqrt(h.square() * x[:, 8:9])  # SQRT-LINE


def _sqrt_batch(rank: int, step: int) -> torch.Tensor:
    x = torch.randn(6, 9, generator=torch.Generator().manual_seed(10 * step + rank))
    x[:, 8] = 1.0
    if rank == 1 and step == BAD:
        x[3, 8] = 0.0
    return x


def _sqrt_run(rank: int, monitored: bool, sharded: bool = False
              ) -> tuple[list[dict], list[bool], list[list[int]]]:
    if sharded:  # FSDP2: every rank gathers the other's shards in forward and backward
        torch.manual_seed(0)
        model = _fully_shard(_SqrtNet())
        inner = model
    else:
        model = nn.parallel.DistributedDataParallel(_SqrtNet())  # rank 0's weights on both
        inner = model.module
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    mon = gs.GradMonitor(inner, optimizer=opt) if monitored else None
    # after the monitor's own pre-hook (its replay): the step's NaN zeroed, so training goes
    # on with finite parameters and the runs with and without the monitor can be compared
    def zero_nan(optimizer, args, kwargs) -> None:
        for p in model.parameters():
            p.grad.nan_to_num_(0.0, 0.0, 0.0)

    if not sharded:  # (FSDP2's figures are read at the step: the NaN steps are compared)
        opt.register_step_pre_hook(zero_nan)
    local_finite = []
    for step in range(STEPS):
        opt.zero_grad()
        x = _sqrt_batch(rank, step)
        # ground truth in plain torch: this rank's own gradient, without the reduction
        alone = _SqrtNet()
        alone.load_state_dict({k: v.full_tensor() if hasattr(v, "full_tensor") else v
                               for k, v in inner.state_dict().items()})
        alone(x).mean().backward()
        local_finite.append(all(bool(torch.isfinite(p.grad).all()) for p in alone.parameters()))
        model(x).mean().backward()
        opt.step()
    incidents = [i.to_dict() for i in mon.incidents] if mon is not None else []
    if mon is not None:
        mon.remove()
    # the bits of every parameter and momentum buffer after the run, and the RNG's next draw
    state = [*model.parameters(), *(opt.state[p]["momentum_buffer"] for p in model.parameters())]
    assert sharded or all(bool(torch.isfinite(t).all()) for t in state)
    bits = [getattr(t, "_local_tensor", t).detach().view(torch.int32).flatten().tolist()
            for t in state]
    return incidents, local_finite, [*bits, torch.rand(4).view(torch.int32).tolist()]


def _backward_origin(rank: int, sharded: bool = False) -> dict:
    """No activations=, no loss observed: only the replays can say which rank. The same
    training without the monitor is run beside it: the replay leaves it bitwise unchanged."""
    torch.manual_seed(1)
    incidents, local_finite, bits = _sqrt_run(rank, True, sharded)
    torch.manual_seed(1)
    _, _, plain_bits = _sqrt_run(rank, False, sharded)
    return {"incidents": incidents, "local_finite": local_finite,
            "bitwise": bits == plain_bits}


def _independent(rank: int) -> dict:
    """A process group, but no gradient reduction: each rank trains its own copy (the ranks'
    figures differ, so no rank waits on another for a replay's exchange)."""
    return _incidents(_model(), rank)


SPIKE = 6  # the spiking step of ``_spike``: six calm logged steps before it


def _spike(rank: int, together: bool = False, sharded: bool = False) -> dict:
    """A gradient spike at step SPIKE from rank 1's batch (scaled 30x), or from both ranks'
    (``together``): DDP (FSDP2 where ``sharded``), every loss given to ``observe_loss``.
    Returns every incident and each rank's own losses (the ground truth: plain torch)."""

    def batch(rank: int, step: int) -> torch.Tensor:
        x = torch.randn(6, 8, generator=torch.Generator().manual_seed(100 * step + rank))
        return x * 30 if step == SPIKE and (rank == 1 or together) else x

    model = _fully_shard(_model()) if sharded else nn.parallel.DistributedDataParallel(_model())
    losses: list[float] = []
    found = _incidents(model, rank, None if sharded else model.module, observe=True,
                       batch=batch, steps=SPIKE + 2, losses=losses, spike_warmup=0)
    return {**found, "losses": losses}


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        result = {
            "detected": _ddp(rank),
            "declared": _ddp(rank, replicated=True),
            "loss_only": _loss_only(rank),
            "tp": _tp(rank),
            "backward": _backward_origin(rank),
            "fsdp": _fsdp(rank),
            "fsdp_backward": _backward_origin(rank, sharded=True),
            "independent": _independent(rank),
            "spike": _spike(rank),
            "spike_together": _spike(rank, together=True),
            "spike_fsdp": _spike(rank, sharded=True),
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    out = spawn_ranks(_worker, 2, lambda a: tmp_path_factory.mktemp(f"first{a}"),
                      lambda d: (str(d / "init"), str(d)))
    return read_ranks(out, 2)


def test_the_plant_is_what_the_test_says(results) -> None:
    """Ground truth in plain torch: at step BAD only rank 1's forward output went NaN (after
    it, the NaN gradients have reached every rank's weights)."""
    assert results[0]["detected"]["finite"][: BAD + 1] == [True] * (BAD + 1)
    assert results[1]["detected"]["finite"][: BAD + 1] == [s != BAD for s in range(BAD + 1)]


@pytest.mark.parametrize("case", ["detected", "tp"])
def test_every_rank_names_rank_1_and_its_first_module(results, case: str) -> None:
    for r in results:
        (inc,) = [i for i in r[case]["incidents"] if i["kind"] == "nonfinite"]
        assert inc["step"] == BAD
        assert inc["rank"] == 1, inc["ranks"]
        assert inc["phase"] == "forward", inc
        assert inc["ranks"][1].startswith("rank 1: the forward first made NaN/Inf in 0")
        if case != "tp":  # under tensor parallel rank 0's forward receives rank 1's NaN too
            assert inc["module"] == "0", inc
            assert inc["ranks"][0] == (
                "rank 0: its forward and loss were finite: downstream; its micro-batch, "
                "replayed alone, gave finite gradients: downstream")
            # rank 1's replay, recorded by every rank: the input held it, linear read it
            assert inc["op"] == "linear" and inc["input"] == "the model's input", inc
            assert inc["ranks"][1].endswith(
                "its replay: the model's input already held nan (first read by linear in 0)")
            assert inc["replayed"] and inc["note"].startswith("replayed on rank 1")
        else:  # sharded parameters: every rank replays at once (the forward's collectives)
            assert inc["input"] == "the model's input", inc
            assert inc["replayed"] and inc["note"].startswith("replayed on rank 1"), inc
            assert "its replay: the model's input already held nan" in inc["ranks"][1]
            # rank 0's own replay met the NaN later, in the output's all-reduce
            assert "its replay: the forward made nan at " in inc["ranks"][0], inc["ranks"]
    assert results[0][case]["incidents"] == results[1][case]["incidents"]


def test_declared_replication_adds_no_collective_and_names_no_rank(results) -> None:
    """``replicated=True``: the monitor makes no collective of its own (it may be built on one
    rank only), so the incident is each rank's own, without a rank."""
    for r in results:
        (inc,) = [i for i in r["declared"]["incidents"] if i["kind"] == "nonfinite"]
        assert inc["step"] == BAD and inc["rank"] is None and inc["ranks"] == []
    # each rank's own replay, alone: rank 1 finds its input, rank 0 finite gradients
    zero, one = (next(i for i in r["declared"]["incidents"] if i["kind"] == "nonfinite")
                 for r in results)
    assert one["input"] == "the model's input" and one["op"] == "linear"
    assert zero["phase"] is None and zero["note"].startswith(
        "replayed alone on this rank, its gradients were finite: the NaN/Inf came from "
        "another rank")


def test_without_activations_the_losses_name_the_rank(results) -> None:
    for r in results:
        (inc,) = [i for i in r["loss_only"]["incidents"] if i["kind"] == "nonfinite"]
        assert inc["rank"] == 1 and inc["phase"] == "forward"
        assert inc["ranks"][1] == ("rank 1: the loss was nan; its replay: the model's input "
                                   "already held nan (first read by linear in 0)")


def test_the_summary_says_which_rank_and_where(results) -> None:
    inc = gs.Incident.from_dict(
        next(i for i in results[0]["detected"]["incidents"] if i["kind"] == "nonfinite"))
    head = inc.summary().splitlines()[0]
    assert head.startswith("step 2: the model's input already held nan before the forward ran "
                           "(first read by linear in 0) on rank 1 first"), head


def test_a_nan_made_in_one_ranks_backward_is_named_by_every_rank(results) -> None:
    """Ground truth: at step BAD only rank 1's own gradient is NaN (plain torch, without the
    reduction); every forward and loss is finite. Every rank names rank 1, the backward's
    sqrt and the line that made it."""
    assert results[0]["backward"]["local_finite"][BAD] is True
    assert results[1]["backward"]["local_finite"][BAD] is False
    assert results[1]["backward"]["local_finite"][:BAD] == [True] * BAD
    line = next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text.rstrip().endswith("# SQRT-LINE") and "torch.sqrt" in text)
    for r in results:
        (inc,) = [i for i in r["backward"]["incidents"] if i["kind"] == "nonfinite"]
        assert inc["step"] == BAD and inc["rank"] == 1, inc
        assert inc["phase"] == "backward" and inc["op"] == "SqrtBackward0", inc
        assert inc["line"].endswith(f"test_first_rank.py:{line}"), inc["line"]
        assert inc["ranks"][0].endswith("its micro-batch, replayed alone, gave finite "
                                        "gradients: downstream"), inc["ranks"]
        assert "its replay: the backward made" in inc["ranks"][1], inc["ranks"]
        assert len(inc["ranks"]) == 2  # no "which rank is not known" line
    assert results[0]["backward"]["incidents"] == results[1]["backward"]["incidents"]
    # the replays ran in the process (fork is refused under torch.distributed): training
    # went on bitwise as without the monitor, on every rank
    assert [r["backward"]["bitwise"] for r in results] == [True, True]


def test_ranks_that_train_apart_replay_their_own_and_wait_for_no_one(results) -> None:
    """Without a gradient reduction only rank 1's gradients go NaN: it replays its own
    micro-batch (no exchange: the ranks' figures differ) and rank 0 records nothing."""
    assert not [i for i in results[0]["independent"]["incidents"] if i["kind"] == "nonfinite"]
    (inc,) = [i for i in results[1]["independent"]["incidents"] if i["kind"] == "nonfinite"]
    assert inc["step"] == BAD and inc["op"] == "linear" and inc["input"] == "the model's input"
    assert inc["replayed"] and not inc["note"].startswith("replayed on rank")


def test_under_fsdp2_every_rank_replays_together_and_names_rank_1(results) -> None:
    """FSDP2 (sharded parameters: the forward gathers them): the ranks replay at once, and
    with nothing else watched (no activations=, no loss) the replays name rank 1 and the
    input that held the NaN; rank 0's replay stays finite."""
    for r in results:
        (inc,) = [i for i in r["fsdp"]["incidents"] if i["kind"] == "nonfinite"]
        assert inc["step"] == BAD and inc["rank"] == 1, inc
        assert inc["phase"] == "forward" and inc["op"] == "linear" and inc["module"] == "0"
        assert inc["input"] == "the model's input", inc
        assert inc["ranks"][0].endswith(
            "its micro-batch, replayed with every rank, stayed finite on this rank: downstream")
        assert inc["ranks"][1].endswith(
            "its replay: the model's input already held nan (first read by linear in 0)")
    assert results[0]["fsdp"]["incidents"] == results[1]["fsdp"]["incidents"]


def test_under_fsdp2_a_nan_made_in_one_ranks_backward_is_named_training_bitwise(results) -> None:
    """The sqrt plant under FSDP2: only rank 1's own gradient is NaN (plain torch on the
    gathered weights). Every rank names rank 1, SqrtBackward0 and its line; the replays
    (forward and backward again, with the collectives) leave training bitwise as without
    the monitor: every rank's parameter shards, momentum and the RNG's next draw."""
    assert [r["fsdp_backward"]["local_finite"][BAD] for r in results] == [True, False]
    line = next(n for n, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if text.rstrip().endswith("# SQRT-LINE") and "torch.sqrt" in text)
    for r in results:
        (inc,) = [i for i in r["fsdp_backward"]["incidents"] if i["kind"] == "nonfinite"]
        assert inc["step"] == BAD and inc["rank"] == 1, inc
        assert inc["phase"] == "backward" and inc["op"] == "SqrtBackward0", inc
        assert inc["line"].endswith(f"test_first_rank.py:{line}"), inc["line"]
        assert inc["module"] is None or inc["module"] == "", inc
    assert results[0]["fsdp_backward"]["incidents"] == results[1]["fsdp_backward"]["incidents"]
    assert [r["fsdp_backward"]["bitwise"] for r in results] == [True, True]


def test_a_spike_from_one_ranks_batch_is_named_by_every_rank(results) -> None:
    """Ground truth: at step SPIKE only rank 1's own loss jumped (plain torch). Every rank
    records the same spike, from rank 1, and each rank's line gives its own loss's jump."""
    own = [r["spike"]["losses"] for r in results]
    assert own[1][SPIKE] > 100 * max(own[1][:SPIKE]) and own[0][SPIKE] < 3 * max(own[0][:SPIKE])
    for r in results:
        (inc,) = [i for i in r["spike"]["incidents"] if i["kind"] == "spike"]
        assert inc["step"] == SPIKE and inc["rank"] == 1, inc["ranks"]
        assert inc["ranks"][1].startswith(f"rank 1: its loss was {own[1][SPIKE]:.4g}, ")
        assert inc["ranks"][0].startswith(f"rank 0: its loss was {own[0][SPIKE]:.4g}, ")
        assert gs.Incident.from_dict(inc).spike_sentence().startswith(
            f"spike x{inc['ratio']:.3g} at step {SPIKE} (")
        assert " from rank 1" in gs.Incident.from_dict(inc).spike_sentence()
    zero, one = (next(i for i in r["spike"]["incidents"] if i["kind"] == "spike")
                 for r in results)
    for key in ("step", "rank", "ranks", "changes"):
        assert zero[key] == one[key], key
    # the loss a rank watches is its own: rank 1's jumped first, rank 0 saw the gradients'
    assert (zero["signal"], one["signal"]) == ("grad_norm", "loss")
    # each rank replayed its own micro-batch: rank 1 lists its examples, rank 0 says whose
    assert one["replayed"] and one["samples"] and one["micro_batch"] == 0
    assert zero["samples"] == [] and not zero["replayed"]
    assert zero["note"] == ("its examples are rank 1's to name: each rank replays only its own "
                            "micro-batch (rank 1's incident lists them)")


def test_under_fsdp2_a_spike_from_one_ranks_batch_is_named_too(results) -> None:
    """The losses ride in the table's all-gather; no rank replays per-sample norms of a
    sharded model, and every rank's note says so as it is (no rank lists examples)."""
    own = [r["spike_fsdp"]["losses"] for r in results]
    assert own[1][SPIKE] > 100 * max(own[1][:SPIKE]) and own[0][SPIKE] < 3 * max(own[0][:SPIKE])
    for r in results:
        (inc,) = [i for i in r["spike_fsdp"]["incidents"] if i["kind"] == "spike"]
        assert inc["step"] == SPIKE and inc["rank"] == 1, inc["ranks"]
        assert inc["samples"] == [] and "rank 1's to name" not in (inc["note"] or ""), inc
    zero, one = (next(i for i in r["spike_fsdp"]["incidents"] if i["kind"] == "spike")
                 for r in results)
    assert zero["ranks"] == one["ranks"] and zero["note"] == one["note"]


def test_a_spike_from_every_ranks_batch_names_no_rank(results) -> None:
    for r in results:
        (inc,) = [i for i in r["spike_together"]["incidents"] if i["kind"] == "spike"]
        assert inc["step"] == SPIKE and inc["rank"] is None
        assert inc["ranks"][-1].startswith("no rank's own loss jumped apart from the others'")


GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "distributed.md"


@pytest.mark.parametrize("case, kind", [("spike", "spike"), ("backward", "nonfinite")])
def test_the_distributed_guide_shows_rank_0s_incident_as_recorded(results, case: str,
                                                                   kind: str) -> None:
    """The guide's examples are rank 0's ``Incident.summary()`` and ``Incident.ranks`` of
    these runs, as they are recorded."""
    inc = gs.Incident.from_dict(next(i for i in results[0][case]["incidents"]
                                     if i["kind"] == kind))
    shown = inc.summary() + "\n\n" + "\n".join(inc.ranks) + "\n"
    assert f"```text\n{shown}```" in GUIDE.read_text(encoding="utf-8"), shown
