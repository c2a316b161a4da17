"""``gradscope memory FILE``: activation memory per module, and a checkpoint plan under a budget.

The file follows the model-file contract (a module and its inputs, taken as ``render`` takes
them: a tuple or list spread as arguments, a dict as keywords, anything else as one argument);
when it defines
``loss_fn(output)`` (or ``loss_fn(output, target)`` with ``example_target``) the forward includes
the loss, as in a training step. torch and gradscope are imported inside the command, so
``gradscope --help`` stays cheap.

Exit codes: 0 done (and, with ``--budget``, the plan measured within its budget, its outputs
equal to the model's without it); 1 the applied plan measured above its budget, or its outputs
differ; 2 the file, the budget or an option could not be used.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from .common import MODEL_FILE_EPILOG, model_code, note, require_plot, show, stdout
from .outputs import settle


def _check_size(option: str, value: str) -> None:
    """A size that cannot be read (or is too large to be one: ``1e999``, ``1e400%``) is said
    before the forward, in one line."""
    import gradscope as gs

    try:
        gs.parse_size(value, of=2**63)  # any baseline a plan can have: no overflow later
    except (OverflowError, ValueError):
        raise gs.BudgetError(
            f"{option} {value!r} is not a size gradscope can use (too large or not a finite "
            "number); give bytes or a number with a unit, like 2GiB, or a share like 50%"
        ) from None


@contextlib.contextmanager
def _spread(model: Any, inputs: Any) -> Iterator[tuple[Any, ...]]:
    """The positional inputs to hand ``activation_report`` and the plan, taken as ``render``
    takes a model file's inputs: a tuple or list spread, a dict as keywords (passed as one
    value, turned into keywords by a pre-hook on the model while the block runs)."""
    if isinstance(inputs, (tuple, list)):
        yield tuple(inputs)
        return
    if not isinstance(inputs, dict):
        yield (inputs,)
        return

    def as_keywords(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        del module
        if len(args) == 1 and isinstance(args[0], dict) and not kwargs:
            return (), dict(args[0])
        return None

    handle = model.register_forward_pre_hook(as_keywords, with_kwargs=True)
    try:
        yield (inputs,)
    finally:
        handle.remove()


def memory(
    target: Annotated[
        str, typer.Argument(
            metavar="FILE[:NAME]",
            help="A model file, e.g. memory_blocks.py (gradscope example memory_blocks)",
        )
    ],
    budget: Annotated[
        str | None,
        typer.Option("--budget", "-b",
                     help="Plan checkpoints to fit this size (2GiB, 300MB, 50% of the "
                          "baseline), apply the plan and measure it."),
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the report (and plan) as JSON.")
    ] = None,
    plot_path: Annotated[
        Path | None,
        typer.Option("--plot", help="Write the memory-vs-recompute curve as PNG (matplotlib)."),
    ] = None,
    autocast: Annotated[
        str | None, typer.Option("--autocast", help="Add a column: bf16 or fp16 autocast.")
    ] = None,
    scale_batch: Annotated[
        float | None,
        typer.Option("--scale-batch", min=0.0,
                     help="Add a column: the batch scaled by K (linear extrapolation)."),
    ] = None,
    max_recompute: Annotated[
        str | None,
        typer.Option("--max-recompute",
                     help="With --budget: leave out modules that free more than this (what "
                          "the backward brings back at once when it recomputes one)."),
    ] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="Show at most N modules.")] = 20,
    mkdir: Annotated[
        bool, typer.Option("--mkdir", help="Create the folders of --json/--plot if missing.")
    ] = False,
    step: Annotated[
        bool, typer.Option("--step", help="The peak of a whole training step (forward, "
                           "backward, optimizer) instead: where it occurs, what is live then.")
    ] = False,
    optimizer: Annotated[
        str | None, typer.Option("--optimizer", help="With --step: adamw, sgd or none "
                                 "(default: the file's optimizer(params), else none).")
    ] = None,
    capacity: Annotated[
        str | None, typer.Option("--capacity", help="With --step: does it fit this size "
                                 "(24GiB)? With build_inputs(batch) in the file: the largest "
                                 "batch that fits.")
    ] = None,
) -> None:
    """Activation memory per module, what checkpointing each frees, and a plan under --budget."""
    import gradscope as gs

    from .memory_step import check_options, run_step

    check_options(optimizer, capacity)

    if plot_path is not None:
        require_plot()
    if autocast is not None and autocast.lower() not in ("bf16", "fp16", "bfloat16", "float16"):
        raise gs.BudgetError(f"--autocast {autocast!r}: expected bf16 or fp16")
    if scale_batch is not None and not (math.isfinite(scale_batch) and scale_batch > 0):
        raise gs.BudgetError(
            f"--scale-batch {scale_batch:g}: expected a finite factor above 0, like 2 or 0.5"
        )
    for option, size in (("--budget", budget), ("--max-recompute", max_recompute)):
        if size is not None:
            _check_size(option, size)  # a budget that cannot be read: said before the forward
    # absolute, symlinks followed, non-files and inputs refused: before the model file runs
    json_out, plot_out = (
        None if o is None else o.path
        for o in settle([("--json", json_path), ("--plot", plot_path)],
                        inputs=[("the model file", gs.model_file_path(target))], mkdir=mkdir,
                        suffixes={"--plot": (".png",)})
    )
    out = stdout(wrap=True)
    with model_code():
        mf = gs.load_model_file(target)
        model, inputs, _ = mf.build()
    if model is None:
        raise gs.ModelFileError(
            f"{mf.path}: memory runs a module's forward, but the entry point returned outputs; "
            "define model and example_input, or build() returning (model, inputs)"
        )
    with model_code(), _spread(model, inputs) as args:
        if step:
            code = run_step(mf, model, args, optimizer=optimizer, capacity=capacity,
                            autocast=autocast, out=out, json_out=json_out, plot_out=plot_out,
                            json_path=json_path, plot_path=plot_path)
        else:
            code = _measure(mf, model, args, budget, max_recompute, autocast, scale_batch, top,
                            out, json_out, plot_out, json_path, plot_path)
    raise typer.Exit(code)


def _measure(mf: Any, model: Any, args: tuple[Any, ...], budget: str | None,
             max_recompute: str | None, autocast: str | None, scale_batch: float | None,
             top: int, out: Any, json_out: Path | None, plot_out: Path | None,
             json_path: Path | None, plot_path: Path | None) -> int:
    """The report (and plan) printed and written; the exit code."""
    import gradscope as gs

    from .memory_step import run_tool

    loss_fn = mf.batch_loss()  # --scale-batch runs half the batch: its target is cut alike
    report = run_tool(mf, "running the forward", gs.activation_report, model, *args,
                     loss_fn=loss_fn, autocast=autocast, batch_scale=scale_batch)
    show(report.render(top=top), console=out)
    data: dict[str, Any] = {}
    plan = verification = None
    code = 0
    if budget is not None:
        plan = gs.plan_checkpoints(model, *args, budget=budget, loss_fn=loss_fn, report=report,
                                   max_recompute=max_recompute)
        blocks = report.blocks()
        every = report.evaluate(blocks) if blocks else None
        if report.device.startswith("meta"):
            note("the model is on the meta device: the plan is not measured")
        else:
            verification = run_tool(mf, "measuring the plan", plan.verify, model, *args,
                                   loss_fn=loss_fn)
            code = 0 if verification.fits and verification.equal else 1
        show(plan.render(verification, every), console=out)
        data["plan"] = plan.to_dict()
        data["every_block"] = every.to_dict() if every is not None else None
        if verification is not None:
            data["verification"] = {"measured": verification.measured,
                                    "measured_baseline": verification.measured_baseline,
                                    "method": verification.method,
                                    "outputs_equal": verification.outputs_equal,
                                    "buffers_equal": verification.buffers_equal}
    if json_out is not None:
        report.write_json(json_out, **data)
        note(f"wrote {json_path}")
    if plot_out is not None:
        report.plot(plot_out, chosen=plan,
                    measured=verification.measured if verification else None,
                    title=mf.path.name)
        note(f"wrote {plot_path}")
    return code


def register(app: typer.Typer) -> None:
    """Add the ``memory`` command to the gradscope app."""
    app.command("memory", epilog=MODEL_FILE_EPILOG)(memory)
