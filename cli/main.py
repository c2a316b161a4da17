"""The ``gradscope`` command line. It only calls gradscope's public API and owns the console.

Exit codes: 0 done and nothing alarming; 1 done and it found the problem asked about (non-finite
gradients, a failed check); 2 the input could not be used (one line on stderr, never a traceback).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import typer
from rich.console import Console

import gradscope as gs

try:  # the click that typer runs on: its own copy in recent typer, else click itself
    from typer._click import exceptions as click
except ImportError:  # pragma: no cover - older typer
    from click import exceptions as click  # type: ignore[no-redef]

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="See PyTorch autograd graphs and debug gradients.",
    context_settings={"help_option_names": ["-h", "--help"]},
)

EXIT_OK, EXIT_FOUND, EXIT_UNUSABLE, EXIT_INTERRUPTED = 0, 1, 2, 130


def stdout() -> Console:
    return Console(highlight=False, soft_wrap=True)  # long tree lines stay whole when piped


def stderr() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str) -> None:
    """Print one error line (and any template lines after it) and exit with code 2."""
    stderr().print(f"gradscope: error: {message}", markup=False)
    raise typer.Exit(EXIT_UNUSABLE)


def load_graph(mf: gs.ModelFile, *, loss: bool = False, saved: bool = True) -> gs.Graph:
    """Run a model file's forward (and loss), trace the result, and free the autograd graph
    node by node (``gs.release``): the plain-data graph is all the CLI needs, and a deep chain
    released by Python's usual path would overflow the C stack."""
    fwd = mf.forward()
    outputs = mf.loss(fwd.outputs) if loss else fwd.outputs
    graph = gs.trace(outputs, saved=saved, model=fwd.model)
    gs.release((outputs, fwd.outputs))
    return graph


def record_graph(mf: gs.ModelFile, *, saved: bool = True) -> gs.BackwardTrace:
    """Forward (and loss_fn when the file has one) with forward lines and the first
    non-finite forward value recorded, then backward under the recorder (ones as the gradient
    of non-scalar outputs); ``.graph`` is annotated. When the forward already went non-finite
    it is said first: the gradients' NaN/Inf then comes from it, not from backward."""
    with gs.record_forward(check_finite=True) as forward:
        fwd = mf.forward()
        root = mf.loss(fwd.outputs) if mf.has("loss_fn") else fwd.outputs
    if forward.first_nonfinite is not None:
        stderr().print(forward.first_nonfinite.summary(), markup=False)
    try:
        with gs.record_backward(root, model=fwd.model, saved=saved) as rec:
            tensors = [t for _, t in gs.iter_tensors(root) if t.requires_grad]
            try:
                torch.autograd.backward(tensors, [torch.ones_like(t) for t in tensors])
            except RuntimeError as exc:
                first = str(exc).strip().splitlines()[0]
                raise gs.ModelFileError(
                    f"{mf.path}: backward raised RuntimeError: {first}"
                ) from exc
    finally:
        gs.release((root, fwd.outputs))
    return rec


def report_regions(graph: gs.Graph) -> None:
    """One line per thing to know about the compiled regions drawn (an opaque one, missing
    source lines), each said once."""
    said: set[str] = set()
    for node in graph.nodes:
        note = node.compiled.note if node.compiled is not None else None
        if note and note not in said:
            said.add(note)
            where = f" ({node.module})" if node.module else ""
            stderr().print(f"gradscope: note: compiled region {node.id}{where}: {note}",
                           markup=False)


def report_backward(rec: gs.BackwardTrace | None) -> None:
    """Print what the recorder found; exit code 1 when a gradient was NaN or Inf."""
    if rec is None:
        return
    stderr().print(rec.summary(), markup=False)
    if rec.first_nonfinite is not None:
        raise typer.Exit(EXIT_FOUND)


BackwardOpt = typer.Option(
    False,
    "--backward",
    help="Run backward under the recorder: engine order, gradient norm on every edge, the "
    "first NaN/Inf and its forward line (exit code 1 when one is found).",
)
TargetArg = typer.Argument(..., metavar="FILE[:NAME]", help="A model file, e.g. samples/mlp.py")


