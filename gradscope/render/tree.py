"""The graph as a tree of text lines for the terminal (a ``rich`` renderable).

Layout: the longest path from each output (the "spine") runs down the left at one indent; side
inputs hang off their node with tree guides, and follow the same rule inside. Indentation then
grows with branching, not with depth, so a 1,000-layer chain stays readable. A node reached a
second time is shown once more as a one-line reference (``↺``). A side input that the spine
reaches further down (the skip path of a residual block, ``x`` in ``x + f(x)``) is drawn there,
on the spine, and only named where it joins (``↓ ... (shown below)``): a deep residual stack
reads block by block at one indent, instead of the skip path walking down to the embeddings
before the second block is shown.

A graph annotated by ``gs.record_backward`` also shows the engine's execution order (``#0`` ran
first), the norm of the gradient that flowed into each line's node along the edge drawn
(``‖∇‖``), non-finite gradients in red, and the forward line of the first one.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.text import Text

from ..graph.graph import (
    Edge,
    Graph,
    Node,
    format_bytes,
)
from ..graph.nodes import format_split, plural
from ..output.formats import register_renderer
from ..output.style import (
    cell,
    clean_rich,
    format_norm,
    norm_style,
    size_to_str,
    terminal_text,
)

#: Every string from the graph goes through this before it becomes ``Text`` (which would drop
#: BEL, BS, VT, FF and CR silently): control characters come out as visible escapes, and a
#: string longer than ``style.MAX_SHOWN`` is cut.
_c = terminal_text

STYLES = {
    "output": "bold green",
    "leaf": "cyan",
    "custom": "bold magenta",
    "op": "bold",
    "accumulate": "bold",
    "module": "bold yellow",
}
BAD = "bold red"

#: a line to draw: node id, line prefix, connector, prefix of its text column, the edge into it,
#: whether it only names a node drawn further down, and the spine node the branch it is on
#: hangs off (None on an output's own spine)
_Task = tuple[str, str, str, str, Edge | None, bool, str | None]

#: The nodes the skip-path searches may visit in all, per node of the graph: past it, side
#: inputs are drawn where they are met (the tree stays linear in the graph's size).
_REACH_BUDGET = 16


def _grad_text(edge: Edge | None) -> Text:
    if edge is None or edge.grad_norm is None:
        return Text()
    norm = edge.grad_norm
    return Text.assemble(("  ‖∇‖ ", "dim"), (format_norm(norm), norm_style(norm)))


def _module_text(node: Node) -> Text:
    """A collapsed module box (``Graph.collapse``): path, class, node count, saved bytes
    (activations apart from parameter/input aliases)."""
    text = Text(_c(node.name or node.module or ""), STYLES["module"])
    box = node.box
    cls = box.cls if box is not None else ""
    if cls:
        text.append(f" ({_c(cls)})", "yellow")
    text.append(f" · {plural(box.nodes, 'node') if box is not None else '? nodes'}", "dim")
    if box is not None and box.saved_bytes:  # activations apart from parameter aliases
        text.append(
            f"  saved {format_split(box.activation_bytes, box.leaf_bytes, box.output_bytes)}",
            "dim",
        )
    elif box is None and node.saved_bytes:
        text.append(f"  saved {format_bytes(node.saved_bytes)}", "dim")
    return text


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
        text.append(_c(t_name), STYLES[node.kind])
        text.append(" ")
    if t is not None:
        text.append(size_to_str(t.shape))
        text.append(f" {_c(t.dtype)}", "dim")
    return text


class _Reach:
    """Whether one node is below another, for telling skip paths apart (``x`` in ``x + f(x)``):
    a search that only follows nodes higher than the target (no lower node leads to it), with
    one budget of visits for the whole tree."""

    def __init__(self, kids: dict[str, list[str]], height: dict[str, int]) -> None:
        self.kids, self.height = kids, height
        self.budget = max(10_000, _REACH_BUDGET * len(kids))
        self.parents: dict[str, int] = dict.fromkeys(kids, 0)
        for children in kids.values():
            for kid in children:
                self.parents[kid] += 1

    def __call__(self, start: str | None, target: str) -> bool:
        if start is None or self.budget <= 0:
            return False
        if start == target:
            return True
        if self.parents[target] < 2:  # its one parent is the node being drawn: no skip path
            return False
        floor = self.height[target]
        seen = {start}
        stack = [start]
        while stack:
            nid = stack.pop()
            if nid == target:
                return True
            for kid in self.kids[nid]:
                if kid not in seen and (kid == target or self.height[kid] > floor):
                    self.budget -= 1
                    if self.budget <= 0:
                        return False
                    seen.add(kid)
                    stack.append(kid)
        return False


def _label(node: Node, leaf: Node | None, ref: bool, edge: Edge | None = None,
           below: bool = False) -> Text:
    text = Text()
    if below:
        text.append("↓ ", "dim")
    elif ref:
        text.append("↺ ", "dim")
    if node.order is not None:
        text.append(f"#{node.order} ", "cyan")
    bad = node.nonfinite
    if node.kind == "module":
        text.append_text(_module_text(node))
    elif node.kind in ("output", "leaf"):
        kind = "view base" if node.view_base else node.kind
        text.append(f"{kind} ", STYLES[node.kind])
        text.append_text(_tensor_text(node.name if node.name not in ("", "output") else None, node))
    else:
        text.append(_c(node.name), BAD if bad else STYLES.get(node.kind, ""))
        if node.kind == "custom":
            text.append(" (custom Function)", "magenta")
        if leaf is not None:
            text.append(" ← ")
            text.append_text(_tensor_text(leaf.name or "(unnamed leaf)", leaf))
    text.append(f"  {_c(node.id)}", "dim")
    text.append_text(_grad_text(edge))
    if below:
        text.append(" (shown below)", "dim")
        return text
    if ref:
        text.append(" (shown above)", "dim")
        return text
    if node.forward_nonfinite:
        text.append(f"  ✗ {node.forward_nonfinite} first made here, in the forward", BAD)
    if bad:
        first = node.first_nonfinite
        text.append(f"  ✗ {'first ' if first else ''}{bad} gradient", BAD)
    if node.kind == "module":
        return text
    if node.module:
        text.append(f"  [{_c(node.module)}]", "blue")
    if node.saved:
        text.append("  saved ", "dim")
        parts = []
        for s in node.saved:
            shape = size_to_str(s.shape) if s.shape is not None else ""
            parts.append(
                f"{_c(s.name)} {shape} freed".replace("  ", " ") if s.freed
                else f"{_c(s.name)} {shape}"
            )
        text.append(", ".join(parts), "yellow")
        text.append(f"  {format_bytes(node.saved_bytes)}", "dim")
    return text


def tree_lines(graph: Graph, *, max_lines: int | None = None) -> list[Text]:
    """The tree as a list of ``rich.text.Text`` lines (see module docstring). Every string from
    the graph is text, never markup (``[b]`` stays ``[b]``), with control characters,
    bidirectional marks and lone surrogates written as visible escapes (``\\x1b``)."""
    return [line for line, _ in _tree_lines(graph, max_lines=max_lines)]


def _tree_lines(graph: Graph, *, max_lines: int | None = None) -> list[tuple[Text, str]]:
    """The tree's lines, each with the guides a wrapped continuation of it starts with."""
    kids: dict[str, list[str]] = {n.id: [] for n in graph.nodes}
    kid_edges: dict[str, list[Edge]] = {n.id: [] for n in graph.nodes}
    leaf_of: dict[str, Node] = {}
    for e in graph.edges:
        dst = graph.node(e.dst)
        if dst.kind == "leaf" and graph.node(e.src).kind == "accumulate":
            leaf_of[e.src] = dst
            continue
        kids[e.src].append(e.dst)
        kid_edges[e.src].append(e)
    height = _heights(graph, kids)
    lines: list[tuple[Text, str]] = []
    shown: set[str] = set()
    merged_leaves = {leaf.id for leaf in leaf_of.values()}
    total = sum(1 for n in graph.nodes if n.id not in merged_leaves)
    roots = set(graph.roots)
    starts = list(graph.roots) + [
        n.id for n in graph.nodes if n.kind == "output" and n.id not in roots
    ]
    reach = _Reach(kids, height)
    stack: list[_Task] = [(r, "", "", "", None, False, None) for r in reversed(starts)]
    while stack:
        if max_lines is not None and len(lines) >= max_lines:
            hidden = total - len(shown)
            if hidden > 0:
                more = f"… {plural(hidden, 'more node')} not shown (raise --max-lines)"
                lines.append((cell(more, "dim"), ""))
            break
        nid, prefix, conn, col, edge, later, outer = stack.pop()
        node = graph.node(nid)
        ref = nid in shown
        if ref and edge is None and nid not in roots:
            continue  # a view base (not a root asked for) already drawn under its view
        below = later and not ref
        line = Text(prefix + conn, "dim")
        line.append_text(_label(node, leaf_of.get(nid), ref, edge, below))
        lines.append((clean_rich(line), col + "  "))
        if ref or below:
            continue
        shown.add(nid)
        if node.first_nonfinite and node.created_at:
            where = _c(node.created_at)
            created = Text.assemble((col + "  ↳ created at ", "dim"), (where, BAD))
            lines.append((clean_rich(created), col + "    "))
        stack.extend(_children(graph, nid, col, outer, kid_edges[nid], height, shown, reach))
    return lines


