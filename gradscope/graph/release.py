"""Free deep autograd graphs without a deep C stack: ``gs.release(outputs)``.

Once Python wrappers of a graph's nodes have existed (any Python walk creates them: ``gs.trace``,
``torchviz``, ``record_backward``), PyTorch frees a long chain recursively when the last
reference to it goes, one C++ stack frame per node, and a chain of some 50,000 nodes overflows
the default 8 MiB stack (SIGSEGV). ``release`` frees it one node at a time instead: it takes a
reference to every node, cuts the outputs' own link to the graph (``detach_()``, which keeps
their values), and drops the node references parents first, so that no node is ever the last
holder of another one still alive. The CLI does this after every command; API users holding
graphs of more than ~30,000 nodes call it themselves (or ``release_nodes`` for nodes they hold).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from .nest import iter_tensors


def topological_nodes(starts: Iterable[Any]) -> list[Any]:
    """Every node reachable from ``starts``, each after all of its parents (reverse post-order
    of an iterative depth-first walk over ``next_functions``)."""
    post: list[Any] = []
    seen: set[Any] = set()
    for root in starts:
        if root is None or root in seen:
            continue
        seen.add(root)
        stack: list[tuple[Any, Any]] = [(root, iter(root.next_functions))]
        while stack:
            fn, it = stack[-1]
            for nxt, _ in it:
                if nxt is not None and nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, iter(nxt.next_functions)))
                    break
            else:
                stack.pop()
                post.append(fn)
    post.reverse()
    return post


def release_nodes(nodes: list[Any]) -> None:
    """Drop the references in ``nodes`` (autograd nodes, parents before children, as
    ``topological_nodes`` gives them) one at a time, first to last; empties the list."""
    nodes.reverse()
    pop = nodes.pop
    while nodes:
        pop()


def release(outputs: Any) -> int:
    """Free the autograd graph behind ``outputs`` node by node, so that even a chain of a
    million nodes is released without recursion.

    The outputs keep their values but lose their ``grad_fn`` (``detach_()``): call it when you
    are done with the graph (after backward, or after ``gs.trace``). A view cannot be detached in
    place; its graph is freed when the view goes, as PyTorch does it.

    Args:
        outputs: a tensor or any nest of tensors (as for ``gs.trace``).

    Returns:
        The number of autograd nodes that were reachable from the outputs.

    Example:
        >>> import torch, gradscope as gs
        >>> x = torch.ones(2, requires_grad=True)
        >>> y = x
        >>> for _ in range(100_000):
        ...     y = y * 1.0
        >>> g = gs.trace(y)
        >>> gs.release(y), y.grad_fn
        (100001, None)
    """
    tensors = [t for _, t in iter_tensors(outputs)]
    nodes = topological_nodes(t.grad_fn for t in tensors)
    count = len(nodes)
    for t in tensors:
        if t.grad_fn is None:
            continue
        try:
            with torch.no_grad():
                t.detach_()
        except RuntimeError:
            pass  # a view: its base holds the graph; it goes with the view
    release_nodes(nodes)
    return count
