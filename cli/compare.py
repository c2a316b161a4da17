"""``gradscope compare``: where two runs of the same step diverge.

``gradscope compare FILE --candidate bf16|fp16|compile|float64`` runs the model file's
forward, loss and backward twice under ``gs.record_numerics``, from the same initial weights
(two deep copies of the model the file builds) and the same random draws: the reference in
float32 eager, the candidate as asked (``bf16``: ``torch.autocast`` to bfloat16; ``fp16``: the
model and its floating-point inputs in float16; ``compile``: ``torch.compile`` with the
``aot_eager`` backend, whose ops the recorder sees; ``float64``: the model and inputs in
float64), then compares them with ``gs.compare_runs``.

``gradscope compare A.json B.json`` compares two runs saved with ``NumericsRun.save`` (from two
processes, ranks, machines or torch versions); A is the reference.

``--html PATH`` (with a model file) writes the candidate's graph page with the divergence drawn
on it (``gs.trace_divergence``): each node coloured by its error against the reference, the
first divergence marked and shown first. Two saved runs have no graph to draw: ``--html`` with
them is refused (exit 2).

Exit codes: 0 the runs agree within tolerance; 1 a divergence was found (printed); 2 the input
could not be used (a missing file, a JSON document of another kind, runs of different models:
one line on stderr).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

import gradscope as gs

from .common import MODEL_FILE_EPILOG, fail, model_code, note, read_document, show
from .outputs import settle
from .process import EXIT_FOUND, EXIT_OK

#: What ``--candidate`` takes.
CANDIDATES = ("bf16", "fp16", "compile", "float64")


def _cast(value: Any, dtype: Any) -> Any:
    """Every floating-point tensor in ``value`` (a tensor, tuple, list or dict) as ``dtype``."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cast(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    return value


def _loss(mf: Any, out: Any, dtype: Any) -> Any:
    """What backward starts from: ``loss_fn`` (with the file's target in the run's dtype),
    else the output, summed when it is not a scalar."""
    import torch

    if callable(mf.get("loss_fn")):
        if mf.loss_takes_target:
            target = mf.get("example_target")
            loss = mf.loss(out, _cast(target, dtype) if dtype is not None else target)
        else:
            loss = mf.loss(out)
    else:
        loss = out
    if isinstance(loss, (tuple, list)) and loss and isinstance(loss[0], torch.Tensor):
        loss = loss[0]
    if not isinstance(loss, torch.Tensor):
        raise gs.ModelFileError(f"{mf.path}: compare needs a tensor to run backward from; "
                                f"loss_fn (or the model) gave {type(loss).__name__}")
    return loss.sum() if loss.numel() != 1 else loss


def run_model_file(mf: Any, module: Any, inputs: Any, candidate: str | None
                   ) -> tuple[gs.NumericsRun, Any, Any]:
    """One recorded forward, loss and backward of a deep copy of ``module`` (``candidate``
    None: the float32 eager reference), from the RNG state seeded the same for every run:
    the run, the loss (its autograd graph still walkable) and the model copy that ran."""
    import contextlib

    import torch

    model = copy.deepcopy(module)
    args, dtype, runner = inputs, None, model
    context: Any = contextlib.nullcontext()
    if candidate == "float64":
        dtype = torch.float64
    elif candidate == "fp16":
        dtype = torch.float16
    elif candidate == "bf16":
        device = next((p.device.type for p in model.parameters()), "cpu")
        context = torch.autocast(device, dtype=torch.bfloat16)
    elif candidate == "compile":
        runner = torch.compile(model, backend="aot_eager")
    if dtype is not None:
        model.to(dtype)
        args = _cast(inputs, dtype)
    with torch.random.fork_rng(devices=[]), torch.enable_grad():
        torch.manual_seed(0)  # the same random draws (dropout...) in every run
        with gs.record_numerics(model) as run:
            with context:
                out = mf.run_model(runner, args)
                loss = _loss(mf, out, dtype)
            mf.call("running backward", loss.backward)
    return run, loss, model


def _runs_from_files(a: Path, b: Path) -> tuple[gs.NumericsRun, gs.NumericsRun]:
    what = "a saved numerics run"
    return (read_document(a, gs.NumericsRun.from_json, what),
            read_document(b, gs.NumericsRun.from_json, what))


