"""The monitor's full statistics come from one table (``monitor.stats.FULL_STATS``).

* The table and the public record agree: every entry names a ``float | None`` field of
  ``ParamStats``, and every field of ``ParamStats`` is the norm, a table entry, a count or the
  update ratio (a field nothing fills fails here, with the entry to add).
* Nothing downstream hard-codes a statistic: an entry swapped for another measurement (the
  largest gradient element instead of max |g|, the sum of squares instead of the sum of |g|)
  reaches the parameter records, the module records, the GradScaler's unscaling, the JSON
  Lines log and its reading back, checked against the same figures computed in plain torch.
"""

from __future__ import annotations

import typing
from dataclasses import fields, replace

import pytest
import torch
from torch import nn

import gradscope as gs
from gradscope.monitor import log as monitor_log
from gradscope.monitor import stats as S


def test_the_table_and_param_stats_agree() -> None:
    hints = typing.get_type_hints(monitor_log.ParamStats)
    names = [f.name for f in fields(monitor_log.ParamStats)]
    table = [stat.field for stat in S.FULL_STATS]
    others = {"norm", "nan", "inf", "update_ratio"}
    missing = [n for n in names if n not in others and n not in table]
    assert not missing, f"ParamStats fields without a FULL_STATS entry: {missing}"
    for name in table:
        assert name in names, f"add `{name}: float | None = None` to ParamStats"
        assert hints[name] == float | None
    assert len(set(table)) == len(table)
    assert all(stat.combine in ("max", "sum") for stat in S.FULL_STATS)
    assert monitor_log.STAT_FIELDS == tuple(names)
    assert S.FULL_ROWS == 1 + len(S.FULL_STATS)


def _signed_max(ordered: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([t.reshape(-1).amax().to(torch.float64) for t in ordered])


def _square_sums(ordered: list[torch.Tensor]) -> torch.Tensor:
    return torch.stack([t.to(torch.float64).square().sum() for t in ordered])


@pytest.fixture
def swapped(monkeypatch: pytest.MonkeyPatch) -> None:
    """max_abs measured as the largest element, mean_abs as the mean square."""
    table = list(S.FULL_STATS)
    at = {stat.field: k for k, stat in enumerate(table)}
    table[at["max_abs"]] = replace(table[at["max_abs"]], rows=_signed_max)
    table[at["mean_abs"]] = replace(table[at["mean_abs"]], rows=_square_sums)
    monkeypatch.setattr(S, "FULL_STATS", tuple(table))


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3))


def test_a_swapped_entry_reaches_the_records_and_the_log(swapped: None, tmp_path) -> None:
    model = _model()
    outs: list[torch.Tensor] = []
    model[2].register_full_backward_hook(lambda m, gi, go: outs.append(go[0].detach().clone()))
    mon = gs.GradMonitor(model, modules=True)
    x = torch.randn(4, 6)
    model(x).pow(2).sum().backward()

    st = mon.history[-1]
    for name, p in model.named_parameters():
        g = p.grad.double()
        ps = st.params[name]
        assert ps.max_abs == pytest.approx(g.max().item(), rel=1e-12)
        assert ps.mean_abs == pytest.approx(g.square().mean().item(), rel=1e-9)
        assert ps.zero_frac == (g == 0).double().mean().item()
    (go,) = outs
    mod = st.modules["2"]
    assert mod.max_abs == pytest.approx(go.double().max().item(), rel=1e-12)
    assert mod.mean_abs == pytest.approx(go.double().square().mean().item(), rel=1e-9)
    mon.to_jsonl(tmp_path / "log.jsonl")
    back = gs.read_jsonl(tmp_path / "log.jsonl").steps[-1]
    assert back.params == st.params
    mon.remove()


def test_a_swapped_entry_is_unscaled_as_the_table_says(swapped: None) -> None:
    """The GradScaler's unscaling follows ``scales``: the largest element scales with the
    gradients; the sum of squares is marked as scaling too (linearly, which is what the
    entry says), the zero count does not scale."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    mon = gs.GradMonitor(model, optimizer=opt, scaler=scaler)
    x = torch.randn(4, 6)
    scaler.scale(model(x).pow(2).sum()).backward()
    grads = {n: p.grad.double() / 1024.0 for n, p in model.named_parameters()}
    scaler.step(opt)
    scaler.update()

    st = mon.history[-1]
    for name, g in grads.items():
        ps = st.params[name]
        assert ps.max_abs == pytest.approx(g.max().item(), rel=1e-9)
        # the sum of squares of scaled gradients divided once by the scale: what `scales`
        # promises (linear), 1024 times the true mean square
        assert ps.mean_abs == pytest.approx(g.square().mean().item() * 1024.0, rel=1e-6)
        assert ps.zero_frac == (g == 0).double().mean().item()
    mon.remove()
