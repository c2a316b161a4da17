"""Spikes under the Lightning callback (``tests/spike_common.py``: the set-up and the ground
truths). The batches are dicts with an ``idx`` entry (the default collate of dict items)."""

from __future__ import annotations

import logging

import pytest
import torch
from test_monitor import Transfers

pl = pytest.importorskip("lightning.pytorch")

from spike_common import (  # noqa: E402
    BATCH,
    OPTIONS,
    PLANTED_STEP,
    STEPS,
    _items,
    _net,
    brute_force,
    check_spike,
    planted_batch,
)

from gradscope.integrations.lightning import GradscopeCallback  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*is deprecated"),
]


class _Module(pl.LightningModule):
    def __init__(self, coupled: bool = False) -> None:
        super().__init__()
        self.net = _net()
        self.coupled = coupled
        self.losses: list[float] = []
        self.snapshot: list[torch.Tensor] = []

    def training_step(self, batch, batch_idx):
        err = self.net(batch["x"]) - batch["labels"]
        loss = err.square().mean()
        if self.coupled:  # each example's loss depends on the others' (its error's spread)
            loss = loss + (err - err.mean()).square().mean()
        return loss

    def on_train_batch_start(self, batch, batch_idx) -> None:
        if batch_idx == PLANTED_STEP:
            self.snapshot = [p.detach().clone() for p in self.parameters()]

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.losses.append(outputs["loss"].item())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-2)


def _run(callback, coupled: bool = False) -> _Module:
    module = _Module(coupled)
    data = torch.utils.data.DataLoader(_items(), batch_size=BATCH, shuffle=False)
    trainer = pl.Trainer(
        max_steps=STEPS, accelerator="cpu", devices=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[callback] if callback is not None else [],
    )
    trainer.fit(module, data)
    return module


def test_spike_names_the_planted_example_by_its_id(monkeypatch, caplog) -> None:
    counter = Transfers(monkeypatch)
    plain = _run(None)
    without = counter.count
    callback = GradscopeCallback(log=False, **OPTIONS)
    with caplog.at_level(logging.WARNING, logger="lightning.pytorch"):
        watched = _run(callback)
    transfers = counter.count - without - without  # the watched run's, less the plain one's
    monkeypatch.undo()
    mon = callback.monitor
    assert mon is not None and len(mon.history) == STEPS
    assert transfers == STEPS  # one host transfer per logged step
    check_spike(mon, watched.losses)  # the loss is training_step's, read by the module
    told = [r.getMessage() for r in caplog.records if "gradscope spike" in r.getMessage()]
    inc = next(i for i in mon.incidents if i.kind == "spike")
    assert len(told) == 1 and f"sample {inc.samples[0].id} " in told[0]  # in Lightning's log
    for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(a, b)  # training bitwise as without the callback
    # per-sample norms (training_step on each example alone, scaled as the batch loss
    # reduces) = brute force on the weights the planted step started with
    net = _net()
    with torch.no_grad():
        for p, v in zip(net.parameters(), watched.snapshot, strict=True):
            p.copy_(v)
    truth = brute_force(net, planted_batch())
    assert len(inc.samples) == BATCH
    for s in inc.samples:
        assert s.norm == pytest.approx(truth[s.id], rel=1e-4)


def test_a_coupled_loss_is_said_not_split() -> None:
    callback = GradscopeCallback(log=False, **OPTIONS)
    _run(callback, coupled=True)
    assert callback.monitor is not None
    inc = next(i for i in callback.monitor.incidents if i.kind == "spike")
    assert inc.samples == []
    assert inc.note is not None and "not a sum or mean" in inc.note
