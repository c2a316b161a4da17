"""``gradscope render FILE`` (the graph written as a picture, a page or data) and
``gradscope tree FILE`` (the graph in the terminal).

``render`` settles where and how it writes before the model file runs: the format (``--format``
and the suffix of ``-o`` must agree), whether it can be written here (Graphviz for pictures), and
the output (``outputs.settle``: absolute, a symlink followed; a FIFO, device, socket or folder,
the model file itself, a missing folder without ``--mkdir`` refused), so a model file that
changes folder cannot redirect the output. ``-o -`` writes to standard output; what the model
file prints goes to standard error meanwhile (``common.model_code``). What is drawn follows the
format's kind (``gs.FormatKind``): a picture gets a bounded, readable view; a page the whole
graph (it opens modules itself); data every node.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import typer

import gradscope as gs

from .common import (
    MODEL_FILE_EPILOG,
    BackwardOpt,
    TargetArg,
    fail,
    model_code,
    note,
    plural,
    report_backward,
    report_regions,
    show,
    stdout,
    width_known,
)
from .doctor import DoctorOpt, doctor_graph, doctor_notes, doctor_said
from .outputs import STDOUT, settle
from .process import reader_left, real_stdout

#: The longest ``--timeout`` (seconds): Graphviz never runs unbounded.
MAX_TIMEOUT = 86_400.0

MkdirOpt = typer.Option(False, "--mkdir", help="Create the folders of the output if missing.")


def load_graph(mf: gs.ModelFile, *, loss: bool = False, saved: bool = True) -> gs.Graph:
    """Run a model file's forward (and loss), trace the result, and free the autograd graph
    node by node (``gs.release``): the plain-data graph is all the CLI needs, and a deep chain
    released by Python's usual path would overflow the C stack."""
    fwd = mf.forward()
    outputs = mf.loss(fwd.outputs) if loss else fwd.outputs
    graph = gs.trace(outputs, saved=saved, model=fwd.model, inputs=fwd.given)
    gs.release((outputs, fwd.outputs))
    return graph


def settled() -> None:
    """What is alive once the graph is built (torch, the model, the graph) lives until the
    command exits: out of the cyclic collector's sight (``gc.freeze``), it is not scanned
    again each time the views' own objects trigger a collection (``tree`` of a 60,000-op
    chain: memory report and tree 2.0 s -> 1.3 s)."""
    gc.freeze()


def backward_graph(mf: gs.ModelFile, *, saved: bool = True) -> Any:
    """The model file's graph annotated by one backward (``ModelFile.backward``), as a
    ``gs.BackwardTrace``; a forward that already went non-finite is said first (the gradients'
    NaN/Inf then comes from it, not from backward)."""
    run = mf.backward(saved=saved)
    if run.forward_nonfinite is not None:
        note(run.forward_nonfinite.summary())
    return run.trace


def _where_to(target: str, output: Path | None, fmt: str, mkdir: bool) -> Path | None:
    """The absolute file to write (None for standard output), settled before anything runs."""
    if output is None:
        output = Path(f"{gs.model_file_path(target).stem}.{fmt}")
    (out,) = settle([("-o", output)], inputs=[("the model file", gs.model_file_path(target))],
                    mkdir=mkdir, stdout=("-o",))
    return None if out is None else out.path


