"""``GradMonitor``: per-parameter gradient statistics while a model trains.

Modules (capture touches torch; plain data and views do not):
    core             the public class, its hooks, the order of a step (capture)
    checks           set-up checks: arguments, watched parameters, wrapped optimizers
    watched          the watched parameters: one immutable snapshot, replaced when the model
                     changes
    step             the step clock and what a logged step accumulates on the device
    measure          device figures, and the ``Packet`` of the step's one transfer
    stats            the statistics kernels (foreach ops over all gradients)
    transfer         the one transfer to the host and the ``StepStats``
    records          host rows of a logged step as plain records
    distributed      across processes: ``Topology``, DTensor shards, the replication check
    forward_watch    ``modules=`` and ``activations=``: the forward side
    leaks            ``leaks=True``: graphs of earlier steps still alive
    scaler           a ``GradScaler`` as a step boundary
    incidents        each new bad event of a run becomes one ``Incident`` (capture)
    replay           the bad micro-batch replayed: where its first NaN/Inf came from
    replay_isolated  the replay's contract: training left exactly as it was
    rank_replay      under torch.distributed: each rank's replay exchanged, the first rank
    spike_samples    which examples of a spiking micro-batch carry its gradient
    log              ``StepStats``, ``ParamStats``, ``Alert``, ``MonitorLog``, ``Thresholds``,
                     ``read_jsonl`` (plain data)
    alerts           the alert rules over plain ``StepStats`` (plain data; replays a saved log)
    spikes           spike detection over logged steps (plain data)
    incident         ``Incident`` (plain data)
    views            the report, JSON Lines, CSV, TensorBoard and the plot

No module of the folder imports ``core``.

Cost (see ``stats`` for the detail): a logged step reads the gradients once for the
per-parameter norms (``torch._foreach_norm``) and moves one packed vector to the host; NaN and
Inf are detected from the norms and counted exactly only on a step that has them. Max/mean abs,
the zero fraction and the update-to-weight ratios (sampled) run on every ``full_every``-th
logged step; module statistics and activation checks only when asked for. A step that is not
logged runs no tensor op.

Which gradients, and when the step ends:
    * without ``optimizer=``, every backward that accumulates into a watched ``.grad`` is a
      step; the gradients are measured when it ends (post-accumulate-grad hooks queue a
      callback on the autograd engine; a second callback, queued from the first, runs after
      every callback queued during the backward, such as DDP's gradient averaging and FSDP2's
      reduce-scatter, so it sees the final ``.grad``);
    * with ``optimizer=`` the step ends at ``optimizer.step()`` (its post hook), and by default
      (``measure="backward"``) the gradients are those the last backward before it left: each
      backward of a logged step measures them on the device when it ends, the last one
      counts, so under gradient accumulation the figures are those of the accumulated
      gradient after the last micro-batch, and clipping (which runs between the backward and
      the step) is not seen: an explosion stays visible. ``measure="optimizer"`` measures at
      ``optimizer.step()`` instead: what the optimizer is given (after clipping). A step with
      no backward since the previous one (gradients set by hand) is measured at the step.
    * with ``scaler=`` (a ``torch.amp.GradScaler``) the norms are unscaled, and a step that
      the scaler skipped (non-finite gradients) is recorded with ``skipped=True`` and raises no
      alert; with ``optimizer=`` such a step ends at ``scaler.update()`` (the monitor wraps
      that method of the scaler instance, and unwraps it on ``remove()``).

Across processes (``torch.distributed`` initialised) the figures are global or labelled:
    * DTensor parameters (FSDP2 ``fully_shard``, tensor parallel, FSDP2 x TP, any mesh) and
      plain ones beside them: each rank measures its shards; one all-gather over the world
      per logged step carries them, and each parameter is made whole from one replica's
      shards (sums of p-th powers and of |g|, counts, maxima), the largest of its replicas
      kept (``distributed.Sharding``), so every rank reports the whole tensors;
    * other parameters: whether the ranks' gradients are identical (DDP however it was
      wrapped; hand-written all-reduce data parallelism) is detected at every logged step from
      a checksum of the per-parameter norms (one all-gather of three numbers per rank), or
      declared with ``replicated=``. Identical gradients are reported as they are (``scope``
      "global"); different ones are this rank's own (``scope`` "rank N"), never summed into a
      figure that means nothing. With ``optimizer=``, when the gradients are not identical
      when backward ends but are at ``optimizer.step()`` (all-reduced by hand in between),
      the monitor measures at the step from then on (``measured_at="optimizer"``).
"""
