"""Atomic file output: every file gradscope writes goes through ``write_atomic``.

The bytes are written to a temporary file in the target's folder, flushed, and renamed over the
target (``os.replace`` is atomic on one file system), so a write that fails part-way (disk full,
quota, Ctrl-C) leaves the previous file byte-identical and no half-written one.

Only regular files are ever replaced. A symlink is followed: its target is replaced (atomically)
and the link stays a link. A FIFO, a device (``/dev/null``), a socket or a folder at the path is
refused with an ``OutputError``: renaming a file over it would swap the special file for a
regular one (run as root, ``/dev/null`` itself). ``output_target`` does that check and gives the
absolute path to write; the CLI calls it before the model file runs (a model file that changes
folder cannot redirect the output), and every write calls it again.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from ..errors import OutputError


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def output_target(path: str | Path) -> Path:
    """The absolute path a write to ``path`` replaces: symlinks followed, relative to the
    current folder now (not when the write happens).

    Raises:
        OutputError: something that is not a regular file is there (a FIFO, a device, a
            socket, a folder), or the file name is longer than the file system takes;
            nothing was written.
    """
    given = Path(path)
    try:
        target = Path(os.path.realpath(os.path.abspath(given)))
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        _check_name(target, given)
        return target
    except OSError as exc:
        raise OutputError(f"cannot write {given}: {_reason(exc)}") from None
    if stat.S_ISREG(mode):
        return target
    kind = next((what for test, what in _KINDS if test(mode)), "not a regular file")
    via = f" (through the link {given})" if target != Path(os.path.abspath(given)) else ""
    raise OutputError(
        f"refusing to write {target}{via}: it is {kind}, not a regular file, and writing would "
        "replace it; give the path of a file"
    )


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path next to the file ``path`` names (a symlink's target); renamed over it
    when the block ends cleanly, removed when it raises. For writers that want a file name
    (``savefig``).

    Raises:
        OutputError: ``path`` is not a regular file (see ``output_target``), or the write
            failed; the previous file is unchanged.
    """
    path = output_target(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp_path = _create_temp(path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {_reason(exc)}") from None
    try:
        yield tmp_path
        _keep_mode(path, tmp_path)
        os.replace(tmp_path, path)
    except OSError as exc:
        _discard(tmp_path)
        raise OutputError(
            f"cannot write {path}: {_reason(exc)}; the previous file, if any, is unchanged"
        ) from None
    except BaseException:
        _discard(tmp_path)
        raise


def write_atomic(path: str | Path, data: bytes | str, *, encoding: str = "utf-8") -> Path:
    """Write ``data`` to ``path`` atomically (parent folders are created; a symlink's target is
    replaced, the link kept).

    Raises:
        OutputError: the file could not be written, or ``path`` is a FIFO, device, socket or
            folder (see ``output_target``); the previous file is unchanged.
    """
    payload = data.encode(encoding) if isinstance(data, str) else data
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    return path


def write_with(path: str | Path, write: Callable[[IO[str]], None], *, newline: str = "") -> Path:
    """Call ``write(file)`` on a text file that replaces ``path`` atomically once it returns."""
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline=newline) as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    return path


def _name_max(folder: Path) -> int:
    """The longest file name (in bytes) the file system of ``folder`` (or of its nearest
    existing parent) takes; 255 where it cannot be asked."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return int(os.pathconf(probe, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        return 255


def _check_name(target: Path, given: Path) -> None:
    size = len(os.fsencode(target.name))
    most = _name_max(target.parent)
    if size > most:
        raise OutputError(
            f"cannot write {given}: its file name is {size} bytes long and this file system "
            f"takes at most {most}; give a shorter name"
        )


#: What a temporary name adds to (a prefix of) the target's name: ``.`` and ``.<8 hex>.tmp``.
_TEMP_EXTRA = len(".") + len(".00000000.tmp")


def _temp_stem(path: Path) -> str:
    """The target's name, cut (at a character) so that the temporary name fits the file
    system's limit: a valid 250-character name must not fail for its temporary's sake."""
    room = _name_max(path.parent) - _TEMP_EXTRA
    name = path.name
    while name and len(os.fsencode(name)) > room:
        name = name[:-1]
    return name


def _create_temp(path: Path) -> Path:
    """A new empty file next to ``path``, created with mode 0666 so that the umask applies
    as it would to ``open(path, "w")`` (``mkstemp`` would make it 0600)."""
    stem = _temp_stem(path)
    for _ in range(100):
        tmp = path.with_name(f".{stem}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"no free temporary name next to {path}")


def _keep_mode(path: Path, tmp: Path) -> None:
    """Give the new file the permission bits of the file it replaces."""
    try:
        mode = path.stat().st_mode & 0o7777
    except FileNotFoundError:
        return
    os.chmod(tmp, mode)


def _discard(tmp: Path) -> None:
    with contextlib.suppress(OSError):
        tmp.unlink()
