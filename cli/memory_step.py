"""``gradscope memory FILE --step``: the peak memory of a whole training step (forward,
backward, optimizer step), where it occurs and what is live then; with ``--capacity`` whether
it fits, and the largest batch that does when the file defines ``build_inputs(batch)``.

Exit codes: 0 done (and, with ``--capacity``, the step fits); 1 the step does not fit the
capacity; 2 the file or an option could not be used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

OPTIMIZERS = ("adamw", "sgd", "none")


def check_options(optimizer: str | None, capacity: str | None) -> None:
    """Refuse a bad ``--optimizer`` or ``--capacity`` before the model file runs."""
    import gradscope as gs

    if optimizer is not None and optimizer.lower() not in OPTIMIZERS:
        raise gs.BudgetError(f"--optimizer {optimizer!r}: expected one of adamw, sgd, none")
    if capacity is not None:
        if capacity.strip().endswith("%"):
            raise gs.BudgetError(
                f"--capacity {capacity!r}: give a size (24GiB, 80GB), not a share"
            )
        try:
            gs.parse_size(capacity)
        except (OverflowError, ValueError):
            raise gs.BudgetError(
                f"--capacity {capacity!r} is not a size; give e.g. 24GiB"
            ) from None


def run_tool(mf: Any, doing: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``mf.call(doing, fn, ...)`` for a gradscope tool that runs the file's code: what the
    file's code raised is named at its line, as ``mf.call`` does; a one-line ``GradscopeError``
    the tool raised on purpose (LBFGS, a frozen model, a captured target) is passed on as it is,
    not as an error at a line of gradscope."""
    import gradscope as gs

    try:
        return mf.call(doing, fn, *args, **kwargs)
    except gs.ModelFileError as exc:
        cause = exc.__cause__
        if isinstance(cause, gs.GradscopeError) and not isinstance(cause, gs.ModelFileError):
            raise cause from None
        raise


def _is_terminal() -> bool:
    from .process import real_stderr

    stream = real_stderr()
    try:
        return stream is not None and stream.isatty()
    except (OSError, ValueError):
        return False


def _takes_target(mf: Any) -> bool:
    """Whether the file's ``loss_fn`` takes ``(output, target)`` (and the file gives one)."""
    import gradscope as gs

    try:
        return mf.target_builder() is not None
    except gs.ModelFileError:  # no target at all: the loss itself says so, in one line
        return False


def _optimizer(mf: Any, model: Any, name: str | None) -> Any:
    import torch

    if name is None:
        make = mf.get("optimizer")
        if callable(make):
            return mf.call("building the optimizer", make, model.parameters())
        return None
    name = name.lower()
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-3)
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=1e-2)
    return None


def run_step(mf: Any, model: Any, args: tuple[Any, ...], *, optimizer: str | None,
             capacity: str | None, autocast: str | None, out: Any, json_out: Path | None,
             plot_out: Path | None, json_path: Path | None, plot_path: Path | None) -> int:
    """Record the step, print it, write ``--json`` / ``--plot``; returns the exit code."""
    import dataclasses

    import gradscope as gs

    from .common import note, show

    loss_fn: Any = (lambda output: mf.loss(output)) if callable(mf.get("loss_fn")) else None
    step_target = None
    if loss_fn is not None and _takes_target(mf) and mf.get("example_target") is not None:
        # the target goes with the batch (on a meta model it follows the model's stand-ins)
        step_target = mf.get("example_target")
        loss_fn = lambda output, t: mf.loss(output, t)  # noqa: E731
    opt = _optimizer(mf, model, optimizer)
    mem = run_tool(mf, "running the training step", gs.step_memory, model, *args,
                   optimizer=opt, loss_fn=loss_fn, autocast=autocast, target=step_target)
    if not mem.device.startswith("meta"):
        first, steady, method = run_tool(mf, "measuring the step", gs.measure_step, model,
                                         *args, optimizer=opt, loss_fn=loss_fn,
                                         autocast=autocast, target=step_target)
        mem = dataclasses.replace(mem, measured=max(first, steady), measured_method=method)
    show(mem.render(), console=out)
    code = 0
    found = None
    if capacity is not None:
        fits = mem.fits(capacity)
        size = gs.format_bytes(gs.parse_size(capacity))
        note(f"the step {'fits' if fits else 'does NOT fit'} in {size}")
        code = 0 if fits else 1
        build = mf.get("build_inputs")
        if callable(build):
            target = mf.target_builder()  # each candidate's whole batch: inputs and target
            raw_loss = mf.get("loss_fn") if target is not None else loss_fn

            def tried(batch: int, peak: int) -> None:  # progress, on a terminal
                if terminal:
                    fits = "fits" if peak <= gs.parse_size(capacity) else "does not fit"
                    note(f"batch {batch}: peak {gs.format_bytes(peak)} ({fits})")

            terminal = _is_terminal()
            found = run_tool(mf, "searching the largest batch", gs.max_batch, build, model,
                             capacity, optimizer=opt, loss_fn=raw_loss, autocast=autocast,
                             build_target=target, progress=tried)
            show(found.summary(), console=out)
    if json_out is not None:
        extra: dict[str, Any] = {}
        if found is not None:
            extra["max_batch"] = {"batch": found.batch, "capacity": found.capacity,
                                  "peak": found.peak, "next_peak": found.next_peak}
        mem.write_json(json_out, **extra)
        note(f"wrote {json_path}")
    if plot_out is not None:
        mem.plot(plot_out, title=mf.path.name)
        note(f"wrote {plot_path}")
    return code
