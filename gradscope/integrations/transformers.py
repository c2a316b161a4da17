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

Spikes: the loss of each micro-batch is the model's ``loss`` output, the tensor the Trainer's
``compute_loss`` returns and backpropagates (without ``label_smoothing_factor`` or
``compute_loss_func``, which compute the loss outside the model: then only the gradient norm
is watched); the callback hands it to the monitor as a tensor (``observe_loss``: read in the
step's one transfer, never with ``.item()``). Under gradient accumulation the step's loss is
the Trainer's logged ``loss``: a model that takes ``num_items_in_batch`` (GPT-2 and most
Hugging Face models) returns each micro-batch's share of the step's loss (its summed loss over
the step's item count), which the callback sums and hands over before the optimizer step; a
forward without ``**kwargs`` returns its own mean, and the monitor averages the micro-batches.
When the batch the model is called with has an
``"id"`` or ``"idx"`` entry (a model whose ``forward`` takes it: the Trainer drops columns the
forward does not take), a spike's ``Incident.samples`` name the examples by those ids
(``observe_batch_ids``).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

try:  # the module imports without transformers (doctests collect); the callback says so
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging
except ImportError:
    TrainerCallback, hf_logging = object, None  # type: ignore[assignment,misc]

from .._torch.torchcompat import is_functorch_wrapped
from ..errors import MissingExtraError
from ..monitor.core import GradMonitor
from ..monitor.replay import ID_KEYS
from ._options import AlertRelay, check_options

logger = (hf_logging.get_logger("transformers.trainer") if hf_logging is not None
          else logging.getLogger("transformers.trainer"))


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
        if hf_logging is None:
            raise MissingExtraError(
                "GradscopeCallback for the Hugging Face Trainer needs transformers, which is "
                "not installed; pip install transformers accelerate"
            )
        self.options = check_options("Trainer", monitor_options)
        self.monitor: GradMonitor | None = None
        self._alerts = AlertRelay(logger)
        self._hooks: list[Any] = []
        # whether the Trainer called the forward running now with ``num_items_in_batch``
        self._share = False
        # this step's micro-batch losses so far, when each is a share (``_share``)
        self._shares: list[torch.Tensor] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:  # a second train() call: start a fresh history
            self.monitor.remove()
        self._unhook()
        optimizer = kwargs.get("optimizer")
        scaler = getattr(optimizer, "scaler", None)  # accelerate's, under fp16
        model = kwargs["model"]
        self.monitor = GradMonitor(model, optimizer=optimizer, scaler=scaler, **self.options)
        self._alerts.reset()
        self._shares = []
        # after the monitor's own hooks: its replay has recorded the micro-batch by then
        self._hooks = [
            model.register_forward_pre_hook(self._ids_of, with_kwargs=True),
            model.register_forward_hook(self._loss_of),
        ]

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self._shares and self.monitor is not None:
            loss = torch.stack([x.reshape(()) for x in self._shares]).sum()
            if getattr(args, "average_tokens_across_devices", False) and args.world_size > 1:
                # the item count was every rank's: compute_loss scales the share by the ranks
                loss = loss * args.world_size
            self.monitor.observe_loss(loss)
        self._shares = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._shares = []
        self._tell()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._unhook()
        self._alerts.close(self.monitor)

    def _unhook(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []

    def _training(self, module: Any) -> GradMonitor | None:
        # a training forward: not evaluation, not the monitor's own replay (under vmap)
        if module.training and torch.is_grad_enabled():
            return self.monitor
        return None

    def _ids_of(self, module: Any, args: Any, kwargs: Any) -> None:
        mon = self._training(module)
        if mon is None:
            return
        self._share = kwargs.get("num_items_in_batch") is not None
        for key in ID_KEYS:
            ids = kwargs.get(key)
            if isinstance(ids, torch.Tensor) and ids.dim() == 1 and not is_functorch_wrapped(ids):
                mon.observe_batch_ids(ids)  # kept as a tensor: read only if a spike needs it
                return

    def _loss_of(self, module: Any, args: Any, output: Any) -> None:
        mon = self._training(module)
        if mon is None or not isinstance(output, dict):
            return
        loss = output.get("loss")
        if (isinstance(loss, torch.Tensor) and loss.numel() == 1
                and not is_functorch_wrapped(loss)):
            if self._share:  # summed before the optimizer step (on_pre_optimizer_step)
                self._shares.append(loss.detach())
            else:
                mon.observe_loss(loss)  # the tensor: read in the step's one transfer

    def _tell(self) -> None:
        self._alerts.tell(self.monitor)
