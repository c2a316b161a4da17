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

Spikes: the loss ``training_step`` returned (the tensor Lightning hands to ``backward``, times
``accumulate_grad_batches`` to undo Lightning's division) is given to the monitor as a tensor
(``observe_loss``: read in the step's one transfer, never with ``.item()``), so a loss spike is
seen as well as a gradient-norm one; a dict batch with an ``"id"`` or ``"idx"`` entry gives the
examples' ids (``observe_batch_ids``). On a spiking step the replay runs ``training_step`` on
each example of the batch alone (a batch of one, the same dict/tuple structure) for the
per-sample gradient norms (``Incident.samples``), named by those ids.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
from collections.abc import Iterator
from typing import Any

import torch

from ..errors import MissingExtraError, UnsupportedSetupError
from ..monitor.core import GradMonitor
from ..monitor.replay import ids_in
from ._options import AlertRelay, check_options


def _lightning() -> Any:
    """``lightning.pytorch``, or the older package ``pytorch_lightning``, or None when neither
    is installed (the module still imports: its doctests collect, and the callback says what
    to install when it is made). Imported by name, so the type check reads the same whichever
    of them (or neither) is installed."""
    for name in ("lightning.pytorch", "pytorch_lightning"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    return None


_LIGHTNING = _lightning()
_Callback: Any = _LIGHTNING.Callback if _LIGHTNING is not None else object

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
        if _LIGHTNING is None:
            raise MissingExtraError(
                "GradscopeCallback for Lightning needs Lightning, which is not installed; "
                "pip install lightning"
            )
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
        mon = self.monitor
        if mon is None:
            return
        mon.replay_run(_Step(pl_module, batch, batch_idx, trainer.accumulate_grad_batches))
        ids = ids_in(batch)
        if ids is not None:
            mon.observe_batch_ids(ids)

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        # the loss Lightning backpropagates: training_step's, divided by the accumulation
        mon = self.monitor
        if mon is None or not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            return
        n = trainer.accumulate_grad_batches
        mon.observe_loss(loss.detach() * n if n != 1 else loss)

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


class _Step:
    """One batch's ``training_step`` for the monitor's replay: ``run()`` the whole batch (the
    NaN replay), ``example(i)`` the batch's example ``i`` alone (the per-sample norms of a
    spike); ``scale``: how Lightning scales the loss for ``backward`` (1/accumulation)."""

    def __init__(self, pl_module: Any, batch: Any, batch_idx: int, accumulate: int) -> None:
        self.pl_module = pl_module
        self.batch = batch
        self.batch_idx = batch_idx
        self.scale = 1.0 / max(1, int(accumulate))

    def __call__(self) -> Any:
        return _quiet_step(self.pl_module, self.batch, self.batch_idx)

    def examples(self) -> int | None:
        """The batch size: the common first dimension of the batch's tensors (None: none)."""
        sizes = {t.shape[0] for t in _leaves(self.batch)
                 if isinstance(t, torch.Tensor) and t.dim() > 0}
        return sizes.pop() if len(sizes) == 1 else None

    def example(self, i: int) -> Any:
        b = self.examples()
        one = _slice(self.batch, i, b)
        return _quiet_step(self.pl_module, one, self.batch_idx)


def _leaves(batch: Any) -> list[Any]:
    from torch.utils import _pytree as pytree

    return pytree.tree_leaves(batch)


def _slice(batch: Any, i: int, b: int | None) -> Any:
    """Example ``i`` of ``batch`` as a batch of one: tensors (and lists) of length ``b`` cut
    to ``[i:i+1]``, everything else as it is."""
    from torch.utils import _pytree as pytree

    def cut(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape[0] == b:
            return t[i : i + 1]
        return t

    if isinstance(batch, dict):  # a dict's list of ids (strings) is cut as well
        return {k: (v[i : i + 1] if isinstance(v, list) and len(v) == b else _slice(v, i, b))
                for k, v in batch.items()}
    return pytree.tree_map(cut, batch)


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
