"""JSON output (schema of ``gradscope.graph.schema``) registered as a format."""

from __future__ import annotations

from ..graph.graph import Graph
from ..output.formats import FormatKind, OutputFormat, register_format


def _render_json(graph: Graph) -> bytes:
    return graph.to_json().encode("utf-8")


register_format(
    OutputFormat("json", _render_json, frozenset(), "the graph as JSON data", kind=FormatKind.DATA)
)