@app.command()
def render(
    target: str = TargetArg,
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Output file; default <file stem>.<format>."
    ),
    fmt: str | None = typer.Option(
        None, "--format", "-f", help=f"One of {', '.join(gs.FORMATS)} (default: from -o, else svg)."
    ),
    saved: bool = typer.Option(
        True, "--saved/--no-saved", help="Draw saved tensors as orange boxes."
    ),
    attrs: bool = typer.Option(False, "--attrs", help="List non-tensor saved attributes."),
    loss: bool = typer.Option(False, "--loss", help="Render from the file's loss_fn(output)."),
    depth: int | None = typer.Option(
        None,
        "--depth",
        min=0,
        help="Show each module at depth N as one box (encoder.layers.3 is at depth 2).",
    ),
    fold: bool | None = typer.Option(
        None,
        "--fold/--no-fold",
        help="Fold runs of identical layers into one box (layers.0-63 x64); "
        "default: only past --max-nodes.",
    ),
    max_nodes: int = typer.Option(
        1500,
        "--max-nodes",
        min=1,
        help="Past this many nodes, fold and collapse by module depth until the graph fits.",
    ),
    full: bool = typer.Option(False, "--full", help="Draw every node, however large the graph."),
    timeout: float = typer.Option(
        60.0,
        "--timeout",
        min=1.0,
        help="Stop Graphviz after this many seconds (SVG/PNG/PDF) with a message.",
    ),
    backward: bool = BackwardOpt,
    memory: bool = typer.Option(
        False,
        "--memory",
        help="Label each node with the saved bytes it holds (each storage counted once).",
    ),
    legend: bool = typer.Option(
        True, "--legend/--no-legend", help="Draw a compact legend in SVG/PNG/PDF pictures."
    ),
) -> None:
    """Build the model file's graph and write it as SVG/PNG/PDF/DOT/JSON/HTML."""
    if fmt is None and (output is None or not output.suffix):
        fmt = "svg"
    fmt = gs.output_format(output, fmt)
    mf = gs.load_model_file(target)
    if output is None:
        output = Path(f"{mf.path.stem}.{fmt}")
    rec = record_graph(mf, saved=saved or attrs) if backward else None
    graph = rec.graph if rec else load_graph(mf, loss=loss, saved=saved or attrs)
    note = None
    notes = graph.memory().node_labels() if memory else None
    if notes:
        notes = {nid: f"holds {size}" for nid, size in notes.items()}
    takes = gs.format_options(fmt)  # each format declares its options: pass only those
    if "max_nodes" in takes:  # the page opens and closes modules itself
        view = graph
        candidates: dict[str, Any] = {
            "title": mf.path.name, "depth": depth, "full": full, "fold": fold is not False,
            "saved": saved, "notes": notes, "root": mf.path.parent,
        }
    elif not takes:  # data: every node unless a depth is asked for
        view = graph if depth is None else graph.collapse(depth)
        candidates = {}
    else:  # a picture laid out by Graphviz: a readable, bounded view
        view, note = gs.readable_view(
            graph, depth=depth, fold_repeats=fold, max_nodes=max_nodes, full=full
        )
        candidates = {"saved": saved, "attrs": attrs, "notes": notes, "root": mf.path.parent,
                      "legend": legend, "timeout": timeout}
    if note:  # before a layout that may take a while, say what is drawn
        stderr().print(note, markup=False)
    report_regions(graph)
    view.save(output, format=fmt, **{k: v for k, v in candidates.items() if k in takes})
    drawn = sum(1 for n in view.nodes if n.kind != "module")
    boxes = len(view.nodes) - drawn
    if view is graph:
        what = graph.summary()
    else:
        what = (f"drew {drawn} of {len(graph.nodes)} nodes"
                + (f" and {boxes} boxes" if boxes else "") + f"; the graph: {graph.summary()}")
    stderr().print(f"wrote {output}: {what}", markup=False)
    report_backward(rec)


