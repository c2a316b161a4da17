"""Images through the Graphviz binary: SVG, PNG and PDF from the DOT text of ``views/dot.py``.

``dot`` runs as a subprocess with the DOT text on stdin and a time limit, so a layout that
cannot finish never hangs the caller: it raises ``LayoutError`` instead.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from typing import Any

from ..errors import GraphvizNotFoundError, LayoutError
from ..graph.graph import Graph
from ..output.formats import FormatKind, OutputFormat, register_format
from .dot import DOT_OPTIONS, to_dot

#: Seconds a Graphviz layout may take unless the caller gives a limit.
DEFAULT_TIMEOUT = 120.0

#: A line of ``views/dot.py`` that only asks for nodes on one rank (``{rank=same; n7; n7_s0}``:
#: a saved tensor or a parameter beside its op). Node ids only, so no label can match.
_RANK_SAME = re.compile(r"^([ \t]*)\{rank=same;([ \t;A-Za-z0-9_]*)\}[ \t]*$", re.MULTILINE)


def dot_binary() -> str | None:
    """Path of the Graphviz ``dot`` binary, or None when it is not installed."""
    return shutil.which("dot")


def graphviz_available() -> bool:
    """Whether the Graphviz binary is there (the availability of SVG, PNG and PDF)."""
    return dot_binary() is not None


def run_dot(dot_source: str, fmt: str, timeout: float | None = DEFAULT_TIMEOUT) -> bytes:
    """Lay out ``dot_source`` with the Graphviz binary and return the image bytes.

    Raises:
        GraphvizNotFoundError: ``dot`` is not installed.
        LayoutError: Graphviz failed, or took more than ``timeout`` seconds.
    """
    binary = dot_binary()
    if binary is None:
        raise GraphvizNotFoundError(fmt)
    start = time.monotonic()
    proc = _dot(binary, dot_source, fmt, timeout)
    if proc.returncode != 0 and b"trouble in init_rank" in proc.stderr:
        # Graphviz's ranker gives up on some rank=same groups inside nested clusters (seen
        # on Hugging Face Whisper with --backward, Graphviz 2.43). The groups only place
        # saved tensors and parameters beside their op: lay out without them rather than
        # give no picture. The retry has what is left of the time limit.
        left = None if timeout is None else max(timeout - (time.monotonic() - start), 1.0)
        unranked = _RANK_SAME.sub(r"\1\2", dot_source)  # the nodes stay, in their cluster
        proc = _dot(binary, unranked, fmt, left)
    if proc.returncode != 0:
        raise LayoutError(f"Graphviz failed: {_reason(proc.stderr)}; -o graph.dot writes "
                          "the graph without Graphviz, -o graph.html draws it in the browser")
    return proc.stdout


def _reason(stderr: bytes) -> str:
    """Graphviz's own error line (``Error: ...``), not the node dump it may print after it."""
    lines = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.lower().startswith("error")]
    return (errors or lines or ["no message"])[0]


def _dot(binary: str, dot_source: str, fmt: str,
         timeout: float | None) -> subprocess.CompletedProcess[bytes]:
    try:
        proc = subprocess.run(
            [binary, f"-T{fmt}"],
            input=dot_source.encode("utf-8"),
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise LayoutError(
            f"Graphviz took more than {timeout:.0f} s to lay out the graph and was stopped; "
            "draw a smaller view (--depth N, or drop --full), raise --timeout, or write "
            "-o graph.html (the page lays out one module at a time) or -o graph.dot"
        ) from None
    return proc


def _image(fmt: str) -> Any:
    def render(graph: Graph, *, timeout: float | None = DEFAULT_TIMEOUT, **options: Any) -> bytes:
        return run_dot(to_dot(graph, **options), fmt, timeout=timeout)

    return render


for _fmt, _what, _binary in (
    ("svg", "SVG image (needs the Graphviz binary)", False),
    ("png", "PNG image (needs the Graphviz binary)", True),
    ("pdf", "PDF document (needs the Graphviz binary)", True),
):
    register_format(
        OutputFormat(_fmt, _image(_fmt), DOT_OPTIONS | {"timeout"}, _what, binary=_binary,
                     kind=FormatKind.PICTURE, available=graphviz_available,
                     unavailable=GraphvizNotFoundError)
    )
