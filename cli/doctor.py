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

from .common import MODEL_FILE_EPILOG, note, show
from .outputs import settle
from .process import EXIT_FOUND, EXIT_OK

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


def _model(mf: Any, command: str) -> tuple[Any, Any]:
    """The model file's module and inputs; ``command`` runs the forward itself."""
    module, inputs, _ = mf.build()
    if module is None:
        raise gs.ModelFileError(
            f"{mf.path}: {command} runs the forward itself, but the entry point returned "
            "outputs; define model and example_input, or build() returning (model, inputs)"
        )
    return module, inputs


def _loss(mf: Any, out: Any) -> Any:
    """What backward starts from: ``loss_fn(out)`` when the file has one, else the output,
    summed when it is not a scalar."""
    import torch

    loss = mf.loss(out) if callable(mf.get("loss_fn")) else out
    return loss.sum() if isinstance(loss, torch.Tensor) and loss.numel() != 1 else loss


def _one_step(mf: Any, held: list[Any]) -> None:
    import torch

    module, inputs = _model(mf, "doctor")
    doc = gs.doctor(module)
    held.append(doc)
    with doc, torch.enable_grad():
        loss = _loss(mf, mf.run_model(module, inputs))
        mf.call("running backward", loss.backward)


def doctor_graph(mf: Any, *, saved: bool = True) -> tuple[gs.Graph, Any]:
    """``render --doctor``: the model file's forward and loss (scopes recorded), the loss's
    graph traced by the doctor (``Doctor.trace``, so the findings name their nodes there), then
    backward, all under ``gs.doctor``. Returns the graph and the doctor's ``DoctorReport``; an
    autograd error is a finding, not a failure. A loss with no graph to draw: the findings are
    said and the command exits 1 here."""
    import torch

    module, inputs = _model(mf, "--doctor")
    doc = gs.doctor(module)
    graph: gs.Graph | None = None
    made: list[Any] = []
    try:
        with doc, torch.enable_grad(), gs.scopes(module):
            out = mf.run_model(module, inputs)
            loss = _loss(mf, out)
            made += [out, loss]
            try:
                graph = doc.trace(loss, saved=saved, inputs=inputs)
            except gs.NoGradError:
                graph = None  # backward below says why (no_grad_fn)
            mf.call("running backward", loss.backward)
    except gs.ModelFileError as exc:
        if not _autograd_cause(exc):
            raise
    finally:
        gs.release(tuple(made))  # node by node: a deep chain would overflow the C stack
    report = doc.report()
    if graph is None:  # nothing to draw: the findings say why (exit 1)
        doctor_said(report)
        raise gs.NoGradError("the loss has no autograd graph to draw, and the doctor found no "
                             "cause; check that the forward runs with gradients enabled")
    return graph, report


def doctor_notes(report: Any, notes: dict[str, str] | None) -> dict[str, str]:
    """The label lines of a picture (``--memory``'s, if any) with what the doctor says of each
    finding's node (``DoctorReport.node_notes``)."""
    merged = dict(notes or {})
    for nid, text in report.node_notes().items():
        merged[nid] = f"{merged[nid]}; {text}" if nid in merged else text
    return merged


def doctor_said(report: Any) -> None:
    """After ``render --doctor`` wrote its file: the verdict and each finding's title and
    message on standard error; exit 1 when there is a finding (as ``gradscope doctor``)."""
    note(f"doctor: {report.verdict()}")
    for f in report.findings:
        note(f"  {f.title()}: {f.message}")
    if report.findings:
        raise typer.Exit(EXIT_FOUND)


DoctorOpt = typer.Option(
    False, "--doctor",
    help="Run the forward, loss and backward under gs.doctor and mark each finding's nodes "
    "(the op that saved a tensor, the in-place op that changed it); exit 1 when it finds any.",
)


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
        str, typer.Argument(
            metavar="FILE[:NAME]", help="A model file, e.g. mlp.py (gradscope example mlp)"
        )
    ],
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Also write the findings as JSON.")
    ] = None,
    mkdir: Annotated[
        bool, typer.Option("--mkdir", help="Create the folder of --json if missing.")
    ] = False,
) -> None:
    """Explain autograd errors and silent failures (exit code 1 when anything is found).

    Refused: a saved tensor changed in place, a second backward through a freed graph.

    Skipped: a loss without a graph, a parameter whose .grad stays None.

    Training-loop slips: a parameter missing from the optimizer, no zero_grad(), eval() mode."""
    # absolute, symlinks followed, non-files and inputs refused: before the model file runs
    (json_out,) = settle([("--json", json_path)],
                         inputs=[("the model file", gs.model_file_path(target))], mkdir=mkdir)
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
        report.write_json(json_out.path)
        note(f"wrote {json_path}")
    raise typer.Exit(EXIT_FOUND if report.findings else EXIT_OK)


def register(app: typer.Typer) -> None:
    """Add the ``doctor`` command to the gradscope app."""
    app.command("doctor", epilog=MODEL_FILE_EPILOG)(doctor)
