"""GradscopeCallback on a real (tiny) Lightning run on the CPU, offline. Ground truth is read
in the LightningModule's own on_before_optimizer_step (after accumulation, before Lightning
clips), from .grad."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

pl = pytest.importorskip("lightning.pytorch")

import gradscope as gs  # noqa: E402
from gradscope.integrations.lightning import GradscopeCallback  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*is deprecated"),
]


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))
        self.truth: list[float] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def on_before_optimizer_step(self, optimizer) -> None:
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        self.truth.append(torch.nn.utils.get_total_norm(grads).item())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def _data() -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 6, generator=g)
    ds = torch.utils.data.TensorDataset(x, x[:, :1] * 3.0)
    return torch.utils.data.DataLoader(ds, batch_size=8)


def _fit(callback: GradscopeCallback, module: Regression | None = None, **kwargs) -> Regression:
    module = module or Regression()
    trainer = pl.Trainer(
        max_steps=4,
        accumulate_grad_batches=2,
        gradient_clip_val=0.01,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
        **kwargs,
    )
    trainer.fit(module, _data())
    return module


def test_total_norm_is_the_accumulated_gradient_before_clipping() -> None:
    callback = GradscopeCallback(full_every=1)
    module = _fit(callback)
    mon = callback.monitor
    assert isinstance(mon, gs.GradMonitor)
    assert len(module.truth) == 4
    assert [st.step for st in mon.history] == [0, 1, 2, 3]
    assert [st.total_norm for st in mon.history] == pytest.approx(module.truth, rel=1e-6)
    assert min(module.truth) > 0.01  # gradient_clip_val=0.01 clipped every step
    assert list(mon.history[0].params) == [n for n, _ in module.named_parameters()]
    assert all(ps.update_ratio is not None for ps in mon.history[-1].params.values())
    # no hook left on the module or the optimizer
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in module.modules())
    assert all(not p._post_accumulate_grad_hooks for p in module.parameters())
    opt = module.optimizers(use_pl_optimizer=False)
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks


def test_alerts_go_to_lightnings_log(caplog) -> None:
    callback = GradscopeCallback(explode=1e-6)
    with caplog.at_level(logging.WARNING, logger="lightning.pytorch"):
        _fit(callback)
    (alert,) = callback.monitor.alerts
    assert alert.kind == "exploding"
    assert f"gradscope exploding: {alert.message}" in [r.getMessage() for r in caplog.records]


def test_hooks_are_removed_when_training_fails() -> None:
    class Failing(Regression):
        def training_step(self, batch, batch_idx):
            if self.global_step == 1:
                raise RuntimeError("data trouble")
            return super().training_step(batch, batch_idx)

    callback = GradscopeCallback()
    module = Failing()
    with pytest.raises(RuntimeError, match="data trouble"):
        _fit(callback, module)
    assert len(callback.monitor.history) == 1
    assert all(not p._post_accumulate_grad_hooks for p in module.parameters())