def render(
    target: str = TargetArg,
    output: Path | None = typer.Option(
        None, "-o", "--output",
        help="Output file, or - for standard output; default <file stem>.<format>.",
    ),
    fmt: str | None = typer.Option(
        None, "--format", "-f",
        help=f"One of {', '.join(gs.FORMATS)} (default: from -o, else svg); must agree with "
        "the suffix of -o.",
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
        max=MAX_TIMEOUT,
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
    mkdir: bool = MkdirOpt,
    doctor: bool = DoctorOpt,
) -> None:
    """Build the model file's graph and write it as SVG/PNG/PDF/DOT/JSON/HTML."""
    if doctor and backward:
        fail("--doctor runs the backward itself; give one of --doctor and --backward")
    to_stdout = output is not None and str(output) == STDOUT
    named = None if to_stdout else output
    if fmt is None and (named is None or not named.suffix):
        fmt = "svg"
    spec = gs.format_spec(gs.output_format(named, fmt))
    spec.require()  # e.g. Graphviz for a picture: said before the model runs, not after
    out = real_stdout()
    if to_stdout and out is None:
        fail("-o -: standard output is closed; give a file name (-o graph.json) or open it")
    if to_stdout and spec.binary and out.isatty():
        fail(f"refusing to write {spec.name.upper()} bytes to the terminal; redirect standard "
             f"output (-o - > graph.{spec.name}) or give a file name")
    path = _where_to(target, output, spec.name, mkdir)  # before the model file runs
    with model_code():
        mf = gs.load_model_file(target)
        rec = backward_graph(mf, saved=saved or attrs) if backward else None
        report = doctor_graph(mf, saved=saved or attrs) if doctor else None
        graph = report[0] if report else rec.graph if rec else load_graph(
            mf, loss=loss, saved=saved or attrs)
    settled()
    told = None
    notes = graph.memory().node_labels() if memory else None
    if notes:
        notes = {nid: f"holds {size}" for nid, size in notes.items()}
    if report and spec.kind is not gs.FormatKind.PAGE:  # the page marks the nodes itself
        notes = doctor_notes(report[1], notes)
    if spec.kind is gs.FormatKind.PAGE:  # the page opens and closes modules itself
        view = graph
        candidates: dict[str, Any] = {
            "title": mf.path.name, "depth": depth, "full": full, "fold": fold is not False,
            "saved": saved, "notes": notes, "root": mf.path.parent,
            "doctor": report[1] if report else None,
        }
    elif spec.kind is gs.FormatKind.DATA:  # every node unless a depth is asked for
        view = graph if depth is None else graph.collapse(depth)
        candidates = {}
    else:  # a picture laid out by Graphviz: a readable, bounded view
        view, told = gs.readable_view(
            graph, depth=depth, fold_repeats=fold, max_nodes=max_nodes, full=full
        )
        candidates = {"saved": saved, "attrs": attrs, "notes": notes, "root": mf.path.parent,
                      "legend": legend, "timeout": timeout}
    if told:  # before a layout that may take a while, say what is drawn
        note(told)
    report_regions(graph)
    options = {k: v for k, v in candidates.items() if k in spec.options}  # what it declares
    if path is None:
        data = view.to_bytes(spec.name, **options)
        out.flush()
        out.buffer.write(data)
        out.buffer.flush()
        if reader_left():  # | head -c 10: the bytes fit the pipe, the reader left without them
            import errno

            raise BrokenPipeError(errno.EPIPE, "the reader of standard output went away")
        shown = "standard output"
    else:
        view.save(path, format=spec.name, **options)
        shown = str(output) if output is not None else path.name
    drawn = sum(1 for n in view.nodes if n.kind != "module")
    boxes = len(view.nodes) - drawn
    if view is graph:
        what = graph.summary()
    else:
        what = (f"drew {drawn} of {plural(len(graph.nodes), 'node')}"
                + (f" and {plural(boxes, 'box', 'boxes')}" if boxes else "")
                + f"; the graph: {graph.summary()}")
    note(f"wrote {shown}: {what}")
    report_backward(rec)
    if report:
        doctor_said(report[1])  # exit 1 when it found anything


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
    with model_code():
        mf = gs.load_model_file(target)
        rec = backward_graph(mf) if backward else None
        graph = rec.graph if rec else load_graph(mf, loss=loss)
    settled()
    mem = graph.memory()  # of the whole graph, before any collapse
    full_graph = graph
    if depth is not None:
        graph = graph.collapse(depth)
    out = stdout(wrap=width_known())  # through a pipe too: `tree m.py | less` keeps the width
    show(gs.render_tree(graph, max_lines=max_lines), console=out)
    if mem.total or mem.freed:
        show(mem.render(depth=depth), console=out)
    report_regions(full_graph)
    report_backward(rec)


def register(app: typer.Typer) -> None:
    """Add the ``render`` and ``tree`` commands to the gradscope app."""
    app.command("render", epilog=MODEL_FILE_EPILOG)(render)
    app.command("tree", epilog=MODEL_FILE_EPILOG)(tree)