def _children(graph: Graph, nid: str, col: str, outer: str | None, children: list[Edge],
              height: dict[str, int], shown: set[str], reach: _Reach) -> list[_Task]:
    """The tasks for a node's inputs, to push in this order (the last one is drawn first):
    the spine's next node, then the side inputs. An input that a spine further up reaches too
    (a skip path) is only named here, and drawn on that spine."""
    fresh = [e.dst for e in children if e.dst not in shown]
    main = max(fresh, key=lambda c: height[c], default=None)
    if main is not None and graph.node(main).kind == "accumulate" and len(children) > 1:
        main = None  # keep parameters as side branches so the spine is the data path
    edge = next((e for e in children if e.dst == main), None)
    side = [e for e in children if e is not edge]  # a second edge to the spine's node too
    tasks: list[_Task] = []
    if main is not None and edge is not None:
        # on a side branch, the node the spine it hangs off reaches too waits for that spine
        later = graph.node(main).kind != "accumulate" and reach(outer, main)
        tasks.append((main, col, "", col, edge, later, outer))
    spine = main if main is not None else outer
    for i in range(len(side) - 1, -1, -1):
        conn, indent = ("└─ ", "   ") if i == len(side) - 1 else ("├─ ", "│  ")
        dst = side[i].dst
        later = dst not in shown and graph.node(dst).kind != "accumulate" and reach(main, dst)
        tasks.append((dst, col, conn, col + indent, side[i], later, spine))
    return tasks


