"""The incident side of a ``GradMonitor``: each new event of a training run (gradients
turning non-finite, the gradient norm exploding) becomes one ``Incident``, with the bad step's
origin named when it could be replayed.

``IncidentWatch`` keeps a ``Replayer`` (``gradscope.monitor.replay``) while the monitor runs
with ``replay=True`` and ``optimizer=``; at ``optimizer.step()``'s pre-hook of a logged step
(the parameters still those of the step) it reads the step's norms once and, when they are not
finite and the previous logged step's were, replays the micro-batch that went bad. When the
step is recorded, ``record`` fills the ``Incident``: the replay's phase, op, module, line and
inputs, the modules whose norm changed most against the last good logged step (``changes``),
or one line saying why the step was not replayed. An explosion (finite norms past the explode
alert) is an incident without a replay: the modules whose norms grew most.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import MonitorError
from .alerts import FLAP_WINDOW
from .distributed import this_rank
from .incident import RANK_LOSS_WINDOW, SPREAD_SHARE, Incident, changes, first_rank, spike_rank
from .rank_replay import exchange
from .replay import Replayer, ReplayResult
from .replay_isolated import replay_isolated
from .spike_samples import SampleResult, replay_samples
from .spikes import RATE_FACTOR, RATE_WINDOW, rate_jump


class IncidentWatch:
    """The incident side of a ``GradMonitor``: keeps the step's micro-batches (with
    ``replay``), replays the first bad one before ``optimizer.step()``, and turns each new
    event (gradients turning non-finite, the norm exploding) into one ``Incident``.

    The monitor calls: ``after_backward`` (each backward of a logged step, with the device
    norms), ``before_step`` (logged steps, at ``optimizer.step()``'s pre-hook, with what
    moves the step to the host and says whether its norms are finite: the step's one
    transfer, done there), ``record`` (each logged step's stats and new alerts; returns the
    incident the step starts, or None), ``end_step`` (every step boundary).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        hook_target: torch.nn.Module,
        params: Sequence[torch.Tensor],
        norm_type: float,
        replay: bool,
        optimizer: Any,
        loss_fn: Callable[..., Any] | None = None,
    ) -> None:
        if loss_fn is not None and not callable(loss_fn):
            raise MonitorError(f"loss_fn= must be callable, got {type(loss_fn).__name__}")
        self.norm_type = norm_type
        self.replayer = Replayer(model, hook_target, params, loss_fn) if replay else None
        self.no_replay = None
        if not replay:
            self.no_replay = "not replayed: the monitor was built with replay=False"
        elif optimizer is None:
            self.replayer = None
            self.no_replay = (
                "not replayed: without optimizer= the step ends when backward ends, where the "
                "parameters may still change; pass optimizer= for a replay"
            )
        self.pending: ReplayResult | None = None
        self.bad = False  # inside a non-finite event
        self.quiet = FLAP_WINDOW  # finite logged steps since the last non-finite one
        self.current: Incident | None = None  # the open non-finite event's incident
        self.last_good: dict[str, float] | None = None
        self.hot = False  # the previous logged step raised an exploding alert
        self.checked = False  # this step's gradients were finite when the backward ended
        self.rules: Any = None  # the log's AlertRules (read: the spike a step starts)
        #: under torch.distributed, this logged step's evidence from every rank (its loss,
        #: whether its forward was watched, its first non-finite module) and the modules' names
        self.evidence: tuple[list[tuple[float | None, bool, int | None, int | None]],
                             list[str]] | None = None
        #: the same, taken at optimizer.step()'s pre-hook from figures every rank holds alike
        #: (the replays are then exchanged), and what the exchange found: the first rank and
        #: one line per rank
        self.agreed: tuple[list[tuple[float | None, bool, int | None, int | None]],
                           list[str]] | None = None
        self.replays: tuple[int | None, list[str]] | None = None
        #: a logged step whose figures differed between the ranks was seen
        self.split = False
        #: why a rank cannot replay alone ("" when it can; None: not read yet)
        self.alone: str | None = None
        self.preview: Callable[[], bool] = lambda: False
        self.samples: SampleResult | None = None  # the spiking step's per-sample norms
        #: under torch.distributed, each rank's last logged finite losses (from ``evidence``,
        #: alike on every rank): a spike's rank is the one whose own loss jumped
        self.rank_losses: list[deque[float]] = []
        # the learning rate of each optimizer step (the largest of its groups), oldest first,
        # and the optimizer steps since the last logged one: a spike's likelier cause
        self.rates: deque[float] = deque(maxlen=RATE_WINDOW + 1)
        self.since = 0
        # the last record's step with its rates (its own included) and how many it covered
        self.rates_at: tuple[int, list[float], int] = (-1, [], 0)

    def read_spikes(self, rules: Any, preview: Callable[[], bool]) -> None:
        """Read the spike events from ``rules`` (the log's ``AlertRules``; never written);
        ``preview()``: whether the step just moved to the host starts a spike."""
        self.rules = rules
        self.preview = preview

    def note_rate(self, optimizer: Any) -> None:
        """At every ``optimizer.step()``'s pre-hook: the step's learning rate (the largest of
        its param groups; a tensor rate is not read, that would be a host transfer)."""
        rates = [g["lr"] for g in optimizer.param_groups  # numpy floats too, never a bool
                 if isinstance(g.get("lr"), (float, int)) and not isinstance(g["lr"], bool)]
        if rates:
            self.rates.append(float(max(rates)))
            self.since += 1

    def batch_ids(self, ids: Any) -> None:
        """The data's own ids of a micro-batch (``Replayer.set_ids``: which one); without a
        replay nothing reads them."""
        if self.replayer is not None:
            self.replayer.set_ids(list(ids))

    @property
    def replaying(self) -> bool:
        return self.replayer is not None and self.replayer.replaying

    def watch(self, params: Sequence[torch.Tensor]) -> None:
        """The monitor watches other parameters now (the model's were replaced or added)."""
        self.alone = None
        if self.replayer is not None:
            self.replayer.params = list(params)
            self.replayer.clear()

    def install(self) -> Callable[[], None]:
        if self.replayer is None:
            return lambda: None
        return self.replayer.install()

    def target(self, *values: Any) -> None:
        if self.replayer is not None:
            self.replayer.set_target(*values)

    def add_run(self, run: Callable[[], Any]) -> None:
        """A framework's own step for the next micro-batch (see ``Replayer.add_run``)."""
        if self.replayer is not None:
            self.replayer.add_run(run)

    def after_backward(self, norms: torch.Tensor) -> None:
        if self.replayer is not None and not self.replayer.replaying:
            self.replayer.note_backward(norms)

    def wants_check(self) -> bool:
        """Whether this step's norms are needed before ``optimizer.step()`` (a replay may
        have to run there; on one rank of several only where each rank can replay alone)."""
        rp = self.replayer
        if rp is None or self.bad:
            return False
        if self.alone is None:  # the model's make-up, read once (``watch`` forgets it)
            self.alone = "" if rp.together() else rp.why_not_alone() or ""
        return not self.alone

    def before_step(self, finite: Callable[[], bool | None], args: Any, kwargs: Any) -> Any:
        """At ``optimizer.step()``'s pre-hook of a logged step (``finite()``: moves the
        step's figures to the host, its one transfer, and says whether its norms are finite;
        None when nothing was measured): if they are not and the previous logged step's
        were, replay now (parameters untouched yet). With ``step(closure)`` (the backward
        runs inside the step: Lightning), the check runs when the closure returns: returns
        the hook's new ``(args, kwargs)``, else None."""
        if not self.wants_check():
            return None
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is None:
            self.check(finite())
            return None

        def checked() -> Any:
            loss = closure()
            self.check(finite())
            return loss

        if "closure" in kwargs:
            return args, dict(kwargs, closure=checked)
        return (args[0], checked, *args[2:]), kwargs

    def check(self, finite: bool | None) -> None:
        """Replay now if the step's gradients are not ``finite`` (None: not measured)."""
        if self.replayer is None or finite is None or self.bad:
            return
        if finite:
            self.checked = True
            if self.preview():  # a spike: which examples, before the parameters change
                rp = self.replayer
                found = replay_isolated(lambda: replay_samples(rp))
                if not isinstance(found, SampleResult):  # the child failed: its note
                    failed, found = found, SampleResult()
                    found.note = failed.note
                self.samples = found
            return
        if self.replayer.together() and self.agreed is None:
            self.pending = ReplayResult()  # a rank that replays alone would wait for ever
            self.pending.note = (
                "not replayed: sharded parameters are replayed by every rank together, and "
                "the ranks' figures differed at an earlier step, so not every rank replays")
            return
        self.pending = replay_isolated(self.replayer.replay)  # the contract: replay_isolated
        if self.agreed is not None:  # every rank replayed its own micro-batch: which went bad
            self.pending, self.replays = exchange(self.pending, self.agreed[0])

    def _spike_incident(self, step: int, spike: Any, norms: dict[str, float]) -> Incident:
        """The spike's incident: under torch.distributed, the rank it came from
        (``spike_rank``); where that is another rank and this one replayed its own micro-batch
        for examples, they are not the spike's, and are not listed."""
        rank, lines = (spike_rank([loss for loss, *_ in self.evidence[0]], self.rank_losses)
                       if self.evidence is not None else (None, []))
        found = self.samples
        elsewhere = (rank if rank is not None and found is not None and found.samples
                     and this_rank() != rank else None)
        note: str | None
        if elsewhere is not None:
            found = None
            note = (f"its examples are rank {elsewhere}'s to name: each rank replays only its "
                    f"own micro-batch (rank {elsewhere}'s incident lists them)")
        elif found is not None:
            note = found.note
        else:
            note = (self.no_replay or "not replayed: the spike was not seen before "
                    "optimizer.step()").replace("not replayed", "no per-sample norms", 1)
        if found is not None and found.samples and found.samples[0].share < SPREAD_SHARE:
            spread = (f"no single example carries the spike (the largest has "
                      f"{found.samples[0].share:.0%} of the micro-batch's squared norm)")
            note = f"{spread}; {note}" if note else spread
        # the rates before this step's own (its update comes after its gradients)
        jump = rate_jump(list(self.rates)[:-1], self.since - 1, RATE_FACTOR)
        if jump is not None:
            note = f"{jump.message()}; {note}" if note else jump.message()
        return Incident(
            step=step, kind="spike", signal=spike.signal, ratio=spike.ratio,
            changes=changes(self.last_good, norms, self.norm_type),
            samples=found.samples if found is not None else [],
            sample_modules=found.modules if found is not None else [],
            micro_batch=found.micro_batch if found is not None else None,
            replayed=found is not None and found.replayed, note=note, rank=rank, ranks=lines,
        )

    def _keep_losses(self) -> None:
        """Each rank's loss of this logged step into its history (``rank_losses``), after
        this step's incident was judged against the ones before it."""
        if self.evidence is None:
            return
        seen = self.evidence[0]
        while len(self.rank_losses) < len(seen):
            self.rank_losses.append(deque(maxlen=RANK_LOSS_WINDOW))
        for past, (loss, *_) in zip(self.rank_losses, seen, strict=False):
            if loss is not None and math.isfinite(loss):
                past.append(loss)

    def _spike_started(self) -> Any:
        return None if self.rules is None else self.rules.spike_started

    def end_step(self) -> None:
        self.agreed = None
        if self.replayer is not None:
            self.replayer.clear()

    def update_cause(self, step: int) -> str | None:
        """For an update-ratio spike at logged step ``step``: the learning-rate jump among the
        optimizer steps it covers (its own included), as a note, or None."""
        at, rates, covered = self.rates_at
        if at != step:
            return None
        jump = rate_jump(rates, covered, RATE_FACTOR)  # only asked on a spike: not per step
        return jump.message(own=True) if jump is not None else None

    def ranks_agreed(self, ranks: Sequence[tuple[float | None, bool, int | None, int | None]],
                     modules: list[str]) -> None:
        """At ``optimizer.step()``'s pre-hook: every rank's evidence of this logged step, from
        figures every rank holds alike (so every rank replays, or none does, and all take part
        in the replays' exchange)."""
        if not self.split:
            self.agreed = ([tuple(r) for r in ranks], modules)  # type: ignore[misc]

    def ranks_seen(self, ranks: Sequence[tuple[float | None, bool, int | None, int | None]],
                   modules: list[str], agreed: bool) -> None:
        """Every rank's evidence of this logged step (``transfer.RankEvidence``), for the
        incident it may start: which rank went bad first. ``agreed``: every rank holds the
        step's figures alike; once a step's were not, the ranks' histories (``bad``) may
        differ, and the replays are no longer exchanged (a rank would wait for the others)."""
        self.evidence = ([tuple(r) for r in ranks], modules)  # type: ignore[misc]
        self.split = self.split or not agreed

    def _first_rank(self, incident: Incident) -> None:
        if self.evidence is None:
            return
        seen, modules = self.evidence
        rank, phase, lines = first_rank(seen, modules)
        if self.replays is not None:  # each rank's replay of its own micro-batch says more
            found, said = self.replays
            if found is not None and rank is None:  # the trailing "which rank is not known"
                lines = lines[: len(said)]
            rank = found
            lines = [f"{a}; {b}" for a, b in zip(lines, said, strict=False)] + lines[len(said):]
        incident.rank, incident.ranks = rank, lines
        if rank is not None and phase is not None and incident.phase is None:  # not replayed
            incident.phase = phase
            first = seen[rank][2]
            if phase == "forward" and first is not None and 0 <= first < len(modules):
                incident.module = modules[first]

    def record(self, st: Any, alerts: list[Any]) -> Incident | None:
        """This logged step's incident, if it starts an event (the views name the origin in
        the alert line: ``alert_line``)."""
        if st.skipped:
            return None
        norms = {n: ps.norm for n, ps in st.params.items()}
        finite = math.isfinite(st.total_norm)
        incident = None
        if not finite and self.bad and self.current is not None:  # the same event again
            self.current.repeats += 1
            self.current.last_step = st.step
        if not finite and not self.bad:
            res = self.pending or ReplayResult()
            if self.pending is None:
                rp = self.replayer
                ranks = rp.why_not() if rp is not None and rp.distributed() else None
                res.note = self.no_replay or ranks or (
                    "not replayed: the gradients were finite when the backward ended and "
                    "turned non-finite after it (changed by hand or by a hook)"
                    if self.checked
                    else "not replayed: the gradients were set outside a backward of this step"
                )
            incident = Incident(
                step=st.step, kind="nonfinite", phase=res.phase, op=res.op, module=res.module,
                line=res.line, code=res.code, value=res.value, input=res.input,
                inputs=res.inputs,
                changes=changes(self.last_good, norms, self.norm_type),
                micro_batch=res.micro_batch, replayed=res.replayed, note=res.note,
            )
            self._first_rank(incident)
        elif finite and (spike := self._spike_started()) is not None:
            incident = self._spike_incident(st.step, spike, norms)
        elif (  # growth needs a good step to grow from
            finite and not self.hot and self.last_good is not None
            and any(a.kind == "exploding" for a in alerts)
        ):
            incident = Incident(
                step=st.step, kind="exploding",
                changes=changes(self.last_good, norms, self.norm_type),
                note="the step was not replayed (its gradients are finite): the modules whose "
                "gradient norm grew most are listed",
            )
        self._keep_losses()
        self.pending = None
        self.samples = None
        self.checked = False
        self.evidence = None
        self.agreed = None
        self.replays = None
        # this step's own rate included: what an update-ratio spike of it, judged when its
        # ratios arrive (after this), is told (``update_cause``)
        self.rates_at = (st.step, list(self.rates), self.since)
        self.since = 0
        # the event stays open until FLAP_WINDOW finite logged steps passed (one incident,
        # one replay for a gradient that flaps)
        self.quiet = 0 if not finite else self.quiet + 1
        self.bad = self.quiet < FLAP_WINDOW
        self.hot = any(a.kind == "exploding" for a in alerts)  # one incident per explosion
        if finite and incident is None:
            self.last_good = norms
        if incident is not None and incident.kind == "nonfinite":
            self.current = incident
        return incident
