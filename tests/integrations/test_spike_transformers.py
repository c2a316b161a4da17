"""Spikes under the Hugging Face Trainer callback (``tests/spike_common.py``: the set-up and
the ground truths). The model is a plain module whose ``forward`` takes the batch's ``idx``
(the Trainer keeps only the columns the forward takes) and returns its loss and logits."""

from __future__ import annotations

import pytest
import torch
from test_monitor import Transfers
from torch import nn

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from spike_common import (  # noqa: E402
    BATCH,
    OPTIONS,
    PLANTED_STEP,
    STEPS,
    _InOrder,
    _net,
    brute_force,
    check_spike,
    planted_batch,
)

from gradscope.integrations.transformers import GradscopeCallback  # noqa: E402


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = _net()

    def forward(self, x, labels, idx=None):
        out = self.net(x)
        return {"loss": nn.functional.mse_loss(out, labels), "logits": out}


class _Snapshot(transformers.TrainerCallback):
    """The parameters as the planted step starts (the Trainer's own, cloned)."""

    def __init__(self) -> None:
        self.params: list[torch.Tensor] = []

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        if state.global_step == PLANTED_STEP:
            self.params = [p.detach().clone() for p in kwargs["model"].parameters()]


def _run(tmp_path, *callbacks) -> tuple[nn.Module, list]:
    model = _Model()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=BATCH, max_steps=STEPS,
        logging_steps=1, learning_rate=1e-2, max_grad_norm=0.0, report_to="none",
        save_strategy="no", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0,
    )
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_InOrder(),
                                   callbacks=list(callbacks))
    trainer.train()
    return model, trainer.state.log_history


def test_spike_names_the_planted_example_by_its_id(tmp_path, monkeypatch) -> None:
    counter = Transfers(monkeypatch)
    plain, _ = _run(tmp_path / "plain")
    without = counter.count
    callback, snapshot = GradscopeCallback(**OPTIONS), _Snapshot()
    watched, logs = _run(tmp_path / "watched", callback, snapshot)
    transfers = counter.count - without - without  # the watched run's, less the plain one's
    monkeypatch.undo()
    mon = callback.monitor
    assert mon is not None and len(mon.history) == STEPS
    assert transfers == STEPS  # one host transfer per logged step
    # the Trainer logs its loss rounded to 4 significant digits
    losses = [e["loss"] for e in logs if "loss" in e and "train_runtime" not in e]
    assert len(losses) == STEPS
    check_spike(mon, losses, rel=1e-3)
    for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
        assert torch.equal(a, b)  # training bitwise as without the callback
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in watched.modules())
    # per-sample norms (vmap over the model, its 0-d loss output left out) = brute force
    net = _net()
    with torch.no_grad():
        for p, v in zip(net.parameters(), snapshot.params, strict=True):
            p.copy_(v)
    truth = brute_force(net, planted_batch())
    inc = next(i for i in mon.incidents if i.kind == "spike")
    assert len(inc.samples) == BATCH
    for s in inc.samples:
        assert s.norm == pytest.approx(truth[s.id], rel=1e-4)
