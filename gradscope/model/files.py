"""Atomic file output: every file gradscope writes goes through ``write_atomic``.

The bytes are written to a temporary file in the target's folder, flushed, and renamed over the
target (``os.replace`` is atomic on one file system), so a write that fails part-way (disk full,
quota, Ctrl-C) leaves the previous file byte-identical and no half-written one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from ..errors import OutputError


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc) or type(exc).__name__


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path next to ``path``; renamed over ``path`` when the block ends cleanly,
    removed when it raises. For writers that want a file name (``savefig``)."""
    path = Path(path)
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
    """Write ``data`` to ``path`` atomically (parent folders are created).

    Raises:
        OutputError: the file could not be written; the previous file is unchanged.
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


def _create_temp(path: Path) -> Path:
    """A new empty file next to ``path``, created with mode 0666 so that the umask applies
    as it would to ``open(path, "w")`` (``mkstemp`` would make it 0600)."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
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
