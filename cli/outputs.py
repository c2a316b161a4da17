"""The one place that settles a command's outputs, before anything runs.

Every command that writes files (``render -o``, ``report --json/--csv/--plot``, ``memory
--json/--plot``, ``diff -o``) hands its outputs and its inputs (the model file, the graph files)
to ``settle``, which, before the model file is even imported:

- makes each output absolute with symlinks followed (``gs.output_target``: a model file that
  changes folder cannot redirect it; a FIFO, device, socket or folder is refused; a name longer
  than the file system takes is refused);
- refuses an output that is one of the inputs (the same path, a link to it, a hard link: the
  same device and inode), or the same file as another output (``--json X --csv X``);
- refuses an output whose folder does not exist, unless the command's ``--mkdir`` asks for it
  (then the write creates it);
- refuses a suffix the option cannot write (``diff -o d.svg``: the diff is a page, ``.html``;
  ``--plot q.svg``: the plots are PNG);
- refuses ``-`` (standard output) for an option that writes only files (``report --csv -``);
  ``render -o -`` takes it.

Each refusal is a ``gs.OutputError``: one line, exit code 2, nothing run and nothing written.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gradscope as gs

#: ``-o -``: the bytes go to standard output.
STDOUT = "-"


@dataclass(frozen=True)
class Output:
    """One output a command asked for.

    Attributes:
        option: how it was given (``-o``, ``--json``), for the messages.
        given: the path as the user wrote it (what ``wrote ...`` repeats).
        path: the absolute file to replace, symlinks followed.
    """

    option: str
    given: Path
    path: Path


def _same_file(a: Path, b: Path) -> bool:
    if a == b:
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): only the path can match
        return False


def _folder_problem(path: Path, mkdir: bool) -> str | None:
    parent = path.parent
    if parent.is_dir():
        return None
    probe = parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        return f"{probe} is a file, not a folder"
    if mkdir:
        return None
    return f"the folder {parent} does not exist; create it first, or pass --mkdir"


def settle(
    outputs: Sequence[tuple[str, Path | str | None]],
    *,
    inputs: Sequence[tuple[str, Path | str]] = (),
    mkdir: bool = False,
    suffixes: dict[str, tuple[str, ...]] | None = None,
    stdout: Sequence[str] = (),
) -> list[Output | None]:
    """The outputs ``(option, path or None)`` settled against the ``inputs`` ``(what, path)``
    and each other; one entry per output, None where none was given (or ``-``, for an option
    in ``stdout``).

    Args:
        outputs: the outputs in the order the command takes them.
        inputs: the files the command reads (``("the model file", "m.py")``).
        mkdir: create missing folders (``--mkdir``) instead of refusing them.
        suffixes: option -> the suffixes it can write (``{"-o": (".html",)}``).
        stdout: the options that can write to standard output (``-``).

    Raises:
        gs.OutputError: an output cannot be used (see the module docstring); nothing ran.
    """
    read = [(what, Path(os.path.abspath(p)), Path(os.path.realpath(p))) for what, p in inputs]
    settled: list[Output | None] = []
    for option, given in outputs:
        if given is None or (str(given) == STDOUT and option in stdout):
            settled.append(None)
            continue
        if str(given) == STDOUT:
            raise gs.OutputError(
                f"{option} -: this output is written to a file, not to standard output; give "
                "a file name"
            )
        given = Path(given)
        path = gs.output_target(given)
        for what, plain, real in read:
            if _same_file(path, real) or _same_file(Path(os.path.abspath(given)), plain):
                raise gs.OutputError(
                    f"{option} {given} is {what} ({plain.name}): writing it would replace an "
                    "input; give another file name"
                )
        allowed = (suffixes or {}).get(option)
        if allowed and given.suffix.lower() not in allowed:
            raise gs.OutputError(
                f"{option} {given}: this output is written as {' or '.join(allowed)}; give a "
                f"file name ending in {allowed[0]}"
            )
        for done in settled:
            if done is not None and _same_file(done.path, path):
                raise gs.OutputError(
                    f"{done.option} and {option} name the same file ({given}): the second would "
                    "replace the first; give each its own file name"
                )
        problem = _folder_problem(path, mkdir)
        if problem is not None:
            raise gs.OutputError(f"cannot write {option} {given}: {problem}")
        settled.append(Output(option, given, path))
    return settled
