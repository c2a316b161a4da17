"""What the commands share: the consoles, the one way text reaches the terminal (``show``,
``note``, ``fail``), the guard around the model file's code (``model_code``), the common
arguments, and the command classes that show boolean options as flags in ``--help``.

Every text printed goes through ``gs.terminal_text`` (``gradscope.output.style``; ``show`` turns a
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
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

import gradscope as gs

from .process import (
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


def width_known() -> bool:
    """Whether the output has a width to keep: ``COLUMNS`` is set, or one of the standard
    streams is a terminal (``gradscope tree m.py | less`` in a terminal keeps its width; a file
    written by a script with neither keeps each line whole)."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return True
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return True
        except OSError:
            continue
    return False


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


def read_document(path: Path, parse: Any, what: str) -> Any:
    """``parse(text)`` of the file at ``path`` (``gs.Graph.from_json``...); a file that cannot
    be read, or is not ``what``, is one error line and exit 2."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}")
    try:
        return parse(text)
    except gs.SchemaError as exc:
        fail(f"{path} is not {what}: {str(exc).splitlines()[0]}")


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
            "--plot needs matplotlib, which is not installed; pip install 'torch-gradscope[plot]'"
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


#: The epilog of a command that reads a model file; the template is filled in when the help is
#: shown (``FlagCommand.format_help``), so a command that runs never reads it.
MODEL_FILE_EPILOG = "\x00model-file\x00"
#: The epilog of ``check``: what a file of custom Functions defines.
FUNCTION_FILE_EPILOG = "\x00function-file\x00"


def model_file_template() -> str:
    """The five-line template of a valid model file (``TEMPLATE_CODE`` in
    ``gradscope/modelfile.py``), read from that module's source: importing it would import
    torch, and ``--help`` never does."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("gradscope.modelfile")
    try:
        source = Path(spec.origin).read_text(encoding="utf-8")  # type: ignore[union-attr,arg-type]
        for node in ast.parse(source).body:
            if not isinstance(node, ast.Assign):
                continue
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id == "TEMPLATE_CODE":
                return str(ast.literal_eval(node.value))
    except (OSError, ValueError, SyntaxError, AttributeError, TypeError):
        pass
    return "model = an nn.Module\nexample_input = a tensor or a tuple of tensors"


def _indented(text: str) -> str:
    lines = textwrap.dedent(text).strip("\n").splitlines()
    return "\n".join("    " + line for line in lines)


def _epilog(marker: str) -> str:
    """The text ``marker`` stands for (rich markup escaped: the help is drawn by rich)."""
    from rich.markup import escape

    if marker == FUNCTION_FILE_EPILOG:
        text = (
            "FILE defines the Function NAME (a torch.autograd.Function subclass, or a function "
            "of tensors) and the arguments to check it with:\n\n"
            + _indented(FUNCTION_TEMPLATE)
            + "\n\nNo such file yet? `gradscope example functions` writes one here "
            "(`gradscope check functions.py:ClippedReLU`)."
        )
    else:
        text = (
            "FILE must define (FILE:NAME picks a zero-argument callable or an nn.Module by "
            "name):\n\n" + _indented(model_file_template())
            + "\n\nNo model file yet? `gradscope example mlp` writes one here "
            "(`gradscope example` lists them all)."
        )
    return escape(text)


#: What a file for ``gradscope check`` defines (its ``--help``).
FUNCTION_TEMPLATE = """\
import torch
class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x): ctx.save_for_backward(x); return x * x
    @staticmethod
    def backward(ctx, g): return 2 * ctx.saved_tensors[0] * g
def Square_inputs():
    return (torch.randn(3, dtype=torch.double, requires_grad=True),)
"""


class FlagCommand(TyperCommand):
    """A command whose help shows boolean options as flags, and what its input file must
    define (``MODEL_FILE_EPILOG``, filled in only when the help is shown)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _flags_as_flags(super().get_params(ctx))

    def format_help(self, ctx: Any, formatter: Any) -> None:
        if self.epilog in (MODEL_FILE_EPILOG, FUNCTION_FILE_EPILOG):
            self.epilog = _epilog(self.epilog)
        super().format_help(ctx, formatter)


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
TargetArg = typer.Argument(
    ..., metavar="FILE[:NAME]", help="A model file, e.g. mlp.py (gradscope example mlp)"
)
