"""The ``gradscope`` command line: the console-script entry point (``gradscope_cli.main:main``)
and the one place that turns whatever happened into an exit code and at most one line on stderr
(the codes, signals and streams: ``gradscope_cli.process``).

This module imports only the standard library when it is loaded: typer, rich and gradscope are
imported inside ``main`` (where a Ctrl-C is caught), and torch only by a command that runs a
model, so ``gradscope --help`` never pays for torch. Commands never import this module: what
they share is in ``common``, ``outputs`` and ``process``.

Adding a command: a module ``gradscope_cli/NAME.py`` with a ``register(app)`` function, and
``"NAME"`` in ``COMMANDS`` below.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, NoReturn

from .process import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_PIPE_CLOSED,
    EXIT_UNUSABLE,
    Terminated,
    check_signals,
    end_children,
    end_signals,
    first_signal,
    flush_streams,
    install_signals,
    internal_error,
    is_broken_pipe,
    one_line,
    reader_left,
    real_stdout,
    remember_streams,
    restore_streams,
    sane_environment,
    say,
    signal_exit_code,
    signal_line,
    silence_stdout,
    stray_threads,
)

if TYPE_CHECKING:
    import typer

#: The modules whose ``register(app)`` adds commands, in the order ``--help`` lists them
#: (``render`` adds ``render`` and ``tree``).
COMMANDS: tuple[str, ...] = ("render", "report", "check", "memory", "diff", "doctor", "example",
                             "compare")

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


def _usage_line(exc: Any) -> str:
    """A click usage error as one line: what was wrong, and where the help is."""
    message = " ".join(exc.format_message().split())
    ctx = exc.ctx
    command = ctx.info_name if ctx is not None and ctx.parent is not None else None
    return f"{message} (see gradscope {command + ' ' if command else ''}-h)"


def _exit_code(exc: BaseException) -> int:
    """The exit code for an exception that ended a command, after its one line on stderr."""
    if is_broken_pipe(exc):
        silence_stdout()
        return EXIT_PIPE_CLOSED
    if isinstance(exc, KeyboardInterrupt):
        raise exc
    try:
        from typer import Abort
        from typer._click import exceptions as click
    except ImportError:  # typer itself is broken: nothing below can be told apart
        return internal_error(exc)
    import gradscope as gs

    if isinstance(exc, click.NoArgsIsHelpError):  # bare `gradscope`: show the help
        if exc.ctx is not None and real_stdout() is not None:
            real_stdout().write(exc.ctx.get_help() + "\n")
        return EXIT_UNUSABLE
    if isinstance(exc, click.UsageError):  # bad option, value or argument
        say(one_line(f"gradscope: error: {_usage_line(exc)}"))
        return EXIT_UNUSABLE
    if isinstance(exc, gs.GradscopeError):  # the first line says what; template lines may follow
        lines = str(exc).splitlines() or [type(exc).__name__]
        say(one_line(f"gradscope: error: {lines[0]}"))
        for line in lines[1:]:
            say(line.replace("\x1b", "\\x1b"))
        return EXIT_UNUSABLE
    if isinstance(exc, Abort):  # click's EOF on a prompt: we have none, but say it as Ctrl-C
        raise KeyboardInterrupt from exc
    if isinstance(exc, click.ClickException):  # click's own errors (a file it could not open)
        say(one_line(f"gradscope: error: {' '.join(exc.format_message().split())}"))
        return EXIT_UNUSABLE
    if isinstance(exc, SystemExit):  # sys.exit() reached from code gradscope ran: never silent
        say(f"gradscope: error: the code gradscope ran called sys.exit({exc.code!r}); "
            "nothing was written")
        return EXIT_UNUSABLE
    return internal_error(exc)


def _from_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` was caused by a KeyboardInterrupt (its ``__cause__``/``__context__``
    chain, cycles cut)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def _run(argv: list[str] | None) -> int:
    try:
        app = globals().get("app") or __getattr__("app")
        code = app(args=argv, prog_name="gradscope", standalone_mode=False)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # every other way out becomes one line and a code
        if first_signal() is not None or _from_interrupt(exc):
            # a signal's exception wrapped on its way out (Python 3.11 turns one raised in
            # a class body's __set_name__ into a RuntimeError): it is the signal, not a bug
            raise KeyboardInterrupt from exc
        return _exit_code(exc)
    if code == EXIT_INTERRUPTED:  # typer turns Ctrl-C inside a command into 130, silently
        raise KeyboardInterrupt
    check_signals()  # a signal whose exception was swallowed on the way still ends as one
    return code if isinstance(code, int) else EXIT_OK


def main(argv: list[str] | None = None) -> NoReturn:
    """Console-script entry point; exits with the codes of the module docstring."""
    remember_streams()
    signalled = False
    try:
        install_signals(watchdog=argv is None)  # main([...]) runs inside a process that goes on
        sane_environment()
        code = _run(argv)
        restore_streams()
        try:  # what is still buffered goes out now, while a closed pipe can be caught
            if real_stdout() is not None:
                real_stdout().flush()
        except (OSError, ValueError) as exc:
            if not is_broken_pipe(exc):
                raise
            silence_stdout()
            code = EXIT_PIPE_CLOSED
        else:
            if reader_left():
                silence_stdout()
                code = EXIT_PIPE_CLOSED
    except KeyboardInterrupt as exc:
        import signal

        for name in ("SIGINT", "SIGTERM", "SIGHUP"):  # a second signal must not cut this line
            if hasattr(signal, name):
                signal.signal(getattr(signal, name), signal.SIG_IGN)
        signum = exc.signum if isinstance(exc, Terminated) else first_signal()
        if argv is None:  # the console script: its children are gradscope's own
            end_children()
        say(signal_line(signum))
        code, signalled = signal_exit_code(signum), True
    except BaseException as exc:  # whatever escaped the handlers above (a bug in them)
        if is_broken_pipe(exc):
            silence_stdout()
            code = EXIT_PIPE_CLOSED
        else:
            code = internal_error(exc)
    end_signals()
    restore_streams()
    # a model file's thread would keep the exit waiting; after a signal, the interpreter's
    # own tear-down (torch's modules) would take a second more: the clean-up is done by now
    if argv is None and (signalled or stray_threads()):
        flush_streams()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    main()
