"""``gradscope example [NAME] [-o PATH]``: write a bundled example model file here.

The examples are copies of files of the repository's ``samples/`` folder, shipped in the
package (``gradscope_cli/examples/``: the wheel has no ``samples/``), byte for byte
(``tests/cli/test_first_hour.py`` checks it). Without NAME the command lists them. The file
written names itself where the sample named ``samples/NAME.py`` (its docstring's commands run
as they are). Exit codes: 0 written (or listed), 2 unknown name or a file in the way.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import typer

from .common import fail, note, show

#: Where the bundled examples are (a folder of the installed ``gradscope_cli``).
EXAMPLES = Path(__file__).resolve().parent / "examples"


def names() -> list[str]:
    """The bundled examples' names, sorted."""
    return sorted(p.stem for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


def _docstring(source: str) -> str:
    try:
        return ast.get_docstring(ast.parse(source)) or ""
    except SyntaxError:
        return ""


def summary(name: str) -> str:
    """The first line of the example's docstring."""
    text = _docstring((EXAMPLES / f"{name}.py").read_text(encoding="utf-8"))
    return text.splitlines()[0].replace("``", "") if text else ""


def commands(source: str) -> list[str]:
    """The ``gradscope ...`` command lines of a file's docstring (what to try with it)."""
    return [line.strip() for line in _docstring(source).splitlines()
            if line.strip().startswith("gradscope ")]


def _listing() -> str:
    width = max(map(len, names()), default=0)
    rows = [f"  {name:<{width}}  {summary(name)}" for name in names()]
    return "\n".join(["examples (gradscope example NAME writes NAME.py here):", *rows])


def example(
    name: str | None = typer.Argument(
        None, metavar="NAME", help="Which example; leave it out to list them."
    ),
    output: str | None = typer.Option(
        None, "-o", "--output", metavar="PATH",
        help="Where to write it (default NAME.py here; a folder: NAME.py in it); - for stdout.",
    ),
    force: bool = typer.Option(False, "--force", help="Replace a file already there."),
) -> None:
    """Write an example model file to the current folder, to try every command on.

    gradscope example mlp, then gradscope tree mlp.py."""
    if name is None:
        show(_listing())
        return
    key = name.removesuffix(".py")
    if key not in names():
        fail(f"no example {name!r}; the examples are {', '.join(names())}")
    source = (EXAMPLES / f"{key}.py").read_text(encoding="utf-8")
    if output == "-":
        typer.echo(source, nl=False)
        return
    path = Path(output) if output else Path(f"{key}.py")
    if path.is_dir() or (output or "").endswith(("/", os.sep)):
        if not path.is_dir():
            fail(f"no folder {output}; make it first (mkdir -p {output})")
        path = path / f"{key}.py"
    if path.exists() and not force:
        fail(f"{path} exists; pass --force to replace it, or -o another path")
    shown = str(path)
    source = source.replace(f"samples/{key}.py", shown)  # its docstring's commands run here
    try:
        path.write_text(source, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {path}: {exc.strerror or exc}")
    note(f"wrote {shown}: {summary(key)}")
    tries = commands(source)
    if tries:
        note("try:\n" + "\n".join(f"  {line}" for line in tries))


def register(app: typer.Typer) -> None:
    """Add the ``example`` command to the gradscope app."""
    app.command("example")(example)
