"""GradscopeCallback on a real (tiny) Hugging Face Trainer run, offline: a GPT-2 built from a
config, random tokens. Ground truth is the Trainer's own logged ``grad_norm`` (accelerate's
clip_grad_norm_ of the accumulated, pre-clip gradients)."""

from __future__ import annotations

import logging

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

import gradscope as gs  # noqa: E402
from gradscope.integrations.transformers import GradscopeCallback  # noqa: E402


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 16, length: int = 16, vocab: int = 64) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def _tiny_gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=0, eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def _train(tmp_path, callback: GradscopeCallback, **args) -> Trainer:
    model = _tiny_gpt2()
    training = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=4,
        logging_steps=1,
        learning_rate=1e-3,
        max_grad_norm=0.5,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
        **args,
    )
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(), callbacks=[callback])
    trainer.train()
    return trainer


def _hooks(model: torch.nn.Module) -> int:
    n = sum(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters())
    for m in model.modules():
        n += len(m._forward_hooks) + len(m._forward_pre_hooks)
    return n


def test_total_norm_is_the_trainers_grad_norm_at_every_optimizer_step(tmp_path) -> None:
    callback = GradscopeCallback(full_every=1)
    trainer = _train(tmp_path, callback)
    logged = [e["grad_norm"] for e in trainer.state.log_history if "grad_norm" in e]
    mon = callback.monitor
    assert isinstance(mon, gs.GradMonitor)
    assert len(logged) == 4  # 4 optimizer steps of 2 micro-batches each
    assert [st.step for st in mon.history] == [0, 1, 2, 3]
    assert [st.total_norm for st in mon.history] == pytest.approx(logged, rel=1e-3)
    assert max(logged) > 0.5  # clipping was active, and the figures are from before it
    assert list(mon.history[0].params) == [
        n for n, p in trainer.model.named_parameters() if p.requires_grad
    ]
    # no hook left on the model or the optimizer once training ended
    assert _hooks(trainer.model) == 0
    inner = trainer.optimizer.optimizer
    assert not inner._optimizer_step_pre_hooks and not inner._optimizer_step_post_hooks


def test_alerts_go_to_the_trainers_log(tmp_path) -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    trainer_logger = logging.getLogger("transformers.trainer")
    trainer_logger.addHandler(handler)
    try:
        callback = GradscopeCallback(explode=1e-6)  # every norm is "exploding" at step 0
        _train(tmp_path, callback)
    finally:
        trainer_logger.removeHandler(handler)
    alerts = callback.monitor.alerts
    assert [a.kind for a in alerts] == ["exploding"]  # one grouped alert for the event
    lines = [r.getMessage() for r in records if "gradscope" in r.getMessage()]
    assert lines == [f"gradscope exploding: {alerts[0].message}"]
    assert all(r.levelno == logging.WARNING for r in records if "gradscope" in r.getMessage())


def test_options_the_trainer_supplies_are_refused() -> None:
    with pytest.raises(gs.MonitorError, match="supplies the optimizer"):
        GradscopeCallback(optimizer=None)
    with pytest.raises(gs.MonitorError, match="unknown option 'evry'"):
        GradscopeCallback(evry=2)


class _MeanLoss(torch.nn.Module):
    """A model whose ``forward`` takes no ``**kwargs``: the Trainer gives it no
    ``num_items_in_batch`` and divides its mean loss by the accumulation steps itself."""

    def __init__(self) -> None:
        super().__init__()
        self.gpt = _tiny_gpt2()

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": self.gpt(input_ids=input_ids, labels=labels).loss}


@pytest.mark.parametrize("model", ["shares", "means"])
def test_the_loss_is_the_trainers_logged_loss_under_accumulation(tmp_path, model) -> None:
    """GPT-2 takes ``num_items_in_batch``: each micro-batch's loss is its share of the whole
    step's (summed by the Trainer); a forward without ``**kwargs`` gives each its own mean
    (averaged). Either way the monitor's step loss is the Trainer's logged ``loss``, also on
    the epoch's last step, which has one micro-batch of the two (6 examples, batches of 2)."""
    callback = GradscopeCallback()
    module = _tiny_gpt2() if model == "shares" else _MeanLoss()
    training = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, gradient_accumulation_steps=2,
        num_train_epochs=2, logging_steps=1, learning_rate=1e-3, report_to="none",
        save_strategy="no", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )
    trainer = Trainer(model=module, args=training, train_dataset=Tokens(n=6),
                      callbacks=[callback])
    assert trainer.model_accepts_loss_kwargs == (model == "shares")
    trainer.train()
    logged = [e["loss"] for e in trainer.state.log_history if "loss" in e and "grad_norm" in e]
    assert len(logged) == 4  # 2 epochs of 2 steps: 2 micro-batches, then 1
    assert [st.loss for st in callback.monitor.history] == pytest.approx(logged, rel=1e-4)