def _backward_header(graph: Graph) -> Text | None:
    """A line about the recorded backward pass, for graphs annotated by ``gs.record_backward``."""
    ran = [n for n in graph.nodes if n.order is not None]
    if not ran:
        return None
    text = Text(
        f"backward: {plural(len(ran), 'node')} ran (#0 first); ‖∇‖ = norm of the gradient "
        "along each edge",
        "dim",
    )
    origin = next((n for n in graph.nodes if n.forward_nonfinite), None)
    if origin is not None:
        text.append("\nthe forward already produced ", BAD)
        where = f" in {_c(origin.module)}" if origin.module else ""
        text.append(f"{origin.forward_nonfinite} at {_c(origin.name)} ({_c(origin.id)}){where}",
                    BAD)
        if origin.created_at:
            text.append(f", created at {_c(origin.created_at)}", BAD)
    first = next((n for n in graph.nodes if n.first_nonfinite), None)
    if first is not None:
        downstream = ("" if origin is None else ", at that node" if origin.id == first.id
                      else ", downstream of it")
        text.append(f"\nfirst non-finite gradient{downstream}: ", BAD)
        text.append(f"{first.nonfinite or 'nan'} from {_c(first.name)} ({_c(first.id)})", BAD)
        where = _c(first.created_at or "")
        if where:
            text.append(f", created at {where}", BAD)
    return text


