"""Module paths as ``gs.scopes`` records them, and the helpers every layer shares.

A path is the dotted name of ``named_modules()`` (``encoder.layers.3.self_attn``), with ``#k`` on
a component for the k-th repeated call of that module within one call of its parent
(``blocks.0#2.attn``). Depth counts module levels below the model: a numeric component (an item
of a ``ModuleList``/``Sequential``) counts with its container, so ``encoder.layers.3`` is at
depth 2 (see ``levels``).
"""

from __future__ import annotations

import functools
import re

from .nodes import GraphLike, Node

_NUMERIC = re.compile(r"^\d+(-\d+)?(#\d+(-\d+)?)?$")
_CALL_PART = re.compile(r"#\d+$")

#: Node kinds that belong to a module group; a ``leaf`` follows its ``AccumulateGrad``.
GROUP_KINDS = ("op", "custom", "accumulate", "module")


def strip_calls(path: str) -> str:
    """``blocks.0#2.attn#1`` -> ``blocks.0.attn``: the ``named_modules()`` name of a call path.

    Example:
        >>> strip_calls("blocks.0#2.attn")
        'blocks.0.attn'
    """
    return ".".join(_CALL_PART.sub("", part) for part in path.split(".")) if "#" in path else path


#: The path component of a ``torch.compile`` region (``<compiled>``, ``<compiled>#1``): not a
#: Python identifier, so no submodule has it.
REGION_PART = "<compiled>"


def levels(path: str) -> list[str]:
    """A module path split into depth levels; numeric components stay with their container
    (but not with a compiled region: the layers of a compiled ``Sequential`` are levels below
    the region's).

    Example:
        >>> levels("encoder.layers.3.self_attn")
        ['encoder', 'layers.3', 'self_attn']
        >>> levels("<compiled>.0")
        ['<compiled>', '0']
        >>> levels("")
        []
    """
    return list(_levels(path))


@functools.lru_cache(maxsize=65536)
def _levels(path: str) -> tuple[str, ...]:
    """``levels`` as a tuple, cached: a big graph asks for the same few paths many times."""
    out: list[str] = []
    for part in path.split(".") if path else []:
        if out and _NUMERIC.match(part) and not out[-1].startswith("<"):
            out[-1] = f"{out[-1]}.{part}"
        else:
            out.append(part)
    return tuple(out)


def node_paths(graph: GraphLike) -> dict[str, str | None]:
    """Module path of every node: its own, or for a leaf its ``AccumulateGrad``'s."""
    paths: dict[str, str | None] = {
        n.id: n.module if n.kind in GROUP_KINDS else None for n in graph.nodes
    }
    kinds = {n.id: n.kind for n in graph.nodes}
    for e in graph.edges:
        if kinds.get(e.src) == "accumulate" and kinds.get(e.dst) == "leaf":
            paths[e.dst] = paths[e.src]
    return paths


def module_class(path: str, members: list[Node]) -> str:
    """Class name of the module at ``path``, from a node inside it that knows (a box's
    ``Box.cls``, or the ``Node.module_classes`` chain ``gs.scopes`` records: the model's class
    first, then one per depth level), else ""."""
    want = len(levels(path))
    for n in members:
        if n.box is not None and n.module == path and n.box.cls:
            return n.box.cls
        chain = n.module_classes
        if chain and inside(n.module, path) and len(chain) > want and chain[want]:
            return chain[want]
    return ""


def inside(module: str | None, path: str) -> bool:
    """Whether the module path ``module`` is ``path`` or lies below it (every path is inside
    the model's own, ``""``).

    Example:
        >>> inside("enc.layers.3", "enc"), inside("encoder", "enc"), inside("enc", "")
        (True, False, True)
    """
    if module is None:
        return False
    return not path or module == path or module.startswith(path + ".")
