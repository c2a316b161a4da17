"""The graph as a tree of text lines for the terminal (a ``rich`` renderable).

Layout: the longest path from each output (the "spine") runs down the left at one indent; side
inputs hang off their node with tree guides, and follow the same rule inside. Indentation then
grows with branching, not with depth, so a 1,000-layer chain stays readable. A node reached a
second time is shown once more as a one-line reference (``↺``).
"""

from __future__ import annotations

from rich.console import Group
from rich.text import Text

from ._model import Graph, Node, format_bytes
from ._render_dot import size_to_str

STYLES = {
    "output": "bold green",
    "leaf": "cyan",
    "custom": "bold magenta",
    "op": "bold",
    "accumulate": "bold",
}


def _heights(graph: Graph, kids: dict[str, list[str]]) -> dict[str, int]:
    """Longest path (in nodes) from each node to a sink, iteratively."""
    height: dict[str, int] = {}
    for start in graph.nodes:
        if start.id in height:
            continue
        stack = [(start.id, False)]
        while stack:
            nid, expanded = stack.pop()
            if expanded:
                height[nid] = 1 + max((height.get(c, 0) for c in kids[nid]), default=0)
                continue
            if nid in height:
                continue
            height[nid] = 0  # marks "in progress"; graphs are acyclic, so it is overwritten
            stack.append((nid, True))
            stack.extend((c, False) for c in kids[nid] if c not in height)
    return height


def _tensor_text(t_name: str | None, node: Node) -> Text:
    t = node.tensor
    text = Text()
    if t_name:
        text.append(t_name, STYLES[node.kind])
        text.append(" ")
    if t is not None:
        text.append(size_to_str(t.shape))
        text.append(f" {t.dtype}", "dim")
    return text


def _label(node: Node, leaf: Node | None, ref: bool) -> Text:
    text = Text()
    if ref:
        text.append("↺ ", "dim")
    if node.kind in ("output", "leaf"):
        kind = "view base" if node.attrs.get("view_base") else node.kind
        text.append(f"{kind} ", STYLES[node.kind])
        text.append_text(_tensor_text(node.name if node.name not in ("", "output") else None, node))
    else:
        text.append(node.name, STYLES[node.kind])
        if node.kind == "custom":
            text.append(" (custom Function)", "magenta")
        if leaf is not None:
            text.append(" ← ")
            text.append_text(_tensor_text(leaf.name or "(unnamed leaf)", leaf))
    text.append(f"  {node.id}", "dim")
    if ref:
        text.append(" (shown above)", "dim")
        return text
    if node.module:
        text.append(f"  [{node.module}]", "blue")
    if node.saved:
        text.append("  saved ", "dim")
        parts = []
        for s in node.saved:
            shape = size_to_str(s.shape) if s.shape is not None else ""
            parts.append(f"{s.name} {shape} freed".replace("  ", " ") if s.freed else f"{s.name} {shape}")
        text.append(", ".join(parts), "yellow")
        text.append(f"  {format_bytes(node.saved_bytes)}", "dim")
    return text


def tree_lines(graph: Graph, *, max_lines: int | None = None) -> list[Text]:
    """The tree as a list of ``rich.text.Text`` lines (see module docstring)."""
    kids: dict[str, list[str]] = {n.id: [] for n in graph.nodes}
    leaf_of: dict[str, Node] = {}
    for e in graph.edges:
        dst = graph.node(e.dst)
        if dst.kind == "leaf" and graph.node(e.src).kind == "accumulate":
            leaf_of[e.src] = dst
            continue
        kids[e.src].append(e.dst)
    height = _heights(graph, kids)
    lines: list[Text] = []
    shown: set[str] = set()
    merged_leaves = {leaf.id for leaf in leaf_of.values()}
    total = sum(1 for n in graph.nodes if n.id not in merged_leaves)
    starts = list(graph.roots) + [
        n.id for n in graph.nodes if n.kind == "output" and n.id not in graph.roots
    ]
    # task: (node id, line prefix, connector, prefix of the node's own text column)
    stack: list[tuple[str, str, str, str]] = [(r, "", "", "") for r in reversed(starts)]
    while stack:
        if max_lines is not None and len(lines) >= max_lines:
            hidden = total - len(shown)
            if hidden > 0:
                lines.append(Text(f"… {hidden} more nodes not shown (raise --max-lines)", "dim"))
            break
        nid, prefix, conn, col = stack.pop()
        node = graph.node(nid)
        ref = nid in shown
        line = Text(prefix + conn, "dim")
        line.append_text(_label(node, leaf_of.get(nid), ref))
        lines.append(line)
        if ref:
            continue
        shown.add(nid)
        children = kids[nid]
        fresh = [c for c in children if c not in shown]
        main = max(fresh, key=lambda c: height[c], default=None)
        if main is not None and graph.node(main).kind == "accumulate" and len(children) > 1:
            main = None  # keep parameters as side branches so the spine is the data path
        side = [c for c in children if c != main]
        if main is not None:
            stack.append((main, col, "", col))
        for i in range(len(side) - 1, -1, -1):
            last = i == len(side) - 1
            stack.append(
                (side[i], col, "└─ " if last else "├─ ", col + ("   " if last else "│  "))
            )
    return lines


def render_tree(graph: Graph, *, max_lines: int | None = None) -> Group:
    """A rich renderable: a summary line, then the tree (see module docstring).

    Example:
        >>> import torch, gradscope as gs
        >>> from rich.console import Console
        >>> x = torch.ones(2, requires_grad=True)
        >>> Console(width=80).print(gs.render_tree(gs.trace((x * x).sum(), params={"x": x})))
    """
    header = Text(graph.summary(), "dim")
    return Group(header, *tree_lines(graph, max_lines=max_lines))
