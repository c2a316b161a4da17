"""The process around a command: exit codes, signals, the streams, the one line on stderr.

Exit codes: 0 done and nothing alarming; 1 done and it found the problem asked about (non-finite
gradients, a failed check); 2 the input could not be used (one line on stderr, never a
traceback); 3 an internal error, a bug in gradscope (one line, ``GRADSCOPE_DEBUG=1`` shows the
traceback); 130 interrupted (Ctrl-C at any moment, start-up included: ``gradscope:
interrupted``); 141 the reader of the output went away (``gradscope tree m.py | head``): nothing
more is written and nothing is said.

Signals: SIGINT, SIGTERM and SIGHUP all stop a command the same way (an exception raised where it
runs, so child processes such as Graphviz are ended and temporary files removed); the exit code
is 128 + the signal's number (130, 143, 129). A signal is never lost: it is also recorded, a
command that goes on after it (an exception swallowed inside an import) is stopped at the next
check (``check_signals``), and a watchdog ends the process ``GRACE`` seconds after the first
signal if it has not ended by itself. A signal that arrives while an installed library's module
code runs (an import: torch's native initialisers call back into Python, and an exception
raised inside them aborts the process) is only recorded; it is raised at the next check.

The streams: the ``sys.stdout`` and ``sys.stderr`` gradscope started with are kept
(``real_stdout``/``real_stderr``) and every message goes to them, so a model file that replaces
them (or prints) cannot take gradscope's output. A ``COLUMNS`` (or ``LINES``) that is not a
positive number is ignored. Threads the model file left running do not keep the process alive
once the command is done.

What the process keeps from its start (``_Edge``: the streams, the signals seen, the watchdog's
events) has this module as its one owner: the entry point (``main``) and the commands read and
change it through the functions here. Only the standard library is imported.
"""

from __future__ import annotations

import os
import sys
from typing import Any

EXIT_OK, EXIT_FOUND, EXIT_UNUSABLE, EXIT_INTERNAL = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_PIPE_CLOSED = 130, 141

#: Seconds after the first signal before the watchdog ends a process that did not stop.
GRACE = 1.3  # then ending the children and the exit: gone within 1.5 s
#: Seconds the end of a command waits for the reader of a pipe to take what was written.
DRAIN = 1.0

class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, stopping a command as Ctrl-C does (a ``KeyboardInterrupt``, so every
    clean-up that handles Ctrl-C handles these too); ``signum`` gives the exit code."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Edge:
    """What the process keeps from its start: the streams it was given, the signals seen."""

    def __init__(self) -> None:
        self.stdout: Any = sys.stdout
        self.stderr: Any = sys.stderr
        self.signals: list[int] = []
        self.done: Any = None  # threading.Event: set once the exit line is said
        self.fired: Any = None  # threading.Event: set by the first signal
        self.previous: dict[int, Any] = {}  # the handlers before main's, put back at its end
        self.unraisable: Any = None  # sys.unraisablehook before main's


_EDGE = _Edge()


def remember_streams() -> None:
    """Take the current ``sys.stdout``/``sys.stderr`` as the ones every message goes to (at
    the start of ``main``, and of every command, which a test may invoke without ``main``)."""
    _EDGE.stdout, _EDGE.stderr = sys.stdout, sys.stderr


def real_stdout() -> Any:
    """The ``sys.stdout`` gradscope started with (None when descriptor 1 was closed)."""
    return _EDGE.stdout


def real_stderr() -> Any:
    """The ``sys.stderr`` gradscope started with (None when descriptor 2 was closed)."""
    return _EDGE.stderr


def signal_exit_code(signum: int | None) -> int:
    return EXIT_INTERRUPTED if signum is None else 128 + signum


def signal_line(signum: int | None) -> str:
    import signal

    if signum is None or signum == signal.SIGINT:
        return "gradscope: interrupted"
    return f"gradscope: terminated ({signal.Signals(signum).name})"


_OURS = ("gradscope", "gradscope_cli", "__main__")  # __main__: a program run, not an import


