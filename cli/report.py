"""``gradscope report FILE``: train a model file for N steps under ``gs.GradMonitor``.

The file follows the model-file contract; for training it also supplies ``loss_fn(output,
target)`` (or ``loss_fn(output)``), optionally ``batches()`` (an iterable of ``(inputs, target)``
pairs, or of inputs when ``loss_fn`` takes only the output; default: ``example_input`` and
``example_target`` again and again) and ``optimizer(params)`` (default SGD, lr 1e-2).

Exit codes: 0 trained and nothing non-finite; 1 NaN/Inf appeared (gradients or forward outputs);
2 the file could not be used.
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import gradscope as gs

if TYPE_CHECKING:
    import torch

NONFINITE = ("nan", "inf", "forward_nonfinite")

_LOSS_HINT = (
    "define loss_fn(output, target) (with batches() yielding (inputs, target) pairs or an "
    "example_target), or loss_fn(output)"
)


ReportError = gs.ReportError

def _loss_fn(mf: gs.ModelFile) -> tuple[Callable[..., Any], bool]:
    fn = mf.get("loss_fn")
    if fn is None or not callable(fn):
        raise ReportError(
            f"{mf.path}: report trains the model but the file defines no loss_fn; {_LOSS_HINT}"
        )
    return fn, mf.loss_takes_target


def _batches(mf: gs.ModelFile, example: Any, wants_target: bool) -> Iterator[tuple[Any, Any]]:
    """``(inputs, target)`` pairs (target None when loss_fn takes only the output)."""
    source = mf.get("batches")
    if source is None:
        target = mf.get("example_target")
        if wants_target and target is None:
            raise ReportError(
                f"{mf.path}: loss_fn takes (output, target) but the file has neither "
                f"batches() nor example_target; {_LOSS_HINT}"
            )
        return itertools.repeat((example, target))
    items = mf.call("calling batches()", source) if callable(source) else source
    it = iter(items)
    if not wants_target:
        return ((x, None) for x in it)
    return (_pair(mf, item) for item in it)


def _pair(mf: gs.ModelFile, item: Any) -> tuple[Any, Any]:
    if isinstance(item, (tuple, list)) and len(item) == 2:
        return item[0], item[1]
    raise ReportError(
        f"{mf.path}: batches() gave a {type(item).__name__}, but loss_fn takes "
        "(output, target), so each batch must be an (inputs, target) pair"
    )


def _optimizer(mf: gs.ModelFile, model: torch.nn.Module) -> torch.optim.Optimizer:
    import torch

    make = mf.get("optimizer")
    if make is None:
        return torch.optim.SGD(model.parameters(), lr=1e-2)
    opt = mf.call("calling optimizer(params)", lambda: make(model.parameters()))
    if not isinstance(opt, torch.optim.Optimizer):
        raise ReportError(
            f"{mf.path}: optimizer(params) returned a {type(opt).__name__}; expected "
            "a torch.optim.Optimizer, e.g. return torch.optim.SGD(params, lr=1e-2)"
        )
    return opt


def _model(mf: gs.ModelFile) -> tuple[torch.nn.Module, Any]:
    module, inputs, _ = mf.build()
    if module is None:
        raise ReportError(
            f"{mf.path}: report trains a model, but the entry point returned outputs, "
            "not a module; define model and example_input, or build() returning "
            "(model, inputs)"
        )
    return module, inputs


def _train_step(
    mf: gs.ModelFile,
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    loss_fn: Callable[..., Any],
    batch: tuple[Any, Any],
) -> None:
    import torch

    inputs, target = batch
    opt.zero_grad(set_to_none=True)
    out = mf.run_model(model, inputs)
    loss = mf.call(
        "running loss_fn", lambda: loss_fn(out) if target is None else loss_fn(out, target)
    )
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.grad_fn is None:
        raise ReportError(
            f"{mf.path}: loss_fn returned {type(loss).__name__} "
            f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else ''}; expected "
            "a scalar tensor that depends on the model's parameters"
        )
    mf.call("running backward", loss.backward)
    mf.call("running optimizer.step()", opt.step)


def _progress(err: Console) -> Progress:
    return Progress(
        TextColumn("training"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("total grad norm {task.fields[norm]}"),
        TimeElapsedColumn(),
        console=err,
    )


def _train(mf: gs.ModelFile, steps: int, every: int, err: Console) -> gs.GradMonitor:
    model, example = _model(mf)
    loss_fn, wants_target = _loss_fn(mf)
    batches = _batches(mf, example, wants_target)
    opt = _optimizer(mf, model)
    model.train()
    with (
        # a diagnostic run of a few steps: full statistics at every logged step
        gs.GradMonitor(model, every=every, optimizer=opt, activations=True, full_every=1) as mon,
        _progress(err) as bar,
    ):
        task = bar.add_task("train", total=steps, norm="-")
        for _ in range(steps):
            batch = mf.call("taking the next batch from batches()", next, batches, None)
            if batch is None:
                err.print(f"batches() ran out after {mon.step} steps", markup=False)
                break
            _train_step(mf, model, opt, loss_fn, batch)
            norm = f"{mon.history[-1].total_norm:.4g}" if mon.history else "-"
            bar.update(task, advance=1, norm=norm)
    return mon


def report(
    target: Annotated[
        str, typer.Argument(metavar="FILE[:NAME]", help="A model file, e.g. samples/mlp.py")
    ],
    steps: Annotated[
        int, typer.Option("--steps", "-n", min=1, help="Optimizer steps to train.")
    ] = 20,
    every: Annotated[int, typer.Option("--every", "-k", min=1, help="Log one step in K.")] = 1,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write JSON Lines, one object per logged step.")
    ] = None,
    csv_path: Annotated[
        Path | None, typer.Option("--csv", help="Write CSV, one row per step and parameter.")
    ] = None,
    plot_path: Annotated[
        Path | None,
        typer.Option("--plot", help="Write a PNG gradient-flow chart (needs matplotlib)."),
    ] = None,
) -> None:
    """Train FILE for N steps with the gradient monitor, then print the gradient report."""
    if plot_path is not None and importlib.util.find_spec("matplotlib") is None:
        raise ReportError(
            "--plot needs matplotlib, which is not installed; pip install gradscope[plot]"
        )
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    mf = gs.load_model_file(target)
    mon = _train(mf, steps, every, err)
    Console(highlight=False, soft_wrap=False).print(mon.report())
    for path, write in ((json_path, mon.to_jsonl), (csv_path, mon.to_csv), (plot_path, mon.plot)):
        if path is not None:
            write(path)
            err.print(f"wrote {path}", markup=False)
    raise typer.Exit(1 if any(a.kind in NONFINITE for a in mon.alerts) else 0)


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to the gradscope app."""
    app.command("report")(report)
