"""GradMonitor across processes: 2 gloo ranks on the CPU.

Ground truth comes from plain torch in the test, never from the monitor: under data
parallelism every rank's averaged gradient is the gradient of the global batch, computed here
on one plain replica over both ranks' batches (or from the all-reduced gradients); under FSDP2
it is ``DTensor.full_tensor()`` of each sharded gradient. At every logged step the worst
relative error of every per-parameter and total norm must stay below 1e-4."""

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

WORLD = 2
STEPS = 3
TOL = 1e-4

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)


def _model(width: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, width), nn.ReLU(), nn.Linear(width, 3))


def _batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(8, 6, generator=torch.Generator().manual_seed(100 * rank + step))


def _loss(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return model(x).square().mean()


def _rel(got: float, want: float) -> float:
    return abs(got - want) / max(abs(want), 1e-30)


class Replica:
    """A plain copy of the model, trained on the global batch with the same optimizer, whose
    .grad at each step is the ground truth of a data-parallel run (mean over ranks)."""

    def __init__(self, lr: float = 0.1) -> None:
        self.model = _model()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=lr)

    def step(self, step: int) -> dict[str, float]:
        self.opt.zero_grad()
        _loss(self.model, torch.cat([_batch(r, step) for r in range(WORLD)])).backward()
        truth = {n: p.grad.norm().item() for n, p in self.model.named_parameters()}
        truth["__total__"] = torch.nn.utils.get_total_norm(
            [p.grad for p in self.model.parameters()]
        ).item()
        self.opt.step()
        return truth


def _errors(mon: gs.GradMonitor, truths: list[dict[str, float]], prefix: str = "") -> dict:
    """Worst relative error over every logged step, and what else the test checks."""
    worst = 0.0
    for st, truth in zip(mon.history, truths, strict=True):
        for name, want in truth.items():
            got = st.total_norm if name == "__total__" else st.params[prefix + name].norm
            worst = max(worst, _rel(got, want))
    return {
        "worst": worst,
        "steps": [st.step for st in mon.history],
        "scopes": [st.scope for st in mon.history],
        "measured_at": [st.measured_at for st in mon.history],
        "names": list(mon.history[0].params),
        "distributed": mon.distributed,
    }


def _ddp_wrapper(rank: int) -> dict:
    ddp = nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    replica, truths = Replica(), []
    with gs.GradMonitor(ddp) as mon:  # no optimizer: every backward is a step
        for step in range(STEPS):
            opt.zero_grad()
            _loss(ddp, _batch(rank, step)).backward()
            opt.step()
            truths.append(replica.step(step))
    return _errors(mon, truths, prefix="module.")


_READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__")


def _ddp_transfers(rank: int) -> dict:
    """Host reads per step of a DDP loop (optimizer=, replay on, full statistics every logged
    step), minus those of the same loop without a monitor."""
    counts: dict[bool, list[int]] = {}
    for watched in (False, True):
        ddp = nn.parallel.DistributedDataParallel(_model())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        mon = gs.GradMonitor(ddp.module, optimizer=opt, every=2, full_every=1) if watched else None
        seen = [0]
        originals = {name: getattr(torch.Tensor, name) for name in _READS}

        def counted(original, seen=seen):
            def read(t, *args, **kwargs):
                seen[0] += 1
                return original(t, *args, **kwargs)

            return read

        per_step = []
        try:
            for name, original in originals.items():
                setattr(torch.Tensor, name, counted(original))
            for step in range(5):
                before = seen[0]
                opt.zero_grad()
                _loss(ddp, _batch(rank, step)).backward()
                opt.step()
                per_step.append(seen[0] - before)
        finally:
            for name, original in originals.items():
                setattr(torch.Tensor, name, original)
        if mon is not None:
            mon.remove()
        counts[watched] = per_step
    return {"extra": [w - p for w, p in zip(counts[True], counts[False], strict=True)]}


def _ddp_inner(rank: int) -> dict:
    ddp = nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    replica, truths = Replica(), []
    with gs.GradMonitor(ddp.module, optimizer=opt) as mon:
        for step in range(STEPS):
            opt.zero_grad()
            _loss(ddp, _batch(rank, step)).backward()
            opt.step()
            truths.append(replica.step(step))
    return _errors(mon, truths)


