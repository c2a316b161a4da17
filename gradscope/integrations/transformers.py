"""``GradscopeCallback`` for the Hugging Face ``Trainer``.

    from gradscope.integrations.transformers import GradscopeCallback

    callback = GradscopeCallback(every=10)              # any GradMonitor option
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[callback])
    trainer.train()
    print(callback.monitor.history[-1].total_norm)      # callback.monitor: the GradMonitor

When training begins the callback builds a ``GradMonitor`` on the Trainer's model and optimizer
(the torch optimizer inside accelerate's wrapper, and its ``GradScaler`` under fp16), so one
logged step is one optimizer step, gradient accumulation included, and its gradients are those
the last micro-batch's backward left, before clipping: the total norm is the Trainer's logged
``grad_norm``. Alerts go to the Trainer's own log (the ``transformers.trainer`` logger, with
its handlers and verbosity), as a warning each; so does the incident of a step whose gradients
turned non-finite (the op, module and line that made the first NaN/Inf, found by replaying the
bad micro-batch before the optimizer step; the Trainer's loss is the model's ``loss`` output,
so a NaN made by the loss is named too). When training ends the monitor's hooks are
removed; its history stays on ``callback.monitor``.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback
from transformers.utils import logging

from ..capture.monitor import GradMonitor
from ._options import AlertRelay, check_options

logger = logging.get_logger("transformers.trainer")


class GradscopeCallback(TrainerCallback):
    """Watch gradients during ``Trainer.train()``.

    Args:
        **monitor_options: ``GradMonitor`` options (``every``, ``norm_type``, ``params``,
            ``full_every``, ``measure``, ``vanish``, ``explode``...); the model, optimizer and
            scaler come from the Trainer.

    Attributes:
        monitor: the ``GradMonitor`` (None until training begins).

    Raises:
        MonitorError: an option GradMonitor does not take, or one the Trainer supplies.
    """

    def __init__(self, **monitor_options: Any) -> None:
        self.options = check_options("Trainer", monitor_options)
        self.monitor: GradMonitor | None = None
        self._alerts = AlertRelay(logger)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:  # a second train() call: start a fresh history
            self.monitor.remove()
        optimizer = kwargs.get("optimizer")
        scaler = getattr(optimizer, "scaler", None)  # accelerate's, under fp16
        self.monitor = GradMonitor(
            kwargs["model"], optimizer=optimizer, scaler=scaler, **self.options
        )
        self._alerts.reset()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._tell()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._alerts.close(self.monitor)

    def _tell(self) -> None:
        self._alerts.tell(self.monitor)
