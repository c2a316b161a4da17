"""Capture: everything that touches live torch objects.

The graph walk (``walk`` with its C part ``_cwalk.c``), module scopes (``scopes``), the backward
and forward recorders (``backward``, ``forward``), the gradient monitor (the package ``monitor``:
``core``, ``checks``, ``measure``, ``stats``, ``distributed``, ``records``), live saved-tensor
accounting and the leak check (``memory``), the gradcheck runner (``check``), ``explain``'s
measurement (``explain``) and the model-file loader (``loader``). What gradscope stamps into
autograd nodes, and the one walk over them outside the hot path, are in ``stamps``. Results are
the plain records of ``gradscope.model``.
"""
