"""``gradscope doctor FILE``: run a model file's forward, loss and backward under ``gs.doctor``
(and two training steps with its ``optimizer()`` / ``batches()`` when the file has them) and
print what the doctor found.

Exit codes: 0 healthy (no finding); 1 findings (printed; an autograd error torch raised is one
of them, explained); 2 the file could not be used (one line on stderr).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

import gradscope as gs

from .common import note, show
from .main import EXIT_FOUND, EXIT_OK

#: Training steps run when the file defines optimizer() or batches().
STEPS = 2


def _autograd_cause(exc: BaseException) -> bool:
    """The model file's run ended in an autograd error the doctor explained."""
    seen = 0
    cause: BaseException | None = exc
    while cause is not None and seen < 4:
        if isinstance(cause, gs.AutogradError):
            return True
        cause = cause.__cause__
        seen += 1
    return False


def _one_step(mf: Any, held: list[Any]) -> None:
    import torch

    module, inputs, _ = mf.build()
    if module is None:
        raise gs.ModelFileError(
            f"{mf.path}: doctor runs the forward itself, but the entry point returned outputs; "
            "define model and example_input, or build() returning (model, inputs)"
        )
    doc = gs.doctor(module)
    held.append(doc)
    with doc, torch.enable_grad():
        out = mf.run_model(module, inputs)
        loss = mf.loss(out) if callable(mf.get("loss_fn")) else out
        if isinstance(loss, torch.Tensor) and loss.numel() != 1:
            loss = loss.sum()
        mf.call("running backward", loss.backward)


def _training(mf: Any, held: list[Any]) -> None:
    training = mf.training()
    doc = gs.doctor(training.model, optimizer=training.optimizer)
    held.append(doc)
    with doc:
        for _ in range(STEPS):
            batch = training.next_batch()
            if batch is None:
                break
            training.step(batch)


def doctor(
    target: Annotated[
        str, typer.Argument(metavar="FILE[:NAME]", help="A model file, e.g. samples/mlp.py")
    ],
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the findings as JSON.")
    ] = None,
) -> None:
    """Explain autograd errors and silent failures: in-place changes of saved tensors, a second
    backward through a freed graph, a loss without a graph, parameters left without gradients,
    and training-loop slips (exit code 1 when anything is found)."""
    # absolute, symlinks followed, non-files refused: before the model file runs (it may chdir)
    json_out = gs.output_target(json_path) if json_path is not None else None
    mf = gs.load_model_file(target)
    loop = callable(mf.get("loss_fn")) and (mf.has("optimizer") or mf.has("batches"))
    held: list[Any] = []  # the doctor, kept when the step raises
    try:
        (_training if loop else _one_step)(mf, held)
    except gs.ModelFileError as exc:
        if not held or not _autograd_cause(exc):
            raise
    report = held[0].report()
    console = Console(highlight=False, soft_wrap=False, width=min(Console().width, 80))
    show(report.render(), console=console)
    if json_out is not None:
        report.write_json(json_out)
        note(f"wrote {json_path}")
    raise typer.Exit(EXIT_FOUND if report.findings else EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add the ``doctor`` command to the gradscope app."""
    app.command("doctor")(doctor)
