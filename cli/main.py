"""The ``gradscope`` command line: the console-script entry point (``gradscope_cli.main:main``)
and the one place that turns whatever happened into an exit code and at most one line on stderr.

Exit codes: 0 done and nothing alarming; 1 done and it found the problem asked about (non-finite
gradients, a failed check); 2 the input could not be used (one line on stderr, never a
traceback); 3 an internal error, a bug in gradscope (one line, ``GRADSCOPE_DEBUG=1`` shows the
traceback); 130 interrupted (Ctrl-C at any moment, start-up included: ``gradscope:
interrupted``); 141 the reader of the output went away (``gradscope tree m.py | head``): nothing
more is written and nothing is said.

This module imports only the standard library when it is loaded: typer, rich and gradscope are
imported inside ``main`` (where a Ctrl-C is caught), and torch only by a command that runs a
model, so ``gradscope --help`` never pays for torch.

Adding a command: a module ``gradscope_cli/NAME.py`` with a ``register(app)`` function, and
``"NAME"`` in ``COMMANDS`` below.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import typer

EXIT_OK, EXIT_FOUND, EXIT_UNUSABLE, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_PIPE_CLOSED = 130, 141

#: The modules whose ``register(app)`` adds commands, in the order ``--help`` lists them
#: (``render`` adds ``render`` and ``tree``).
COMMANDS: tuple[str, ...] = ("render", "report", "check", "memory", "diff", "doctor")

def make_app() -> typer.Typer:
    """The typer application with every command of ``COMMANDS`` registered."""
    import importlib

    import typer
    from gradscope_cli.common import FlagCommand, FlagGroup
    from typer.core import TyperCommand

    app = typer.Typer(
        cls=FlagGroup,
        add_completion=False,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        help="See PyTorch autograd graphs and debug gradients.",
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    for name in COMMANDS:
        importlib.import_module(f"gradscope_cli.{name}").register(app)
    for info in app.registered_commands:  # boolean options shown as flags, in every command
        if info.cls is None or info.cls is TyperCommand:
            info.cls = FlagCommand
    return app


def __getattr__(name: str) -> Any:
    """``from gradscope_cli.main import app`` (typer's test runner) builds the app once."""
    if name == "app":
        app = make_app()
        globals()["app"] = app  # later look-ups (and ``main``) find it, or what replaced it
        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------------------- the console edge
def _clean(text: str) -> str:
    """One line with control characters shown as escapes (a message may quote a model's
    names; it must not move the cursor or restyle the terminal)."""
    line = " ".join(text.split("\n")).replace("\r", " ")
    return "".join(
        ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in line
    )


def say(line: str) -> None:
    """Write one line to stderr; a closed stderr is not worth a traceback."""
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _silence_stdout() -> None:
    """The reader of stdout is gone: point the descriptor at /dev/null so that nothing more
    (Python's own flush at exit included) tries to write to the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _is_broken_pipe(exc: BaseException | None) -> bool:
    import errno

    seen = 0
    while exc is not None and seen < 8:  # rich and typer turn EPIPE into SystemExit(1)
        if isinstance(exc, BrokenPipeError) or (
            isinstance(exc, OSError) and exc.errno == errno.EPIPE
        ):
            return True
        exc = exc.__context__
        seen += 1
    return False


def _internal(exc: BaseException) -> int:
    """A bug of ours (or of a library under us): one line, the traceback on request."""
    if os.environ.get("GRADSCOPE_DEBUG"):
        import traceback

        try:
            traceback.print_exception(exc)
        except (OSError, ValueError):
            pass
    message = str(exc).strip().splitlines()
    shown = f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__
    say(_clean(f"gradscope: internal error: {shown} (GRADSCOPE_DEBUG=1 shows the traceback)"))
    return EXIT_INTERNAL


def _usage_line(exc: Any) -> str:
    """A click usage error as one line: what was wrong, and where the help is."""
    message = " ".join(exc.format_message().split())
    ctx = exc.ctx
    command = ctx.info_name if ctx is not None and ctx.parent is not None else None
    return f"{message} (see gradscope {command + ' ' if command else ''}-h)"


def _exit_code(exc: BaseException) -> int:
    """The exit code for an exception that ended a command, after its one line on stderr."""
    if _is_broken_pipe(exc):
        _silence_stdout()
        return EXIT_PIPE_CLOSED
    if isinstance(exc, KeyboardInterrupt):
        raise exc
    try:
        from typer import Abort
        from typer._click import exceptions as click
    except ImportError:  # typer itself is broken: nothing below can be told apart
        return _internal(exc)
    import gradscope as gs

    if isinstance(exc, click.NoArgsIsHelpError):  # bare `gradscope`: show the help
        if exc.ctx is not None:
            sys.stdout.write(exc.ctx.get_help() + "\n")
        return EXIT_UNUSABLE
    if isinstance(exc, click.UsageError):  # bad option, value or argument
        say(_clean(f"gradscope: error: {_usage_line(exc)}"))
        return EXIT_UNUSABLE
    if isinstance(exc, gs.GradscopeError):  # the first line says what; template lines may follow
        lines = str(exc).splitlines() or [type(exc).__name__]
        say(_clean(f"gradscope: error: {lines[0]}"))
        for line in lines[1:]:
            say(line.replace("\x1b", "\\x1b"))
        return EXIT_UNUSABLE
    if isinstance(exc, Abort):  # click's EOF on a prompt: we have none, but say it as Ctrl-C
        raise KeyboardInterrupt from exc
    if isinstance(exc, click.ClickException):  # click's own errors (a file it could not open)
        say(_clean(f"gradscope: error: {' '.join(exc.format_message().split())}"))
        return EXIT_UNUSABLE
    if isinstance(exc, SystemExit):  # sys.exit() reached from code gradscope ran: never silent
        say(f"gradscope: error: the code gradscope ran called sys.exit({exc.code!r}); "
            "nothing was written")
        return EXIT_UNUSABLE
    return _internal(exc)


def _run(argv: list[str] | None) -> int:
    try:
        app = globals().get("app") or __getattr__("app")
        code = app(args=argv, prog_name="gradscope", standalone_mode=False)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # every other way out becomes one line and a code
        return _exit_code(exc)
    if code == EXIT_INTERRUPTED:  # typer turns Ctrl-C inside a command into 130, silently
        raise KeyboardInterrupt
    return code if isinstance(code, int) else EXIT_OK


def main(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point; exits with the codes of the module docstring."""
    try:
        code = _run(argv)
        try:  # what is still buffered goes out now, while a closed pipe can be caught
            if sys.stdout is not None:
                sys.stdout.flush()
        except (OSError, ValueError) as exc:
            if not _is_broken_pipe(exc):
                raise
            _silence_stdout()
            code = EXIT_PIPE_CLOSED
    except KeyboardInterrupt:
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut this line
        say("gradscope: interrupted")
        code = EXIT_INTERRUPTED
    except BaseException as exc:  # whatever escaped the handlers above (a bug in them)
        if _is_broken_pipe(exc):
            _silence_stdout()
            code = EXIT_PIPE_CLOSED
        else:
            code = _internal(exc)
    sys.exit(code)


if __name__ == "__main__":
    main()
