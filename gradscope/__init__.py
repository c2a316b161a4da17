"""gradscope: see PyTorch's autograd graph and debug gradients.

Public surface (everything else lives in private ``_modules``)::

    trace(outputs, params=None, *, saved=True, model=None) -> Graph   walk grad_fn graphs
    Graph, Node, Edge, SavedTensor, TensorInfo           the plain-data graph model
    make_dot(var, params=None, ...)                      drop-in for torchviz.make_dot
    render_tree(graph)                                   rich renderable for the terminal
    scopes(model)                                        record which module made each node
    record_backward(outputs), record_forward()           watch the backward pass
    GradMonitor(model, ...)                              gradient statistics while training
    check(fn, *inputs), explain(tensor)                  custom Function checks, tensor internals
    saved_memory(), leak_check()                         memory held by autograd graphs
    load_model_file(spec) -> ModelFile                   the CLI's model-file contract
    GradscopeError and subclasses                        errors whose message says the fix

Heavier parts are imported on first use, so ``import gradscope`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._capture import trace
from ._errors import (
    CheckInputError,
    FormatError,
    GradscopeError,
    GraphvizNotFoundError,
    ModelFileError,
    NoGradError,
)
from ._loader import ModelFile, load_model_file
from ._model import Edge, Graph, Node, SavedTensor, TensorInfo, format_bytes
from ._nest import iter_tensors
from ._output import FORMATS, dot_binary
from ._output import format_for as output_format
from ._render_tree import render_tree
from ._torchviz import make_dot

__version__ = "0.1.0"

# name -> private module that defines it, imported on first attribute access
_LAZY = {
    "scopes": "._scopes",
    "collapse": "._views",
    "fold": "._views",
    "auto_depth": "._views",
    "readable_view": "._views",
    "record_backward": "._backward",
    "record_forward": "._backward",
    "BackwardTrace": "._backward",
    "NodeStep": "._backward",
    "GradStat": "._backward",
    "NonFinite": "._backward",
    "GradMonitor": "._monitor",
    "StepStats": "._monitor",
    "ParamStats": "._monitor",
    "Alert": "._monitor",
    "check": "._check",
    "CheckResult": "._check",
    "CheckFailure": "._check",
    "explain": "._explain",
    "Explanation": "._explain",
    "ExplainInputError": "._explain",
    "saved_memory": "._memory",
    "leak_check": "._memory",
    "MemoryReport": "._memory",
    "SavedMemory": "._memory",
    "LeakCheck": "._memory",
    "Leak": "._memory",
    "LeakStep": "._memory",
    "GraphLeakWarning": "._memory",
    "MemoryHooksError": "._memory",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'gradscope' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "Alert",
    "BackwardTrace",
    "CheckFailure",
    "CheckInputError",
    "CheckResult",
    "Edge",
    "ExplainInputError",
    "Explanation",
    "FORMATS",
    "FormatError",
    "GradMonitor",
    "GradStat",
    "GradscopeError",
    "Graph",
    "GraphLeakWarning",
    "GraphvizNotFoundError",
    "Leak",
    "LeakCheck",
    "LeakStep",
    "MemoryHooksError",
    "MemoryReport",
    "ModelFile",
    "ModelFileError",
    "NoGradError",
    "Node",
    "NodeStep",
    "NonFinite",
    "ParamStats",
    "SavedMemory",
    "SavedTensor",
    "StepStats",
    "TensorInfo",
    "__version__",
    "auto_depth",
    "check",
    "collapse",
    "dot_binary",
    "explain",
    "fold",
    "format_bytes",
    "iter_tensors",
    "leak_check",
    "load_model_file",
    "make_dot",
    "output_format",
    "readable_view",
    "record_backward",
    "record_forward",
    "render_tree",
    "saved_memory",
    "scopes",
    "trace",
]
