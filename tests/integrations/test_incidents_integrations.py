"""The planted loss bug of samples/incidents/loss_nan.py under the Lightning and Hugging Face
callbacks: each logs the incident once, with the origin a plain loop finds (the op and line
checked against an independent forward check in tests/monitor/test_incidents.py)."""

from __future__ import annotations

import contextlib
import logging

import pytest
import torch
from test_incidents import incident_of, load
from torch import nn

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


@contextlib.contextmanager
def _transformers_logs_to(caplog):
    """Transformers' loggers do not propagate to the root logger (where caplog listens) unless
    some earlier test in the same process turned propagation on (then a handler of our own would
    see each record twice): listen on its own logger, with propagation off while we do."""
    logger = logging.getLogger("transformers")
    propagate = logger.propagate
    logger.propagate = False
    logger.addHandler(caplog.handler)
    try:
        yield
    finally:
        logger.removeHandler(caplog.handler)
        logger.propagate = propagate


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
    with caplog.at_level(logging.WARNING), _transformers_logs_to(caplog):
        trainer.train()
    incidents = callback.monitor.incidents
    assert incidents, "no incident"
    inc = incidents[0]
    # the loss is part of this model's forward: its op and line, in the model's own forward
    assert (inc.op, inc.line, inc.module) == (plain.op, plain.line, "")
    told = [r.getMessage() for r in caplog.records if "gradscope incident" in r.getMessage()]
    assert len(told) == len(incidents) and "DivBackward0" in told[0]


# ------------------------------------------------ the planted model bugs, under each callback
# the same scripts a plain loop runs in tests/monitor/test_incidents.py (where each origin is
# checked against detect_anomaly or forward hooks): each callback logs the same origin, once;
# the model sits under ``net`` in both wrappers, so its module paths gain that prefix
MODEL_BUGS = ["sqrt_where", "log_prob", "norm_div", "layernorm_eps0"]


def _plain_batches(name: str, n: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The batches a plain loop over the script sees, each taken when its step starts (a
    script may make its bad batch from the weights of that step, and the frameworks' data
    loaders fetch a batch ahead): recorded from an unmonitored plain run."""
    mod = load(name)
    model, opt, it = mod.model, mod.optimizer(mod.model.parameters()), mod.batches()
    seen = []
    for _ in range(n):
        x, y = next(it)
        seen.append((x.clone(), y.clone()))
        mod.loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    return seen


class _InOrder(torch.utils.data.IterableDataset):
    def __init__(self, items: list) -> None:
        self.items = items

    def __iter__(self):
        return iter(self.items)


def _under_net(module: str | None) -> str | None:
    return None if module is None else ("net" if module == "" else f"net.{module}")


def _told(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "gradscope incident" in r.getMessage()]


@pytest.mark.parametrize("name", MODEL_BUGS)
def test_lightning_logs_the_plain_loops_origin(name: str, caplog) -> None:
    pl = pytest.importorskip("lightning.pytorch")
    from gradscope.integrations.lightning import GradscopeCallback

    _, plain = incident_of(name)
    mod = load(name)

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = mod.model

        def training_step(self, batch, batch_idx):
            x, y = batch
            return mod.loss_fn(self.net(x), y)

        def configure_optimizers(self):
            return mod.optimizer(self.parameters())

    loader = torch.utils.data.DataLoader(_plain_batches(name), batch_size=None)
    callback = GradscopeCallback()
    trainer = pl.Trainer(
        max_steps=5, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[callback],
    )
    with caplog.at_level(logging.WARNING, logger="lightning.pytorch"):
        trainer.fit(Module(), loader)
    (inc,) = callback.monitor.incidents
    assert (inc.step, inc.kind, inc.phase, inc.op, inc.line) == (
        plain.step, plain.kind, plain.phase, plain.op, plain.line
    )
    assert inc.module == _under_net(plain.module) and inc.replayed
    (told,) = _told(caplog)
    assert inc.op in told and inc.line in told


@pytest.mark.parametrize("name", MODEL_BUGS)
def test_transformers_trainer_logs_the_plain_loops_origin(name: str, tmp_path, caplog) -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    from gradscope.integrations.transformers import GradscopeCallback

    _, plain = incident_of(name)
    mod = load(name)

    class WithLoss(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = mod.model

        def forward(self, x, labels=None):
            out = self.net(x)
            return {"loss": mod.loss_fn(out, labels), "logits": out}

    model = WithLoss()
    # an iterable dataset: the Trainer shuffles a list, and the steps must see the loop's order
    data = _InOrder([{"x": x, "labels": y} for x, y in _plain_batches(name)])
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=1, max_steps=5,
        max_grad_norm=0.0, report_to="none", save_strategy="no", use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, seed=0, remove_unused_columns=False,
    )
    # the script's own optimizer, at a constant rate: the steps before the bad one as in the loop
    opt = mod.optimizer(model.parameters())
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    callback = GradscopeCallback()
    trainer = Trainer(
        model=model, args=args, train_dataset=data, callbacks=[callback],
        data_collator=lambda items: items[0], optimizers=(opt, schedule),
    )
    with caplog.at_level(logging.WARNING), _transformers_logs_to(caplog):
        trainer.train()
    (inc,) = callback.monitor.incidents
    assert (inc.step, inc.kind, inc.phase, inc.op, inc.line) == (
        plain.step, plain.kind, plain.phase, plain.op, plain.line
    )
    assert inc.module == _under_net(plain.module) and inc.replayed
    (told,) = _told(caplog)
    assert inc.op in told and inc.line in told