def _in_library_import(frame: Any) -> bool:
    """Whether an installed library's module code is running (its import in progress) on the
    stack of ``frame``. Its native initialisers call back into Python (torch's
    ``_c10d_init`` builds pybind11 classes), and an exception raised there cannot cross the
    C++ frames: pybind11 ends the process with SIGABRT. gradscope's own modules, the model
    file's code and the program being run (``python -m pytest``) are not library imports."""
    depth = 0
    while frame is not None and depth < 400:
        code = frame.f_code
        caller = frame.f_back
        # a module's code run by the import system (not a runner's exec of module-level code:
        # pytest-xdist's worker, execnet's channel)
        if code.co_name == "<module>" and caller is not None and (
                "importlib._bootstrap" in caller.f_code.co_filename  # frozen, or not:
                or "importlib/_bootstrap" in caller.f_code.co_filename):  # -X frozen_modules=off
            name = str(frame.f_globals.get("__name__") or "")
            path = code.co_filename.replace("\\", "/")
            if (name.split(".")[0] not in _OURS
                    and ("/site-packages/" in path or "/dist-packages/" in path)):
                return True
        frame, depth = caller, depth + 1
    return False


def _on_signal(signum: int, frame: Any) -> None:
    import signal

    first = not _EDGE.signals
    _EDGE.signals.append(signum)
    if first and _EDGE.fired is not None:
        _EDGE.fired.set()
    if _in_library_import(frame):
        return  # recorded: raised at the next check (the import's end), or the watchdog ends it
    raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)


def _watchdog(fired: Any, done: Any) -> None:
    """Its own two events (a later ``main`` in the same process makes new ones)."""
    fired.wait()
    if done.wait(GRACE):
        return
    signum = _EDGE.signals[0] if _EDGE.signals else None
    end_children()
    say(signal_line(signum))
    os._exit(signal_exit_code(signum))


def _unraisable(info: Any) -> None:
    """Python prints "Exception ignored in ..." with a traceback when a signal's exception is
    raised where it cannot propagate (a weakref callback, a ``__del__``): the signal is
    recorded and raised again (``check_signals``), so that print is noise on the one line."""
    if _EDGE.signals and isinstance(info.exc_value, KeyboardInterrupt):
        return
    (_EDGE.unraisable or sys.__unraisablehook__)(info)


def install_signals(*, watchdog: bool = True) -> None:
    """SIGINT, SIGTERM and SIGHUP raise where the command runs, and are recorded; with
    ``watchdog``, the process ends ``GRACE`` seconds after the first one whatever happens
    (``main`` arms it; a test in its own process does not). ``end_signals`` undoes it."""
    import signal
    import threading

    _EDGE.fired, _EDGE.done = threading.Event(), threading.Event()
    if sys.unraisablehook is not _unraisable:
        _EDGE.unraisable, sys.unraisablehook = sys.unraisablehook, _unraisable
    if watchdog:
        threading.Thread(target=_watchdog, args=(_EDGE.fired, _EDGE.done),
                         name="gradscope-watchdog", daemon=True).start()
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is None or (name != "SIGINT" and signal.getsignal(sig) == signal.SIG_IGN):
            continue  # nohup's SIGHUP stays ignored
        try:
            _EDGE.previous[sig] = signal.signal(sig, _on_signal)
        except (OSError, ValueError):  # not the main thread (an embedding): leave them
            pass


def end_signals() -> None:
    """Stop the watchdog and put back the handlers main found (it may run in a process that
    goes on, a test's)."""
    import signal

    if _EDGE.done is not None:
        _EDGE.done.set()
        _EDGE.fired.set()
    for sig, handler in _EDGE.previous.items():
        try:
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        except (OSError, ValueError, TypeError):
            pass
    _EDGE.previous.clear()
    _EDGE.signals.clear()
    if sys.unraisablehook is _unraisable:
        sys.unraisablehook = _EDGE.unraisable or sys.__unraisablehook__
        _EDGE.unraisable = None


