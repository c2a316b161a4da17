"""``gradscope diff A.json B.json [-o diff.html]``: what changed between two saved graphs.

Nodes are matched by module path, op name and order within the module (``gs.diff``), never by
id. Prints a summary (and the first changes); ``-o`` writes a page of the union graph with added,
removed and changed nodes coloured and gradient-norm ratios on the edges. Exit code 0 when the
graphs are the same, 1 when they differ, 2 when a file cannot be read.
"""

from __future__ import annotations

from pathlib import Path

import typer

#: Changes listed one per line before "... and N more".
SHOWN = 20


#: What A and B are, and where a first one comes from (``diff --help``).
EPILOG = (
    "A and B are graphs saved as JSON: gradscope render FILE -o a.json (--backward adds the "
    "gradient norms to compare). No model file yet? `gradscope example mlp` writes one here."
)


def register(app: typer.Typer) -> None:
    """Add the ``diff`` command to the gradscope app."""
    app.command("diff", epilog=EPILOG)(diff)


def diff(
    a: Path = typer.Argument(..., help="The first graph, a JSON file (render -o a.json)."),
    b: Path = typer.Argument(..., help="The second graph, a JSON file."),
    output: Path | None = typer.Option(
        None, "-o", "--output", help="Write the diff page (.html) here."
    ),
    mkdir: bool = typer.Option(False, "--mkdir", help="Create the folder of -o if missing."),
) -> None:
    """Compare two graphs saved as JSON: nodes added, removed, changed; norm ratios (--backward).

    Exit 0 when they are the same, 1 when they differ, 2 when a file cannot be used."""
    from gradscope_cli.common import note, read_document, show
    from gradscope_cli.outputs import settle

    import gradscope as gs  # here, not at import: `gradscope --help` stays light

    (out,) = settle([("-o", output)], inputs=[("the first graph", a), ("the second graph", b)],
                    mkdir=mkdir, suffixes={"-o": (".html", ".htm")})
    ga, gb = (read_document(path, gs.Graph.from_json, "a gradscope graph") for path in (a, b))
    d = gs.diff(ga, gb)
    show(d.to_text(labels=(str(a), str(b)), limit=SHOWN))
    if out is not None:
        d.save(out.path, title=f"gradscope diff: {a.name} → {b.name}")
        note(f"wrote {output}")
    raise typer.Exit(0 if d.empty else 1)
