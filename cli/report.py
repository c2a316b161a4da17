"""``gradscope report FILE``: train a model file for N steps under ``gs.GradMonitor``.

The training half of the model-file contract (``loss_fn``, ``batches()``, ``optimizer(params)``
and their defaults) is ``ModelFile.training()`` in ``gradscope.modelfile``; this command
runs it with a progress bar and prints the report. The output paths (``--json``, ``--csv``,
``--plot``) are settled before the model file runs.

Exit codes: 0 trained and nothing non-finite; 1 NaN/Inf appeared (gradients or forward outputs)
or an incident was recorded (printed above the table: where the first bad step began); 2 the
file could not be used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import gradscope as gs

from .common import (
    MODEL_FILE_EPILOG,
    cell,
    model_code,
    note,
    plural,
    require_plot,
    show,
    stderr,
    stdout,
)
from .outputs import settle
from .process import check_signals

NONFINITE = ("nan", "inf", "forward_nonfinite")

ReportError = gs.ReportError


def _progress(err: Console) -> Progress:
    return Progress(
        TextColumn("training"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("total grad norm {task.fields[norm]}"),
        TimeElapsedColumn(),
        console=err,
        # a bar is for a person watching: piped or logged stderr gets no frames of it (a
        # Ctrl-C would otherwise leave a half-drawn bar above "gradscope: interrupted")
        disable=not err.is_terminal,
    )


def _train(mf: gs.ModelFile, steps: int, every: int, err: Console) -> gs.GradMonitor:
    training = mf.training()
    training.model.train()
    with (
        # a diagnostic run of a few steps: full statistics at every logged step
        gs.GradMonitor(training.model, every=every, optimizer=training.optimizer,
                       activations=True, full_every=1, loss_fn=training.loss_fn) as mon,
        _progress(err) as bar,
    ):
        task = bar.add_task("train", total=steps, norm="-")
        for _ in range(steps):
            batch = training.next_batch()
            if batch is None:
                err.print(cell(f"batches() ran out after {plural(mon.step, 'step')}"))
                break
            check_signals()  # a Ctrl-C swallowed by the model's code still stops training
            if batch[1] is not None:
                mon.target(batch[1])  # a replay of a bad step recomputes loss_fn(output, target)
            if training.ids is not None:  # a spike names the batch's examples by them
                mon.observe_batch_ids(training.ids)
            training.step(batch, on_loss=mon.observe_loss)  # the loss: read in the one transfer
            norm = f"{mon.history[-1].total_norm:.4g}" if mon.history else "-"
            bar.update(task, advance=1, norm=norm)
    return mon


def report(
    target: Annotated[
        str, typer.Argument(
            metavar="FILE[:NAME]", help="A model file, e.g. mlp.py (gradscope example mlp)"
        )
    ],
    steps: Annotated[
        int, typer.Option("--steps", "-n", min=1, help="Optimizer steps to train.")
    ] = 20,
    every: Annotated[int, typer.Option("--every", "-k", min=1, help="Log one step in K.")] = 1,
    json_path: Annotated[
        Path | None,
        typer.Option("--json", help="Write the log as one JSON document (steps in a list)."),
    ] = None,
    jsonl_path: Annotated[
        Path | None, typer.Option("--jsonl", help="Write JSON Lines, one object per logged step.")
    ] = None,
    csv_path: Annotated[
        Path | None, typer.Option("--csv", help="Write CSV, one row per step and parameter.")
    ] = None,
    plot_path: Annotated[
        Path | None,
        typer.Option("--plot", help="Write a PNG gradient-flow chart (needs matplotlib)."),
    ] = None,
    mkdir: Annotated[
        bool, typer.Option("--mkdir", help="Create the folders of the outputs if missing.")
    ] = False,
) -> None:
    """Train FILE for N steps with the gradient monitor, then print the gradient report."""
    if plot_path is not None:
        require_plot()
    # absolute, symlinks followed, non-files and inputs refused: before the model file runs
    settled = settle([("--json", json_path), ("--jsonl", jsonl_path), ("--csv", csv_path),
                      ("--plot", plot_path)],
                     inputs=[("the model file", gs.model_file_path(target))], mkdir=mkdir,
                     suffixes={"--plot": (".png",)})
    outputs = [(o.given, o.path, method) for o, method in
               zip(settled, ("to_json", "to_jsonl", "to_csv", "plot"), strict=True)
               if o is not None]
    err = stderr()
    with model_code():
        mf = gs.load_model_file(target)
        mon = _train(mf, steps, every, err)
    show(mon.report(), console=stdout(wrap=True))
    for given, path, method in outputs:
        getattr(mon, method)(path)
        note(f"wrote {given}")
    raise typer.Exit(1 if mon.incidents or any(a.kind in NONFINITE for a in mon.alerts) else 0)


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to the gradscope app."""
    app.command("report", epilog=MODEL_FILE_EPILOG)(report)
