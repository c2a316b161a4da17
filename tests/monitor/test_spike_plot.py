"""The spike plot (``mon.plot``): the series behind it (``plot_series``) against figures
computed here from torch's own ``.grad`` and the documented rule (the median of the last
``spike_window`` logged values, the first ``spike_warmup`` ignored, once 5 are in; the limit
is that median x ``spike``), and the PNG read back as an image."""

from __future__ import annotations

import statistics

import pytest
import torch

import gradscope as gs

pytest.importorskip("matplotlib")

WARMUP, WINDOW, FACTOR = 2, 6, 10.0
SCALES = [1.0, 0.9, 1.1, 1.0, 1.2, 0.8, 1.0, 1.1, 0.9, 100.0, 1.0, 1.05, 0.95, 1.0]
SPIKE_AT = SCALES.index(100.0)


def _run(loss: bool) -> tuple[gs.GradMonitor, list[float], list[float]]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # weights fixed: norms = the scales'
    x = torch.randn(8, 4)
    norms, losses = [], []
    mon = gs.GradMonitor(model, optimizer=opt, spike=FACTOR, spike_window=WINDOW,
                         spike_warmup=WARMUP)
    with mon:
        for s in SCALES:
            opt.zero_grad()
            out = s * model(x).square().mean()
            if loss:
                mon.observe_loss(out)
            out.backward()
            norms.append(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
                         .item())
            losses.append(out.item())
            opt.step()
    return mon, norms, losses


def _band(values: list[float]) -> tuple[list[int], list[float]]:
    steps, medians = [], []
    kept: list[float] = []
    for i, v in enumerate(values[WARMUP:], start=WARMUP):
        if len(kept) >= 5:
            steps.append(i)
            medians.append(statistics.median(kept[-WINDOW:]))
        kept.append(v)
    return steps, medians


def test_series_has_the_band_and_the_spike(tmp_path) -> None:
    from gradscope.monitor.views import plot_series

    mon, norms, losses = _run(loss=True)
    series = plot_series(mon.log)
    assert series["total"] == pytest.approx(norms, rel=1e-5)
    assert series["loss"] == pytest.approx(losses, rel=1e-5)
    for prefix, values in (("", norms), ("loss_", losses)):
        steps, medians = _band(values)
        assert series[f"{prefix}baseline_steps"] == steps
        assert series[f"{prefix}baseline"] == pytest.approx(medians, rel=1e-5)
        assert series[f"{prefix}limit"] == pytest.approx([FACTOR * m for m in medians],
                                                         rel=1e-5)
    # one spike, at the step whose value left the band, with the value/median ratio
    inside = [v <= lim for v, lim, s in zip(
        [norms[s] for s in series["baseline_steps"]], series["limit"],
        series["baseline_steps"], strict=True)]
    assert inside.count(False) == 1
    ((step, signal, ratio),) = series["spikes"]
    assert step == SPIKE_AT and signal in ("grad_norm", "loss")
    expected = {"grad_norm": norms, "loss": losses}[signal]
    med = _band(expected)[1][_band(expected)[0].index(SPIKE_AT)]
    assert ratio == pytest.approx(expected[SPIKE_AT] / med, rel=1e-5)
    image = _png(mon, tmp_path / "spike.png")
    assert image.shape[1] >= 1000 and image.shape[0] >= 700


def test_without_a_loss_the_plot_has_no_loss_panel(tmp_path) -> None:
    from gradscope.monitor.views import plot_series

    mon, norms, _ = _run(loss=False)
    series = plot_series(mon.log)
    assert series["loss"] == [] and series["loss_baseline"] == []
    assert [s for s, _, _ in series["spikes"]] == [SPIKE_AT]
    _png(mon, tmp_path / "norm.png")


def _png(mon: gs.GradMonitor, path) -> object:
    import matplotlib.image

    out = mon.plot(path)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(str(out))  # a valid PNG, decoded
    assert image.ndim == 3 and image.std() > 0.01  # not a blank canvas
    return image
