"""Writing graphs to files: DOT, JSON and HTML as text, SVG/PNG/PDF through the Graphviz binary."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from ._errors import FormatError, GradscopeError, GraphvizNotFoundError
from ._model import Graph

TEXT_FORMATS = ("dot", "json", "html")
IMAGE_FORMATS = ("svg", "png", "pdf")
FORMATS = TEXT_FORMATS + IMAGE_FORMATS
#: The options ``Graph.to_html`` takes (the others are DOT options).
HTML_OPTIONS = ("title", "depth", "max_nodes", "full", "fold", "saved", "notes", "root")


def dot_binary() -> str | None:
    """Path of the Graphviz ``dot`` binary, or None when it is not installed."""
    return shutil.which("dot")


def check_format(fmt: str) -> str:
    fmt = fmt.lower().lstrip(".")
    if fmt not in FORMATS:
        raise FormatError(
            f"unknown output format {fmt!r}; use one of {', '.join(FORMATS)} "
            "(given by --format or by the output file's suffix)"
        )
    return fmt


def format_for(path: str | Path | None, fmt: str | None) -> str:
    """The format asked for, else the one the path's suffix names.

    Raises:
        FormatError: the format (or the suffix) is not one of ``FORMATS``.
    """
    if fmt:
        return check_format(fmt)
    if path is None:
        raise FormatError(f"no output format given; pass one of {', '.join(FORMATS)}")
    suffix = Path(path).suffix
    if not suffix:
        raise FormatError(
            f"cannot tell the output format of {str(path)!r}: it has no suffix; "
            f"name it e.g. graph.svg, or pass a format ({', '.join(FORMATS)})"
        )
    return check_format(suffix)


def run_dot(dot_source: str, fmt: str, timeout: float | None = None) -> bytes:
    """Lay out ``dot_source`` with the Graphviz binary and return the image bytes."""
    binary = dot_binary()
    if binary is None:
        raise GraphvizNotFoundError(fmt)
    try:
        proc = subprocess.run(
            [binary, f"-T{fmt}"],
            input=dot_source.encode("utf-8"),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise GradscopeError(
            f"Graphviz took more than {timeout:.0f} s to lay out the graph; render a smaller "
            "view, or write DOT text with -o graph.dot"
        ) from None
    if proc.returncode != 0:
        msg = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GradscopeError(f"Graphviz failed: {msg[-1] if msg else 'no message'}")
    return proc.stdout


def render_bytes(graph: Graph, fmt: str, **options: Any) -> bytes:
    """``graph`` rendered in ``fmt``; options go to ``Graph.to_dot`` (``Graph.to_html`` for
    html, which takes ``title``, ``depth`` and ``max_nodes`` and ignores the DOT options)."""
    fmt = check_format(fmt)
    if fmt == "json":
        return graph.to_json().encode("utf-8")
    if fmt == "html":
        keep = {k: v for k, v in options.items() if k in HTML_OPTIONS}
        return graph.to_html(**keep).encode("utf-8")
    source = graph.to_dot(**options)
    if fmt == "dot":
        return source.encode("utf-8")
    return run_dot(source, fmt)


def save_graph(graph: Graph, path: str | Path, format: str | None = None, **options: Any) -> Path:
    """Write ``graph`` to ``path`` in ``format`` (default: from the suffix)."""
    path = Path(path)
    fmt = format_for(path, format)
    data = render_bytes(graph, fmt, **options)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    except OSError as exc:
        raise GradscopeError(f"cannot write {path}: {exc.strerror}") from None
    return path