def _ddp_built_before_wrapping(rank: int) -> dict:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = gs.GradMonitor(model, optimizer=opt)
    ddp = nn.parallel.DistributedDataParallel(model)
    replica, truths = Replica(), []
    for step in range(STEPS):
        opt.zero_grad()
        _loss(ddp, _batch(rank, step)).backward()
        opt.step()
        truths.append(replica.step(step))
    mon.remove()
    return _errors(mon, truths)


def _manual_allreduce(rank: int, **monitor_options) -> dict:
    """Hand-written data parallelism: backward, then all-reduce and average every .grad."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    replica, truths = Replica(), []
    with gs.GradMonitor(model, optimizer=opt, **monitor_options) as mon:
        for step in range(STEPS):
            opt.zero_grad()
            _loss(model, _batch(rank, step)).backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
                p.grad /= WORLD
            opt.step()
            truths.append(replica.step(step))
    return _errors(mon, truths)


def _independent(rank: int) -> dict:
    """Each rank trains a model of its own (of another width): its own figures, labelled."""
    model = _model(width=8 + 8 * rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    truths = []
    with gs.GradMonitor(model, optimizer=opt) as mon:
        for step in range(STEPS):
            opt.zero_grad()
            _loss(model, _batch(rank, step)).backward()
            truth = {n: p.grad.norm().item() for n, p in model.named_parameters()}
            truth["__total__"] = torch.nn.utils.get_total_norm(
                [p.grad for p in model.parameters()]
            ).item()
            truths.append(truth)
            opt.step()
    return _errors(mon, truths)


class Gated(nn.Module):
    """Two layers scaled by ``1 + sqrt(gain[0] * s)``, ``s`` the mean magnitude of the input's
    first feature: a batch whose first feature is all zero makes d/d gain[0] = 0/0 = NaN and
    leaves every other gradient finite."""

    def __init__(self, width: int) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(6, width)
        self.fc2 = nn.Linear(width, 3)
        self.gain = nn.Parameter(torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x[:, 0].abs().mean()
        h = self.fc2(torch.relu(self.fc1(x)))
        return h * (1 + torch.sqrt(self.gain[0] * s)) + 0.01 * h * self.gain[1:].sum()


def _fsdp(rank: int, use_opt: bool, calls: list[str]) -> dict:
    from torch.distributed.fsdp import fully_shard

    model = Gated(width=15)  # 15 rows: uneven shards (8 and 7 rows)
    for layer in (model.fc1, model.fc2):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    truths, maxima, nan_counts = [], [], []
    mon = gs.GradMonitor(model, optimizer=opt if use_opt else None, full_every=2)
    start = len(calls)
    for step in range(STEPS):
        opt.zero_grad()
        x = _batch(rank, step)
        if step == 2 and rank == 1:
            x[:, 0] = 0.0  # gain[0]'s gradient on rank 1 is NaN; the average is NaN too
        _loss(model, x).backward()
        full = {n: p.grad.full_tensor() for n, p in model.named_parameters()}
        truth = {n: g.norm().item() for n, g in full.items() if torch.isfinite(g).all()}
        if len(truth) == len(full):
            truth["__total__"] = torch.nn.utils.get_total_norm(list(full.values())).item()
        truths.append(truth)
        maxima.append({n: g.abs().max().item() for n, g in full.items()})
        nan_counts.append({n: int(torch.isnan(g).sum()) for n, g in full.items()})
        opt.step()
    mon.remove()
    out = _errors(mon, truths)
    out["max_abs_err"] = max(
        _rel(st.params[n].max_abs, maxima[i][n])
        for i, st in enumerate(mon.history)
        if st.full
        for n in st.params
        if math.isfinite(maxima[i][n])
    )
    out["nan"] = [{n: ps.nan for n, ps in st.params.items()} for st in mon.history]
    out["nan_truth"] = nan_counts
    out["nan_alerts"] = [(a.kind, a.step, list(a.names)) for a in mon.alerts]
    out["collectives"] = len(calls) - start
    out["model_names"] = [n for n, _ in model.named_parameters()]
    return out


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    from gradscope.monitor import distributed as _monitor

    calls: list[str] = []
    real = _monitor._gather_into

    def counted(*args, **kwargs):
        calls.append("gather")
        return real(*args, **kwargs)

    _monitor._gather_into = counted
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = {
                "ddp_wrapper": _ddp_wrapper(rank),
                "ddp_inner": _ddp_inner(rank),
                "ddp_transfers": _ddp_transfers(rank),
                "ddp_before_wrap": _ddp_built_before_wrapping(rank),
                "manual": _manual_allreduce(rank),
                "independent": _independent(rank),
                "fsdp": _fsdp(rank, True, calls),
                "fsdp_no_opt": _fsdp(rank, False, calls),
            }
            before = len(calls)
            result["manual_declared"] = _manual_allreduce(
                rank, replicated=True, measure="optimizer"
            )
            result["manual_declared"]["collectives"] = len(calls) - before
        result["warnings"] = [
            f"{w.category.__name__}: {w.message}"
            for w in caught
            if "deprecat" in str(w.message).lower() or "gradscope" in w.filename
        ]
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        _monitor._gather_into = real
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> list[dict]:
    out = spawn_ranks(_worker, WORLD, lambda a: tmp_path_factory.mktemp(f"dist{a}"),
                      lambda d: (str(d / "init"), str(d)))
    return read_ranks(out, WORLD)


GLOBAL_CASES = ["ddp_wrapper", "ddp_inner", "ddp_before_wrap", "manual", "manual_declared"]


@pytest.mark.parametrize("case", GLOBAL_CASES)
def test_data_parallel_norms_are_those_of_the_global_batch(results, case: str) -> None:
    """DDP however it is wrapped, and hand-written all-reduce: no sqrt(world) inflation."""
    for r in results:
        got = r[case]
        assert got["steps"] == list(range(STEPS))
        assert got["worst"] < TOL, got
        assert got["scopes"] == ["global"] * STEPS
        assert got["distributed"].startswith("replicated across 2 ranks")


def test_ddp_keeps_the_users_names(results) -> None:
    assert results[0]["ddp_wrapper"]["names"][0] == "module.0.weight"
    assert results[0]["ddp_inner"]["names"][0] == "0.weight"


def test_hand_written_all_reduce_is_detected_and_measured_at_the_step(results) -> None:
    """The gradients differ across ranks when backward ends and agree at optimizer.step(): the
    monitor measures at the step from the first logged step on."""
    got = results[0]["manual"]
    assert got["measured_at"] == ["optimizer"] * STEPS
    assert "(detected)" in got["distributed"]
    declared = results[0]["manual_declared"]
    assert "(declared)" in declared["distributed"]
    assert declared["collectives"] == 0  # declared: nothing to check across ranks


def test_independent_models_are_labelled_per_rank(results) -> None:
    for rank, r in enumerate(results):
        got = r["independent"]
        assert got["worst"] < TOL  # this rank's own gradients, exactly
        assert got["scopes"] == [f"rank {rank}"] * STEPS
        assert got["distributed"].startswith(f"rank {rank} of 2: the ranks' gradients differ")


@pytest.mark.parametrize("case", ["fsdp", "fsdp_no_opt"])
def test_fsdp2_norms_equal_full_tensor_norms(results, case: str) -> None:
    r0, r1 = results[0][case], results[1][case]
    for r in (r0, r1):
        assert r["steps"] == list(range(STEPS))
        assert r["worst"] < TOL, r
        assert r["max_abs_err"] < TOL
        assert r["names"] == r["model_names"]  # as the user's model names them
        assert sorted(r["names"]) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight", "gain"]
        assert r["scopes"] == ["global"] * STEPS
        # one collective per logged step, and one more on the step with a NaN (its counts);
        # with optimizer= the step moves to the host at optimizer.step()'s pre-hook (a bad
        # step is replayed there, by every rank together), so a full-statistics step's update
        # rows, made after it, are gathered on their own (full_every=2: steps 0 and 2), to
        # ride in the next step's one host transfer
        full = len(range(0, STEPS, 2)) if case == "fsdp" else 0
        assert r["collectives"] == STEPS + 1 + full
    # the NaN of rank 1's gain[0] gradient at step 2, averaged into rank 0's shard: counted
    # once, on every rank
    assert r0["nan"] == r1["nan"] == r0["nan_truth"]
    assert r0["nan"][2]["gain"] == 1
    assert r0["nan_alerts"] == r1["nan_alerts"] == [["nan", 2, ["gain"]]]


def test_ddp_one_host_transfer_per_logged_step(results) -> None:
    for r in results:
        assert r["ddp_transfers"]["extra"] == [1, 0, 1, 0, 1]


def test_no_deprecation_or_gradscope_warning_on_any_rank(results) -> None:
    assert [r["warnings"] for r in results] == [[], []]
