"""``gradscope render FILE`` (the graph written as a picture, a page or data) and
``gradscope tree FILE`` (the graph in the terminal)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

import gradscope as gs

from .common import BackwardOpt, TargetArg, report_backward, report_regions, stderr, stdout


def load_graph(mf: gs.ModelFile, *, loss: bool = False, saved: bool = True) -> gs.Graph:
    """Run a model file's forward (and loss), trace the result, and free the autograd graph
    node by node (``gs.release``): the plain-data graph is all the CLI needs, and a deep chain
    released by Python's usual path would overflow the C stack."""
    fwd = mf.forward()
    outputs = mf.loss(fwd.outputs) if loss else fwd.outputs
    graph = gs.trace(outputs, saved=saved, model=fwd.model)
    gs.release((outputs, fwd.outputs))
    return graph


def record_graph(mf: gs.ModelFile, *, saved: bool = True) -> Any:
    """Forward (and loss_fn when the file has one) with forward lines and the first
    non-finite forward value recorded, then backward under the recorder (ones as the gradient
    of non-scalar outputs); ``.graph`` of the ``gs.BackwardTrace`` is annotated. When the
    forward already went non-finite it is said first: the gradients' NaN/Inf then comes from
    it, not from backward."""
    import torch

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


def register(app: typer.Typer) -> None:
    """Add the ``render`` and ``tree`` commands to the gradscope app."""
    app.command("render")(render)
    app.command("tree")(tree)
