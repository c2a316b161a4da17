"""``gradscope memory FILE``: activation memory per module, and a checkpoint plan under a budget.

The file follows the model-file contract (a module and its inputs); when it defines
``loss_fn(output)`` (or ``loss_fn(output, target)`` with ``example_target``) the forward includes
the loss, as in a training step. torch and gradscope are imported inside the command, so
``gradscope --help`` stays cheap.

Exit codes: 0 done (and, with ``--budget``, the plan measured within its budget, its outputs
equal to the model's without it); 1 the applied plan measured above its budget, or its outputs
differ; 2 the file, the budget or an option could not be used.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Any

import typer


def memory(
    target: Annotated[
        str, typer.Argument(metavar="FILE[:NAME]", help="A model file, e.g. samples/cnn.py")
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
) -> None:
    """Activation memory per module, what checkpointing each frees, and a plan under --budget."""
    from rich.console import Console

    import gradscope as gs

    if plot_path is not None and importlib.util.find_spec("matplotlib") is None:
        raise gs.MissingExtraError(
            "--plot needs matplotlib, which is not installed; pip install gradscope[plot]"
        )
    if autocast is not None and autocast.lower() not in ("bf16", "fp16", "bfloat16", "float16"):
        raise gs.BudgetError(f"--autocast {autocast!r}: expected bf16 or fp16")
    for size in (budget, max_recompute):
        if size is not None:
            gs.parse_size(size, of=1)  # a budget that cannot be read: say so before the forward
    # absolute, symlinks followed, non-files refused: before the model file runs (it may chdir)
    json_out = gs.output_target(json_path) if json_path is not None else None
    plot_out = gs.output_target(plot_path) if plot_path is not None else None
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    out = Console(highlight=False, soft_wrap=False)
    mf = gs.load_model_file(target)
    model, inputs, _ = mf.build()
    if model is None:
        raise gs.ModelFileError(
            f"{mf.path}: memory runs a module's forward, but the entry point returned outputs; "
            "define model and example_input, or build() returning (model, inputs)"
        )
    args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    loss_fn = (lambda output: mf.loss(output)) if callable(mf.get("loss_fn")) else None
    report = mf.call("running the forward", gs.activation_report, model, *args,
                     loss_fn=loss_fn, autocast=autocast, batch_scale=scale_batch)
    out.print(report.render(top=top))
    data: dict[str, Any] = {}
    plan = verification = None
    code = 0
    if budget is not None:
        plan = gs.plan_checkpoints(model, *args, budget=budget, loss_fn=loss_fn, report=report,
                                   max_recompute=max_recompute)
        blocks = report.blocks()
        every = report.evaluate(blocks) if blocks else None
        if report.device.startswith("meta"):
            err.print("the model is on the meta device: the plan is not measured", markup=False)
        else:
            verification = mf.call("measuring the plan", plan.verify, model, *args,
                                   loss_fn=loss_fn)
            code = 0 if verification.fits and verification.outputs_equal is not False else 1
        out.print(plan.render(verification, every))
        data["plan"] = plan.to_dict()
        data["every_block"] = every.to_dict() if every is not None else None
        if verification is not None:
            data["verification"] = {"measured": verification.measured,
                                    "measured_baseline": verification.measured_baseline,
                                    "method": verification.method,
                                    "outputs_equal": verification.outputs_equal}
    if json_out is not None:
        report.write_json(json_out, **data)
        err.print(f"wrote {json_path}", markup=False)
    if plot_out is not None:
        report.plot(plot_out, chosen=plan,
                    measured=verification.measured if verification else None,
                    title=mf.path.name)
        err.print(f"wrote {plot_path}", markup=False)
    raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Add the ``memory`` command to the gradscope app."""
    app.command("memory")(memory)
