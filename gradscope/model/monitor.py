"""The gradient monitor's plain records: what ``GradMonitor`` fills and the views draw.

No torch here (the model layer): every figure is a Python float or int, so a history can be
kept, compared, pickled or written out long after the tensors are gone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: the kinds an ``Alert`` can have, most severe first
ALERT_KINDS = ("nan", "inf", "exploding", "dead", "vanishing", "forward_nonfinite", "leak")


@dataclass(frozen=True)
class ParamStats:
    """Gradient statistics of one parameter (or one module's gradient output) at one step.

    ``norm`` uses the monitor's ``norm_type``. ``max_abs``, ``mean_abs`` and ``zero_frac`` are
    None on a step without full statistics. ``nan`` and ``inf`` are exact counts (0 when the
    norm is finite); None only when the gradient held non-finite values but was changed (e.g.
    clipped) before they could be counted. ``update_ratio`` is ``||w_new - w_old|| / ||w_old||``
    of the optimizer step, from a sample of the weights (exact for tensors of at most
    ``update_sample`` elements); None without ``optimizer=``, on steps without full
    statistics, and for module statistics.
    """

    norm: float
    max_abs: float | None
    mean_abs: float | None
    nan: int | None
    inf: int | None
    zero_frac: float | None
    update_ratio: float | None = None


@dataclass(frozen=True)
class StepStats:
    """One logged step: the total norm (as ``torch.nn.utils.get_total_norm``) and per-parameter
    statistics in model order; ``modules``: gradient-output statistics (with ``modules=True``).

    ``full``: the step has full statistics. ``skipped``: the GradScaler skipped the optimizer
    step (non-finite gradients). ``scope``: None without ``torch.distributed``; ``"global"``
    when every rank reports the same global figures; ``"rank N"`` when they are this rank's own.
    ``measured_at``: ``"backward"`` (as the last backward left them) or ``"optimizer"`` (at
    ``optimizer.step()``). ``forward_nonfinite``: with ``activations=True``, the module whose
    output was the step's first non-finite forward value (None when all were finite).
    """

    step: int
    total_norm: float
    params: dict[str, ParamStats]
    modules: dict[str, ParamStats] = field(default_factory=dict)
    full: bool = True
    skipped: bool = False
    scope: str | None = None
    measured_at: str = "backward"
    forward_nonfinite: str | None = None


@dataclass(frozen=True)
class Alert:
    """Something worth a look: ``kind`` is one of nan, inf, dead, vanishing, exploding,
    forward_nonfinite, leak; ``name`` the (first) parameter, module, or for a leak the step
    whose graph is still alive; ``step`` the step it was seen at. One event gives one alert:
    ``names`` lists every parameter it concerns (``count`` of them)."""

    kind: str
    step: int
    name: str
    message: str
    count: int = 1
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.names:  # a single-subject alert concerns its name
            object.__setattr__(self, "names", (self.name,))


@dataclass
class DroppedSummary:
    """What the logged steps that a bounded history dropped held: how many, from which step to
    which, the largest finite total norm, the steps whose gradients were not finite or that
    the GradScaler skipped, and per parameter the largest finite norm and the steps with
    non-finite values in its gradient."""

    steps: int = 0
    first_step: int | None = None
    last_step: int | None = None
    max_total_norm: float | None = None
    nonfinite_steps: int = 0
    skipped_steps: int = 0
    max_norm: dict[str, float] = field(default_factory=dict)
    nonfinite: dict[str, int] = field(default_factory=dict)

    def add(self, st: StepStats) -> None:
        """Fold one dropped step in (constant memory per parameter)."""
        self.steps += 1
        if self.first_step is None:
            self.first_step = st.step
        self.last_step = st.step
        if st.skipped:
            self.skipped_steps += 1
            return
        total = st.total_norm
        if total == total and total not in (math.inf, -math.inf):
            if self.max_total_norm is None or total > self.max_total_norm:
                self.max_total_norm = total
        else:
            self.nonfinite_steps += 1
        top, bad = self.max_norm, self.nonfinite
        for name, ps in st.params.items():
            norm = ps.norm
            if norm == norm and norm != math.inf:
                if norm > top.get(name, -1.0):
                    top[name] = norm
            else:
                bad[name] = bad.get(name, 0) + 1


@dataclass
class MonitorLog:
    """What a monitor recorded, as plain data (what the views take).

    ``numels``: each parameter's element count (what the alert rules compare norms by).
    ``dropped``: logged steps no longer in ``steps`` (the monitor keeps the last ``history``
    of them), with ``dropped_summary`` what they held."""

    names: list[str]
    every: int
    full_every: int
    norm_type: float
    steps: list[StepStats]
    alerts: list[Alert]
    distributed: str | None = None
    numels: dict[str, int] = field(default_factory=dict)
    dropped: int = 0
    dropped_summary: DroppedSummary | None = None
