"""What the commands share: the consoles, the one-line failure, the common arguments, and the
command classes that show boolean options as flags in ``--help``.

Nothing here imports torch: ``gradscope --help`` loads this module.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

import gradscope as gs

from .main import EXIT_FOUND, EXIT_UNUSABLE


def stdout() -> Console:
    return Console(highlight=False, soft_wrap=True)  # long tree lines stay whole when piped


def stderr() -> Console:
    return Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str) -> None:
    """Print one error line and exit with code 2."""
    stderr().print(f"gradscope: error: {message}", markup=False)
    raise typer.Exit(EXIT_UNUSABLE)


def plural(count: int, one: str, many: str | None = None) -> str:
    """``1 box``, ``2 boxes``: the count and the word that goes with it."""
    return f"{count} {one if count == 1 else (many or one + 's')}"


def _flags_as_flags(params: list[Any]) -> list[Any]:
    """A flag takes no value: ``--attrs``, not ``--attrs <bool>`` (typer shows every option's
    type, flags' included)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class FlagCommand(TyperCommand):
    """A command whose help shows boolean options as flags."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_as_flags(super().get_params(ctx))


class FlagGroup(TyperGroup):
    """The application; its own help shows ``-h`` as a flag too."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_as_flags(super().get_params(ctx))


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


def report_backward(rec: Any) -> None:
    """Print what the recorder (a ``gs.BackwardTrace``) found; exit code 1 when a gradient was
    NaN or Inf."""
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
