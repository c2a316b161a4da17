"""Render: the graph drawn for people (no torch here).

Renderers take a ``Graph`` (or a record) and return a value (text, bytes, a rich renderable);
they never print. Importing this package registers the graph's output formats with the registry
(``gradscope.output.formats``), in the order ``gs.FORMATS`` lists them: DOT, JSON, the HTML
page, then the Graphviz images; and the tree, notebook and diff renderers.

Modules:
    dot            DOT text from a ``Graph`` (torchviz's colours and shapes), the ``dot`` format
    dot_nodes      one node's DOT statements: label, colours, saved-tensor boxes
    dot_clusters   module clusters (nested ``subgraph cluster_*``) and collapsed boxes
    dot_legend     the compact legend table under a picture
    dot_tokens     DOT's quoting (``quote``) and the ids of every box
    graphviz       SVG, PNG and PDF through the Graphviz binary, bounded in time
    json_text      the ``json`` format (the schema of ``gradscope.graph.schema``)
    html           the offline HTML page (``html`` format, notebook HTML)
    page_data      the rows the page embeds: nodes, edges, containers, details
    page_wire      how the page carries its rows (blocks of columns)
    containers     the tree of containers (modules, regions, folds) the page draws
    tree           the graph as a rich tree for the terminal
    text           plain text of any rich renderable (``str()`` of a record's rendering)
    diff_page      the page and text of a ``GraphDiff``
    torchviz       the ``graphviz.Digraph`` behind ``gs.make_dot``
    assets/        the page's script, stylesheet and the vendored layout library
"""

from __future__ import annotations

# the import order is the registration order (gs.FORMATS), so the import sorter leaves it alone
# isort: off
from . import dot, json_text, html, graphviz  # noqa: F401  (formats, in gs.FORMATS order)
from . import diff_page, text, tree  # noqa: F401  (record renderers, text of renderables)
# isort: on
