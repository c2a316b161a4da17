"""Views: everything that draws the plain-data model (no torch here).

Importing this package registers every output format and record renderer with the model's
registry (``gradscope.model.formats``), in the order ``gs.FORMATS`` lists them: DOT, JSON, the
HTML page, then the Graphviz images.
"""

from __future__ import annotations

# the import order is the registration order (gs.FORMATS), so the import sorter leaves it alone
# isort: off
from . import dot, json_text, html, graphviz  # noqa: F401  (formats, in gs.FORMATS order)
from . import check, diff, doctor, explain, memory, memplan, monitor, tree  # noqa: F401  (record renderers)
from . import step_memory  # noqa: F401  (record renderers)
# isort: on
