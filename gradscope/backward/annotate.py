"""A graph annotated by one backward pass: ``gs.trace_backward(outputs)``.

``record_backward`` watches a backward the caller runs; ``trace_backward`` runs it: backward from
every tensor of ``outputs`` that requires a gradient (ones as the gradient of a non-scalar),
under the recorder, and frees the autograd graph afterwards node by node (``gs.release``: a deep
chain released by Python's usual path would overflow the C stack). What ``gradscope render
--backward`` and ``tree --backward`` draw comes from here.
"""

from __future__ import annotations

from typing import Any

import torch

from ..graph.nest import iter_tensors
from ..graph.release import release
from .recorder import record_backward
from .records import BackwardTrace


def trace_backward(
    outputs: Any, *, model: Any = None, params: Any = None, saved: bool = True,
    keep: Any = None, inputs: Any = None,
) -> BackwardTrace:
    """Run backward from ``outputs`` under the recorder; the trace's ``.graph`` is annotated.

    Args:
        outputs: a tensor or any nest of tensors (as for ``gs.trace``); backward starts from
            each one that requires a gradient, with ones as its gradient.
        model: an ``nn.Module`` whose parameter names and module scopes label the graph.
        params: names for leaves (dict of name -> tensor, or an ``nn.Module``).
        saved: record saved tensors in ``.graph`` (as ``gs.trace(saved=True)``).
        keep: more tensors whose graphs are released with ``outputs`` once backward is done
            (the forward's own outputs when ``outputs`` is a loss computed from them).
        inputs: what the forward was given (any nest of tensors), as for ``gs.trace``: saved
            tensors on their storages (and on ``model``'s parameters and buffers) are counted
            with the parameters/inputs by ``.graph.memory()``, not as activations.

    Returns:
        The ``BackwardTrace``: engine order, gradient statistics on every edge, the first
        non-finite node, and ``.graph`` annotated with them.

    Raises:
        RuntimeError: backward itself raised (the recorder's hooks are removed, the graph
            released).

    Example:
        >>> import torch, gradscope as gs
        >>> x = torch.tensor([4.0, -1.0], requires_grad=True)
        >>> rec = gs.trace_backward(x.sqrt(), params={"x": x})
        >>> rec.first_nonfinite.name, x.grad.isnan().tolist()
        ('SqrtBackward0', [False, True])
    """
    try:
        with record_backward(
            outputs, model=model, params=params, saved=saved, inputs=inputs
        ) as rec:
            tensors = [t for _, t in iter_tensors(outputs) if t.requires_grad]
            torch.autograd.backward(tensors, [torch.ones_like(t) for t in tensors])
    finally:
        release((outputs, keep))
    return rec
