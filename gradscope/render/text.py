"""Plain text of a rich renderable: what ``str()`` of a record's rendering gives
(``gradscope.output.formats.Printable``), registered as the ``text`` renderer."""

from __future__ import annotations

import io
import shutil
import sys
from typing import Any

from rich.console import Console

from ..output.formats import register_renderer

#: The width of the text when standard output is not a terminal (a file, a pipe, a notebook).
DEFAULT_WIDTH = 100


def text_width() -> int:
    """The terminal's width (``COLUMNS`` first, as rich reads it) when standard output is one,
    else ``DEFAULT_WIDTH``."""
    try:
        tty = sys.stdout is not None and sys.stdout.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        tty = False
    if not tty:
        return DEFAULT_WIDTH
    return shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns or DEFAULT_WIDTH


def to_text(renderable: Any, *, width: int | None = None) -> str:
    """``renderable`` as rich draws it, without colour or escape codes, ``width`` columns wide
    (default ``text_width()``), with no newline at the end.

    Example:
        >>> from rich.text import Text
        >>> to_text(Text("vanishing gradient"), width=40)
        'vanishing gradient'
    """
    console = Console(
        file=io.StringIO(), width=width or text_width(), color_system=None,
        force_terminal=False, force_jupyter=False, highlight=False, emoji=False,
        legacy_windows=False,
    )
    with console.capture() as captured:
        console.print(renderable)
    return "\n".join(line.rstrip() for line in captured.get().rstrip("\n").split("\n"))


register_renderer("text", to_text)