def check_signals() -> None:
    """Raise again for a signal that was received but whose exception went missing (caught
    by code gradscope ran): a command calls it at the points where it may go on."""
    if _EDGE.signals:
        signum = _EDGE.signals[0]
        import signal

        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated(signum)


def end_children() -> None:
    """After a signal: send SIGTERM to the child processes still running (Graphviz caught
    between its start and the point where an exception would end it; a model file's
    workers). Linux's ``/proc`` tells them; elsewhere ``subprocess`` ends its own."""
    import signal

    me = os.getpid()
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[-1].split()
            if int(fields[1]) == me and fields[0] != "Z":
                os.kill(int(entry), signal.SIGTERM)
        except (OSError, ValueError, IndexError):
            continue


def sane_environment() -> None:
    """``COLUMNS=0`` (or any value that is not a positive number) would make rich print
    nothing at all: such a value is dropped and the terminal's own size used."""
    for name in ("COLUMNS", "LINES"):
        value = os.environ.get(name)
        if value is not None and not (value.strip().isdigit() and int(value) > 0):
            del os.environ[name]


def restore_streams() -> None:
    """Give back the streams gradscope started with (a model file may have replaced them)."""
    sys.stdout, sys.stderr = _EDGE.stdout, _EDGE.stderr


def reader_left() -> bool:
    """After the output went into a pipe: wait (at most ``DRAIN`` seconds) until its reader
    has taken it all, and say whether the reader went away without it (``| head -c 10``)
    -- a write that fits the pipe's buffer never sees the closed pipe itself."""
    import fcntl
    import select
    import stat
    import struct
    import termios
    import time

    try:
        fd = _EDGE.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        end = time.monotonic() + DRAIN
        while True:
            if any(ev & select.POLLERR for _, ev in poller.poll(0)):
                return True
            buf = fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0")
            if struct.unpack("i", buf)[0] <= 0 or time.monotonic() > end:
                return False
            time.sleep(0.005)
    except (OSError, ValueError, AttributeError):
        return False


def stray_threads() -> bool:
    """Whether threads the command did not start (a model file's) are still running."""
    import threading

    return any(t.is_alive() and not t.daemon and t is not threading.main_thread()
               for t in threading.enumerate())


# ---------------------------------------------------------------------------- the console edge
def one_line(text: str) -> str:
    """One line with control characters shown as escapes (a message may quote a model's
    names; it must not move the cursor or restyle the terminal)."""
    line = " ".join(text.split("\n")).replace("\r", " ")
    return "".join(
        ch if ch.isprintable() or ch == " " else ascii(ch)[1:-1] for ch in line
    )


def say(line: str) -> None:
    """Write one line to stderr; a closed stderr is not worth a traceback."""
    try:
        _EDGE.stderr.write(line + "\n")
        _EDGE.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass


def silence_stdout() -> None:
    """The reader of stdout is gone: point the descriptor at /dev/null so that nothing more
    (Python's own flush at exit included) tries to write to the closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, _EDGE.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def is_broken_pipe(exc: BaseException | None) -> bool:
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


def internal_error(exc: BaseException) -> int:
    """A bug of ours (or of a library under us): one line, the traceback on request."""
    if os.environ.get("GRADSCOPE_DEBUG"):
        import traceback

        try:
            traceback.print_exception(exc)
        except (OSError, ValueError):
            pass
    try:
        message = str(exc).strip().splitlines()
    except Exception:  # an exception whose __str__ raises: its type is all there is to say
        message = []
    shown = f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__
    say(one_line(f"gradscope: internal error: {shown} (GRADSCOPE_DEBUG=1 shows the traceback)"))
    return EXIT_INTERNAL



def first_signal() -> int | None:
    """The first signal received since ``install_signals`` (None when none was)."""
    return _EDGE.signals[0] if _EDGE.signals else None


def flush_streams() -> None:
    """Flush both streams gradscope started with; a closed one is not worth a traceback."""
    for stream in (_EDGE.stdout, _EDGE.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
