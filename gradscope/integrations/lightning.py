"""``GradscopeCallback`` for Lightning (``lightning.pytorch``, or ``pytorch_lightning``).

    from gradscope.integrations.lightning import GradscopeCallback

    callback = GradscopeCallback(every=10)              # any GradMonitor option
    trainer = lightning.pytorch.Trainer(callbacks=[callback], ...)
    trainer.fit(module, data)
    print(callback.monitor.history[-1].total_norm)      # callback.monitor: the GradMonitor

When training starts the callback builds a ``GradMonitor`` on the LightningModule and its
optimizer (and the precision plugin's ``GradScaler`` under 16-bit mixed precision), so one
logged step is one optimizer step, ``accumulate_grad_batches`` included. Lightning runs the
backward inside ``optimizer.step(closure)`` and clips after it; the monitor measures when the
last backward ends, so its figures are the gradients before ``gradient_clip_val`` clipping.
When a logged step's gradients turn non-finite, the monitor replays that batch's
``training_step`` (before the optimizer updates the weights) and logs the incident once: the
op, module and line where the first NaN/Inf was made, the loss's own op included. With
``log=True`` (default) the total norm of each logged step is logged as ``grad_norm/total``
through ``LightningModule.log``; alerts are warnings on the ``lightning.pytorch`` logger. When
training ends (or fails) the monitor's hooks are removed; its history stays on
``callback.monitor``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
from collections.abc import Iterator
from functools import partial
from typing import Any

from ..capture.monitor import GradMonitor
from ..errors import UnsupportedSetupError
from ._options import AlertRelay, check_options


def _lightning() -> Any:
    """``lightning.pytorch``, or the older package ``pytorch_lightning``. Imported by name, so
    the type check reads the same whichever of them (or neither) is installed."""
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError:
        return importlib.import_module("pytorch_lightning")


_Callback: Any = _lightning().Callback

logger = logging.getLogger("lightning.pytorch")


class GradscopeCallback(_Callback):
    """Watch gradients during ``Trainer.fit()``.

    Args:
        log: log each logged step's total norm as ``grad_norm/total``.
        **monitor_options: ``GradMonitor`` options (``every``, ``norm_type``, ``params``,
            ``full_every``, ``measure``, ``vanish``, ``explode``...); the model, optimizer and
            scaler come from the Trainer.

    Attributes:
        monitor: the ``GradMonitor`` (None until training starts).

    Raises:
        MonitorError: an option GradMonitor does not take, or one Lightning supplies.
        UnsupportedSetupError: the module has several optimizers (use one GradMonitor per
            optimizer, built in the module's own code).
    """

    def __init__(self, *, log: bool = True, **monitor_options: Any) -> None:
        self.options = check_options("Lightning", monitor_options)
        self.log_norm = log
        self.monitor: GradMonitor | None = None
        self._alerts = AlertRelay(logger)
        self._logged = 0

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        optimizers = trainer.optimizers
        if len(optimizers) != 1:
            raise UnsupportedSetupError(
                f"GradscopeCallback watches one optimizer, and this module has "
                f"{len(optimizers)}; build a gs.GradMonitor(module, optimizer=...) per "
                "optimizer in the module instead"
            )
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        self.monitor = GradMonitor(
            pl_module, optimizer=optimizers[0], scaler=scaler, **self.options
        )
        self._alerts.reset()
        self._logged = 0

    def on_train_batch_start(
        self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
    ) -> None:
        # the replay of a bad step runs this batch's training_step again (its loss included,
        # so a NaN the loss makes is named), without logging through self.log
        if self.monitor is not None:
            self.monitor.replay_run(partial(_quiet_step, pl_module, batch, batch_idx))

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        mon = self.monitor
        if mon is None:
            return
        if self.log_norm and len(mon.history) > self._logged:
            total = mon.history[-1].total_norm
            if math.isfinite(total):
                pl_module.log("grad_norm/total", total, on_step=True, on_epoch=False)
            self._logged = len(mon.history)
        self._tell()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._close()

    def _close(self) -> None:
        self._alerts.close(self.monitor)

    def _tell(self) -> None:
        self._alerts.tell(self.monitor)


def _quiet_step(pl_module: Any, batch: Any, batch_idx: int) -> Any:
    """``training_step`` once more, with ``self.log`` / ``self.log_dict`` silenced."""
    with _no_logging(pl_module):
        return pl_module.training_step(batch, batch_idx)


@contextlib.contextmanager
def _no_logging(pl_module: Any) -> Iterator[None]:
    shadowed = [n for n in ("log", "log_dict") if n not in vars(pl_module)]
    for name in shadowed:
        setattr(pl_module, name, _ignore)
    try:
        yield
    finally:
        for name in shadowed:
            vars(pl_module).pop(name, None)


def _ignore(*args: Any, **kwargs: Any) -> None:
    return None