def render_tree(graph: Graph, *, max_lines: int | None = None) -> Group:
    """A rich renderable: the summary in two lines (the structure, then the memory), then the
    tree (see module docstring). A line wider than the console wraps at spaces onto lines that
    keep the tree's guides (numbers are never cut), on a terminal or through a pipe; a console
    that soft-wraps (the CLI's, writing to a file with no terminal width to keep) prints each
    line whole.

    Example:
        >>> from rich.console import Console
        >>> from gradscope.graph.graph import Edge, Graph, Node, SavedTensor, TensorInfo
        >>> f32 = ("float32", "cpu")
        >>> x = TensorInfo("x", [2], *f32, storage="s0")
        >>> mul = Node("n1", "MulBackward0", "op", saved=[  # (x * x).sum(): saves x twice
        ...     SavedTensor("self", [2], *f32, 8, "s0"), SavedTensor("other", [2], *f32, 8, "s0")])
        >>> g = Graph(
        ...     [Node("n0", "SumBackward0", "op"), mul, Node("n2", "AccumulateGrad", "accumulate"),
        ...      Node("n3", "x", "leaf", tensor=x)],
        ...     [Edge("n0", "n1"), Edge("n1", "n2", 0), Edge("n1", "n2", 1), Edge("n2", "n3")],
        ...     roots=["n0"])
        >>> Console(width=90).print(render_tree(g))
        4 nodes (2 op, 1 accumulate, 1 leaf), 4 edges
        2 saved tensors holding 8 B params/inputs
        SumBackward0  n0
        MulBackward0  n1  saved self (2), other (2)  16 B
        ├─ AccumulateGrad ← x (2) float32  n2
        └─ ↺ AccumulateGrad ← x (2) float32  n2 (shown above)
    """
    extra = _backward_header(graph)
    # the summary as two lines, structure then memory: one would pass 80 columns on most graphs
    head = [(cell(part, "dim"), "") for part in graph.summary_parts()]
    if extra is not None:
        head += [(clean_rich(line), "") for line in extra.split("\n")]
    return Group(_Wrapped([*head, *_tree_lines(graph, max_lines=max_lines)]))


class _Wrapped:
    """Lines that fit the console: one wider than it is cut at spaces (``Text.wrap``) and its
    continuations start with the guides of its tree column; a soft-wrapping console that is
    not a terminal (a file with no width to keep) gets each line whole."""

    def __init__(self, lines: list[tuple[Text, str]]) -> None:
        self.lines = lines

    def __rich_console__(self, console: Any, options: Any) -> Any:
        width = options.max_width
        wrap = console.is_terminal or not console.soft_wrap
        for line, cont in self.lines:
            if not wrap or line.cell_len <= width:
                yield line
                continue
            yield from _wrap_line(console, line, cont, width)


def _wrap_line(console: Any, line: Text, cont: str, width: int) -> list[Text]:
    start = len(line.plain) - len(line.plain.lstrip(" │├└─"))  # the guides of this line
    if width - len(cont) < 24:  # too narrow to indent: wrap at the full width
        start, cont = 0, ""
    head, body = line[:start], line[start:]
    parts = body.wrap(console, width - max(start, len(cont)), overflow="fold")
    out = []
    for i, part in enumerate(parts):
        part.rstrip()  # the space the line was cut at stays behind, invisible
        lead = head.copy() if i == 0 else Text(cont, "dim")
        lead.append_text(part)
        lead.end = "\n"
        out.append(lead)
    return out


register_renderer("tree", render_tree)
