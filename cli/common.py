"""What the commands share: the consoles, the one way text reaches the terminal (``show``,
``note``, ``fail``), the guard around the model file's code (``model_code``), the common
arguments, and the command classes that show boolean options as flags in ``--help``.

Every text printed goes through ``gs.terminal_text`` (``gradscope.views.style``; ``show`` turns a
``str`` into a ``Text`` of it; views build their renderables with ``style.cell``): rich never
reads a model's names as markup, and no escape sequence reaches the terminal. The consoles
write to the streams gradscope started with (``main.real_stdout``), not to whatever the model
file put in ``sys.stdout``.

Nothing here imports torch: ``gradscope --help`` loads this module.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import Any

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

import gradscope as gs

from .main import (
    EXIT_FOUND,
    EXIT_UNUSABLE,
    check_signals,
    real_stderr,
    real_stdout,
    remember_streams,
    say,
)


class _Discard(io.StringIO):
    """Where a console writes when its descriptor was closed at start-up: nothing is kept."""

    def write(self, text: str) -> int:
        return len(text)


def stdout(*, wrap: bool | None = None) -> Console:
    """Standard output. ``wrap`` None: lines wrap at a terminal's width, and stay whole when
    piped (a long tree line is one line in a file); True: always wrap (tables sized to it)."""
    console = Console(file=real_stdout() or _Discard(), highlight=False)
    console.soft_wrap = not (console.is_terminal if wrap is None else wrap)
    return console


def stderr() -> Console:
    """Standard error: each message one line, however narrow the terminal."""
    return Console(file=real_stderr() or _Discard(), highlight=False, soft_wrap=True)


def cell(text: object, style: str = "") -> Text:
    """One piece of text for the terminal, escaped and cut (``gs.terminal_text``)."""
    return Text(gs.terminal_text(text), style=style)


def _as_text(what: str) -> Text:
    return Text("\n".join(gs.terminal_text(line) for line in what.split("\n")))


def show(what: Any, *, console: Console | None = None) -> None:
    """Print a renderable (built by a view, its data already escaped) or a ``str`` (shown as
    text: escaped, cut, never markup) on ``console`` (default: standard output)."""
    out = console if console is not None else stdout()
    out.print(_as_text(what) if isinstance(what, str) else what)


def note(text: str) -> None:
    """A message on standard error, shown as text (a model's names and source lines in it
    are data)."""
    stderr().print(_as_text(text))


def fail(message: str) -> None:
    """Print one error line and exit with code 2."""
    say(gs.terminal_text(" ".join(f"gradscope: error: {message}".splitlines())))
    raise typer.Exit(EXIT_UNUSABLE)


@contextlib.contextmanager
def model_code() -> Iterator[None]:
    """Around the model file's code (import, build, forward, training): what it prints
    (``print``, ``sys.stdout``) goes to standard error, so ``-o - -f json`` stays valid JSON,
    and whatever it does to ``sys.stdout``/``sys.stderr`` is undone when it is done. A signal
    whose exception the code swallowed is raised again at the end."""
    out, err = real_stdout(), real_stderr()
    sys.stdout = err if err is not None else sys.stdout
    try:
        yield
    finally:
        for stream in {id(s): s for s in (sys.stdout, sys.stderr) if s is not None}.values():
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = out, err
    check_signals()


def require_plot() -> None:
    """``--plot`` needs matplotlib, and a ``MPLBACKEND`` it knows (said before anything runs)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise gs.MissingExtraError(
            "--plot needs matplotlib, which is not installed; pip install gradscope[plot]"
        )
    backend = os.environ.get("MPLBACKEND")
    if backend:
        try:  # matplotlib reads MPLBACKEND when it is imported, and refuses an unknown one
            from matplotlib import rcsetup

            rcsetup.validate_backend(backend)
        except (ValueError, KeyError):
            raise gs.OutputError(
                f"MPLBACKEND={backend!r} is not a matplotlib backend; unset it (the plot is "
                "written to a file, any backend does) or give one of agg, pdf, svg"
            ) from None


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
    """The application; its own help shows ``-h`` as a flag too. Every command starts by
    taking the streams it was given as gradscope's own (``main.remember_streams``)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_as_flags(super().get_params(ctx))

    def invoke(self, ctx: Any) -> Any:
        remember_streams()
        return super().invoke(ctx)


def report_regions(graph: gs.Graph) -> None:
    """One line per thing to know about the compiled regions drawn (an opaque one, missing
    source lines), each said once."""
    said: set[str] = set()
    for node in graph.nodes:
        told = node.compiled.note if node.compiled is not None else None
        if told and told not in said:
            said.add(told)
            where = f" ({node.module})" if node.module else ""
            note(f"gradscope: note: compiled region {node.id}{where}: {told}")


def report_backward(rec: Any) -> None:
    """Print what the recorder (a ``gs.BackwardTrace``) found; exit code 1 when a gradient or
    a value of the forward was NaN or Inf (``BackwardTrace.found``), as ``report`` exits."""
    if rec is None:
        return
    note(rec.summary())
    if rec.found:
        raise typer.Exit(EXIT_FOUND)


BackwardOpt = typer.Option(
    False,
    "--backward",
    help="Run backward under the recorder: engine order, gradient norm on every edge, the "
    "first NaN/Inf and its forward line (exit code 1 when one is found).",
)
TargetArg = typer.Argument(..., metavar="FILE[:NAME]", help="A model file, e.g. samples/mlp.py")
