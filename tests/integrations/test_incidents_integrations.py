"""The planted loss bug of samples/incidents/loss_nan.py under the Lightning and Hugging Face
callbacks: each logs the incident once, with the origin a plain loop finds (the op and line
checked against an independent forward check in tests/capture/test_incidents.py)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from tests.capture.test_incidents import incident_of, load

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*does not have many workers"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*is deprecated"),
]


def _batches(mod, n: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    it = mod.batches()
    return [next(it) for _ in range(n)]


def test_lightning_logs_the_loss_op_once(caplog) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from gradscope.integrations.lightning import GradscopeCallback

    _, plain = incident_of("loss_nan")
    mod = load("loss_nan")

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mod.model

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = mod.loss_fn(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return mod.optimizer(self.parameters())

    data = _batches(mod)
    loader = torch.utils.data.DataLoader(data, batch_size=None)
    callback = GradscopeCallback()
    trainer = pl.Trainer(
        max_steps=5, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )
    with caplog.at_level(logging.WARNING, logger="lightning.pytorch"):
        trainer.fit(Module(), loader)
    (inc,) = callback.monitor.incidents
    assert (inc.step, inc.phase, inc.op, inc.line) == (plain.step, "outside", plain.op, plain.line)
    assert inc.module is None and inc.replayed
    told = [r.getMessage() for r in caplog.records if "gradscope incident" in r.getMessage()]
    assert len(told) == 1 and "DivBackward0" in told[0] and "loss_nan.py:22" in told[0]


def test_transformers_trainer_logs_the_loss_op_once(tmp_path, caplog) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    from gradscope.integrations.transformers import GradscopeCallback

    _, plain = incident_of("loss_nan")
    mod = load("loss_nan")

    class WithLoss(nn.Module):
        """As a Hugging Face model does: the loss is computed in the forward, from labels."""

        def __init__(self) -> None:
            super().__init__()
            self.net = mod.model

        def forward(self, x, labels=None):
            out = self.net(x)
            return {"loss": mod.loss_fn(out, labels), "logits": out}

    data = [{"x": x, "labels": y} for x, y in _batches(mod)]
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=1, max_steps=5,
        learning_rate=1e-2, max_grad_norm=0.0, report_to="none", save_strategy="no",
        use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0,
        remove_unused_columns=False,
    )
    callback = GradscopeCallback()
    trainer = Trainer(
        model=WithLoss(), args=args, train_dataset=data, callbacks=[callback],
        data_collator=lambda items: items[0],
    )
    with caplog.at_level(logging.WARNING):
        trainer.train()
    incidents = callback.monitor.incidents
    assert incidents, "no incident"
    inc = incidents[0]
    # the loss is part of this model's forward: its op and line, in the model's own forward
    assert (inc.op, inc.line, inc.module) == (plain.op, plain.line, "")
    told = [r.getMessage() for r in caplog.records if "gradscope incident" in r.getMessage()]
    assert len(told) == len(incidents) and "DivBackward0" in told[0]
