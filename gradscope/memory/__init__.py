"""Memory: what autograd holds, what a forward's activations cost, the peak of a whole step.

Saved memory (the tensors autograd saves, and graphs kept alive):
    saved                  ``gs.saved_memory``, ``gs.leak_check`` (capture)
    saved_records          ``MemoryReport``, ``Leak``, ``LeakStep``; a graph's memory (plain data)
    saved_views            their rich renderings

Activations and checkpoint plans:
    activations            ``gs.activation_report``, ``gs.plan_checkpoints``,
                           ``gs.measure_forward`` (capture)
    activations_recorder   recording one forward's saved storages per module (capture)
    measure_forward        the bytes a forward allocates and holds, measured (capture)
    checkpoint_apply       a plan applied: planned modules or segments checkpointed (capture)
    checkpoint_peak        plans chosen against the peak of the whole step (capture)
    activations_records    ``ActivationReport``, ``ModuleRow``, ``Verification``, the planner
                           (plain data)
    activations_types      sizes (``parse_size``) and the records a recorded forward is read
                           into (plain data)
    activations_views      the per-module table, the plan, the memory/recompute curve

The peak of a whole training step:
    step                   ``gs.step_memory``, ``gs.max_batch``, ``gs.measure_step`` (capture)
    step_recorder          every storage's life through a step (a dispatch mode; capture)
    step_records           ``StepMemory``, ``MaxBatch`` (plain data)
    step_views             the peak table and the timeline plot

Running the user's code where it changes nothing (every tool above that runs a forward or a
step):
    untouched              ``isolated`` (a forked child), ``restored`` (the in-process
                           fallback: what a run can reach, put back), ``captured_error``
                           (capture)
"""
