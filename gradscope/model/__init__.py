"""The model: plain data, no torch, no rendering.

``Graph``/``Node``/``Edge``/``SavedTensor``/``TensorInfo`` (``graph``), their JSON schema
(``schema``), module paths (``paths``), the collapse / fold / auto-depth views (``transforms``,
with ``folding`` and ``regroup``), memory analysis (``memory``), the plain records of the
recorders (``backward``, ``check``, ``explain``, ``monitor``), atomic file output (``files``)
and the registry through which the views are reached (``formats``).
"""
