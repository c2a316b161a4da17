"""Parallel parity: 2 gloo processes on the CPU each record a data-parallel step in which a
second all-reduce doubles ``fc2.weight``'s gradient, and the same step under FSDP2 with that
sharded gradient doubled (samples/numerics/ddp_doubled.py), and save their runs;
``compare_runs`` of a single-process run on the same global batch against each rank's file
names ``fc2.weight`` with the ratio 2.0, and nothing else. Ground truth: each rank's real
gradients (saved by the worker; FSDP2's as ``full_tensor()``) against the single process's
real gradients."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
import torch.distributed as dist
from conftest import SAMPLES, spawn_ranks

import gradscope as gs

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="needs torch.distributed with gloo",
)
FOLDER = SAMPLES / "numerics"


def _sample():
    sys.path.insert(0, str(FOLDER))  # the spawned processes import the sample by its name
    spec = importlib.util.spec_from_file_location("ddp_doubled", FOLDER / "ddp_doubled.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ddp_doubled"] = module
    spec.loader.exec_module(module)
    return module


def _spawn(s, tmp_path):
    """The sample's workers, in a folder of their own (a fresh rendezvous file), with the one
    retry of ``conftest.spawn_ranks``."""

    def folder(attempt: int):
        out = tmp_path / f"try{attempt}"
        out.mkdir()
        return out

    return spawn_ranks(s.worker, s.WORLD, folder, lambda d: (str(d),))


def test_a_gradient_doubled_under_ddp_is_named_with_ratio_two(tmp_path):
    s = _sample()
    try:
        tmp_path = _spawn(s, tmp_path)
    finally:
        sys.path.remove(str(FOLDER))
        sys.modules.pop("ddp_doubled", None)
    s.reference(str(tmp_path))
    # ground truth: one process's gradients on the global batch, in plain torch
    m = s.build()
    s.loss_fn(m(torch.cat([s.batch(r) for r in range(s.WORLD)]))).backward()
    truth = {n: p.grad for n, p in m.named_parameters()}
    reference = gs.NumericsRun.load(tmp_path / "reference.json")
    for rank, kind in [(r, k) for r in range(s.WORLD) for k in ("ddp", "fsdp")]:
        grads = torch.load(tmp_path / (f"grads{rank}.pt" if kind == "ddp" else
                                       f"fsdp_grads{rank}.pt"))
        ratios = {n: (grads[n].norm() / truth[n].norm()).item() for n in truth}
        wrong = [n for n in truth if not torch.allclose(grads[n], truth[n], rtol=1e-4,
                                                          atol=1e-7)]
        assert wrong == ["fc2.weight"]
        run = gs.NumericsRun.load(tmp_path / (f"rank{rank}.json" if kind == "ddp" else
                                              f"fsdp{rank}.json"))
        assert (run.rank, run.world) == (rank, s.WORLD)
        d = gs.compare_runs(reference, run)
        assert not d.ok
        assert [p.name for p in d.bad_params] == wrong
        assert d.bad_params[0].ratio == pytest.approx(ratios["fc2.weight"], rel=1e-5)
        assert d.bad_params[0].ratio == pytest.approx(2.0, rel=1e-4)
        assert d.first is not None and (d.first.phase, d.first.name) == ("param", "fc2.weight")
        assert "different world sizes" in d.summary()
        assert not run.notes  # FSDP2's gradients summarised without a gather
        for p in d.params:  # each gradient's norm is the full tensor's
            assert p.ratio == pytest.approx(ratios[p.name], rel=1e-5)