def compare(
    target: Annotated[str, typer.Argument(
        metavar="FILE[:NAME] | A.json",
        help="A model file (with --candidate), or the reference run saved as JSON.")],
    other: Annotated[Path | None, typer.Argument(
        metavar="[B.json]", help="The candidate run saved as JSON (with A.json).")] = None,
    candidate: Annotated[str | None, typer.Option(
        "--candidate", metavar="bf16|fp16|compile|float64",
        help="With a model file: the set-up compared with float32 eager (default bf16).")
    ] = None,
    rtol: Annotated[float | None, typer.Option(
        "--rtol", help="A relative error always tolerated (replaces the dtypes' rounding "
        "allowance).")] = None,
    json_path: Annotated[Path | None, typer.Option(
        "--json", help="Also write the divergence as JSON.")] = None,
    html_path: Annotated[Path | None, typer.Option(
        "--html", help="With a model file: also write the candidate's graph page, each node "
        "coloured by its error against the reference, opening on the first divergence.")
    ] = None,
    mkdir: Annotated[bool, typer.Option(
        "--mkdir", help="Create the folders of --json and --html if missing.")] = False,
) -> None:
    """Where two runs diverge: the first op whose error its inputs do not explain.

    Exit 0: they agree within tolerance; 1: a divergence; 2: an input cannot be used."""
    if rtol is not None and not (rtol >= 0 and rtol != float("inf")):
        fail(f"--rtol {rtol}: give a finite number >= 0")
    saved = target.lower().endswith(".json")
    if saved:
        if other is None:
            fail(f"{target} is a saved run: give the candidate run too (gradscope compare "
                 "A.json B.json), or a model file with --candidate")
        if candidate is not None:
            fail("--candidate runs a model file; two saved runs are compared as they are")
        if html_path is not None:
            fail("--html needs a model file (gradscope compare FILE --candidate ... --html "
                 "PATH): saved runs hold no autograd graph to draw")
        assert other is not None
        inputs: list[tuple[str, Path | str]] = [("the reference run", target),
                                                 ("the candidate run", other)]
    else:
        if other is not None:
            fail(f"{other}: a second file is compared only with a saved run (A.json B.json); "
                 "with a model file, give --candidate")
        if candidate is None:
            candidate = "bf16"
        if candidate not in CANDIDATES:
            fail(f"--candidate {candidate}: expected one of {', '.join(CANDIDATES)}")
        inputs = [("the model file", gs.model_file_path(target))]
    json_out, html_out = settle([("--json", json_path), ("--html", html_path)], inputs=inputs,
                                mkdir=mkdir, suffixes={"--html": (".html", ".htm")})
    if saved:
        assert other is not None  # (fail() above exits)
        reference, cand = _runs_from_files(Path(target), other)
        labels = (target, str(other))
    else:
        mf = gs.load_model_file(target)
        with model_code():
            module, model_inputs, _ = mf.build()
            if module is None:
                raise gs.ModelFileError(
                    f"{mf.path}: compare runs the forward itself, but the entry point returned "
                    "outputs; define model and example_input, or build() returning "
                    "(model, inputs)"
                )
            reference = run_model_file(mf, module, model_inputs, None)[0]
            cand, loss, cand_model = run_model_file(mf, module, model_inputs, candidate)
        labels = ("float32 eager", str(candidate))
    d = gs.compare_runs(reference, cand, rtol=rtol)
    note(f"reference ({labels[0]}): {reference.summary()}")
    note(f"candidate ({labels[1]}): {cand.summary()}")
    console = Console(highlight=False, soft_wrap=False, width=min(Console().width, 100))
    show(d.render(), console=console)
    if json_out is not None:
        d.write_json(json_out.path)
        note(f"wrote {json_path}")
    if html_out is not None:
        page = gs.trace_divergence(loss, d, model=cand_model)
        page.save(html_out.path, title=f"gradscope compare: {mf.path.name} ({candidate})",
                  root=mf.path.parent)
        first = page.marks.first
        where = (f"first divergence at {first} ({page.graph.node(first).name})" if first
                 else "no node stands for the first divergence" if not d.ok
                 else "the runs agree")
        note(f"wrote {html_path}: {len(page.marks.nodes)} of {len(page.graph.nodes)} nodes "
             f"coloured by their error, {where}")
    raise typer.Exit(EXIT_OK if d.ok else EXIT_FOUND)


def register(app: typer.Typer) -> None:
    """Add the ``compare`` command to the gradscope app."""
    app.command("compare", epilog=MODEL_FILE_EPILOG)(compare)
