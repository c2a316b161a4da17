"""Backward: watching the backward pass (and where the forward made each node).

Modules:
    recorder   ``gs.record_backward``: engine order, the gradient on every edge, the first
               NaN/Inf (capture)
    forward    ``gs.record_forward``: the file, line and code that created each autograd node,
               and non-finite forward outputs (capture)
    annotate   ``gs.trace_backward``: a graph annotated by one backward pass (capture)
    records    ``BackwardTrace``, ``NodeStep``, ``GradStat``, ``NonFinite`` (plain data)
"""
