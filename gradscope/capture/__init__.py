"""Capture: everything that touches live torch objects.

The graph walk (``walk`` with its C part ``_cwalk.c``), module scopes (``scopes``), the backward
and forward recorders (``backward``, ``forward``), the gradient monitor (the package ``monitor``:
``core``, ``checks``, ``measure``, ``stats``, ``distributed``, ``records``), live saved-tensor
accounting and the leak check (``memory``), activation memory and checkpoint plans (``memplan``,
with ``memplan_record`` and ``memplan_measure``), the gradcheck runner (``check``),
``explain``'s measurement (``explain``) and the model-file loader (``loader``). ``torch.compile``
is met in ``compiled`` (reading a compiled region; ``regions`` puts it in a graph) and
``dynamo`` (hooks Dynamo never sees). What gradscope stamps into autograd nodes, and the one
walk over them outside the hot path, are in ``stamps``. Results are the plain records of
``gradscope.model``.
"""
