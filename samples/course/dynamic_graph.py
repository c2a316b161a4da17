"""Course: the dynamic graph and grad_fn.

c = (a * 3).mean(): a is a leaf (grad_fn None); b's grad_fn is MulBackward0, c's MeanBackward0,
and the grad_fn objects link back to a through next_functions. The graph is rebuilt on every
forward, so Python control flow shapes it: a loop that runs a data-dependent number of times
leaves that many nodes.

    python samples/course/dynamic_graph.py
"""

from __future__ import annotations

import torch
from rich.console import Console

import gradscope as gs


def repeat_until_large(x: torch.Tensor) -> torch.Tensor:
    """Doubles x until its sum exceeds 10: how many MulBackward0 nodes depends on the data."""
    while x.sum() < 10:
        x = x * 2
    return x.sum()


def main() -> dict[str, object]:
    out = Console(width=100, highlight=False)
    a = torch.tensor([2.0, 3.0], requires_grad=True)
    b = a * 3
    c = b.mean()
    for name, t in (("a", a), ("b", b), ("c", c)):
        fn = None if t.grad_fn is None else type(t.grad_fn).__name__
        out.print(f"{name}: requires_grad={t.requires_grad}, is_leaf={t.is_leaf}, grad_fn={fn}")
    graph = gs.trace(c, params={"a": a})
    out.print(gs.render_tree(graph))

    counts = {}
    for start in (0.5, 3.0):
        x = torch.full((2,), start, requires_grad=True)
        g = gs.trace(repeat_until_large(x))
        counts[start] = sum(1 for n in g.nodes if n.name == "MulBackward0")
        out.print(f"start {start}: the loop left {counts[start]} MulBackward0 nodes")
    return {"graph": graph, "mul_nodes": counts}


if __name__ == "__main__":
    main()
