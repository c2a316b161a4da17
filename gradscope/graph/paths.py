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
    out: list[list[str]] = []  # parts of each level, joined once at the end (linear)
    for part in path.split(".") if path else []:
        if out and _NUMERIC.match(part) and not out[-1][0].startswith("<"):
            out[-1].append(part)
        else:
            out.append([part])
    return tuple(".".join(parts) for parts in out)


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


class ModuleTrie:
    """Module paths as a trie of their levels: each distinct prefix (``encoder``,
    ``encoder.layers.3``) is an integer, so code that visits every prefix of a path costs the
    path's length, not its length squared (a path 100,000 levels deep is no special case).
    Index 0 is the model itself (the empty path).

    Example:
        >>> t = ModuleTrie()
        >>> ids = t.prefixes("enc.layers.3.attn")
        >>> [t.level[i] for i in ids], t.path(ids[-1]), t.depth[ids[-1]]
        (['enc', 'layers.3', 'attn'], 'enc.layers.3.attn', 3)
    """

    def __init__(self) -> None:
        self.parent: list[int] = [-1]
        self.level: list[str] = [""]
        self.depth: list[int] = [0]
        self.children: list[list[int]] = [[]]
        self._index: dict[tuple[int, str], int] = {}

    def child(self, parent: int, level: str) -> int:
        """The index of level ``level`` below ``parent``, added when new."""
        i = self._index.get((parent, level))
        if i is None:
            i = self._index[(parent, level)] = len(self.parent)
            self.parent.append(parent)
            self.level.append(level)
            self.depth.append(self.depth[parent] + 1)
            self.children.append([])
            self.children[parent].append(i)
        return i

    def prefixes(self, path: str | None) -> list[int]:
        """The indices of every prefix of ``path``, shallowest first ([] for None or "")."""
        out: list[int] = []
        i = 0
        for level in levels(path) if path else ():
            i = self.child(i, level)
            out.append(i)
        return out

    def add(self, path: str | None) -> int:
        """The index of ``path`` (0 for the model itself)."""
        ids = self.prefixes(path)
        return ids[-1] if ids else 0

    def find(self, path: str) -> int | None:
        """The index of ``path`` if it was added, else None."""
        i = 0
        for level in levels(path) if path else ():
            found = self._index.get((i, level))
            if found is None:
                return None
            i = found
        return i

    def path(self, i: int) -> str:
        """The dotted path of prefix ``i``."""
        parts = []
        while i > 0:
            parts.append(self.level[i])
            i = self.parent[i]
        return ".".join(reversed(parts))