@app.command()
def tree(
    target: str = TargetArg,
    loss: bool = typer.Option(False, "--loss", help="Start from the file's loss_fn(output)."),
    max_lines: int = typer.Option(
        2000, "--max-lines", min=1, help="Stop after this many lines."
    ),
    depth: int | None = typer.Option(
        None,
        "--depth",
        min=0,
        help="Show each module at depth N as one line (encoder.layers.3 is at depth 2).",
    ),
    backward: bool = BackwardOpt,
) -> None:
    """Print the graph as a tree: node names, shapes, saved tensors and their bytes."""
    mf = gs.load_model_file(target)
    rec = record_graph(mf) if backward else None
    graph = rec.graph if rec else load_graph(mf, loss=loss)
    mem = graph.memory()  # of the whole graph, before any collapse
    full_graph = graph
    if depth is not None:
        graph = graph.collapse(depth)
    out = stdout()
    out.print(gs.render_tree(graph, max_lines=max_lines))
    if mem.total or mem.freed:
        out.print(mem.render(depth=depth))
    report_regions(full_graph)
    report_backward(rec)


# Commands that live in their own modules register themselves on the app.
from gradscope_cli import check as _check_command  # noqa: E402
from gradscope_cli import diff as _diff_command  # noqa: E402
from gradscope_cli import report as _report_command  # noqa: E402

_report_command.register(app)
_check_command.register(app)
_diff_command.register(app)


def _usage_line(exc: click.UsageError) -> str:
    """A click usage error as one line: what was wrong, and where the help is."""
    message = " ".join(exc.format_message().split())
    ctx = exc.ctx
    command = ctx.info_name if ctx is not None and ctx.parent is not None else None
    return f"{message} (see gradscope {command + ' ' if command else ''}-h)"


def main(argv: list[str] | None = None) -> Any:
    """Console-script entry point. Exit codes: 0 done, 1 found the problem asked about, 2 the
    input could not be used (one line on stderr, never a traceback), 130 interrupted."""
    err = stderr()
    try:
        code = app(args=argv, prog_name="gradscope", standalone_mode=False)
    except getattr(click, "NoArgsIsHelpError", ()) as exc:  # bare `gradscope`: show the help
        if exc.ctx is not None:
            stdout().print(exc.ctx.get_help(), markup=False, highlight=False)
        sys.exit(EXIT_UNUSABLE)
    except click.UsageError as exc:  # bad option, value or argument: one line, exit 2
        err.print(f"gradscope: error: {_usage_line(exc)}", markup=False)
        sys.exit(EXIT_UNUSABLE)
    except gs.GradscopeError as exc:
        lines = str(exc).splitlines() or [type(exc).__name__]
        err.print(f"gradscope: error: {lines[0]}", markup=False)
        for line in lines[1:]:
            err.print(line, markup=False)
        sys.exit(EXIT_UNUSABLE)
    except (KeyboardInterrupt, click.Abort):
        err.print("gradscope: interrupted", markup=False)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as exc:  # click's own errors (a file it could not open...)
        err.print(f"gradscope: error: {' '.join(exc.format_message().split())}", markup=False)
        sys.exit(EXIT_UNUSABLE)
    except SystemExit as exc:  # sys.exit() reached from code gradscope ran: never silent
        err.print(
            f"gradscope: error: the code gradscope ran called sys.exit({exc.code!r}); "
            "nothing was written",
            markup=False,
        )
        sys.exit(EXIT_UNUSABLE)
    except Exception as exc:  # a bug of ours: still one line, traceback on request
        if os.environ.get("GRADSCOPE_DEBUG"):
            raise
        err.print(
            f"gradscope: internal error: {type(exc).__name__}: {exc} "
            "(set GRADSCOPE_DEBUG=1 for the traceback, and please report it)",
            markup=False,
        )
        sys.exit(EXIT_UNUSABLE)
    if code == EXIT_INTERRUPTED:  # typer turns Ctrl-C into exit code 130, silently
        err.print("gradscope: interrupted", markup=False)
    sys.exit(code if isinstance(code, int) else EXIT_OK)


if __name__ == "__main__":
    main()
