"""gradscope: see PyTorch's autograd graph and debug gradients.

Public surface (everything else lives in private ``_modules``)::

    trace(outputs, params=None, *, saved=True, model=None, regions=True) -> Graph
                                                         walk grad_fn graphs (torch.compile
                                                         regions expanded into aten ops)
    Graph, Node, Edge, SavedTensor, TensorInfo, Box, Region   the plain-data graph model
    make_dot(var, params=None, ...)                      drop-in for torchviz.make_dot
    render_tree(graph)                                   rich renderable for the terminal
    scopes(model)                                        record which module made each node
    record_backward(outputs), record_forward()           watch the backward pass
    trace_backward(outputs)                              run backward under the recorder:
                                                         the annotated graph
    release(outputs)                                     free a deep graph without recursion
    GradMonitor(model, ...)                              gradient statistics while training
    check(fn, *inputs), explain(tensor)                  custom Function checks, tensor internals
    saved_memory(), leak_check()                         memory held by autograd graphs
    activation_report(), plan_checkpoints()              activation memory per module and
                                                         checkpoint plans under a budget
    load_model_file(spec) -> ModelFile                   the CLI's model-file contract
                                                         (.forward(), .backward(), .training())
    FORMATS, format_spec(name) -> OutputFormat           the output formats: kind, options,
                                                         availability
    GradscopeError and subclasses                        errors whose message says the fix
                                                         (the hierarchy: gradscope.errors)

The package has three layers, and data flows one way: ``gradscope.capture`` (touches torch)
fills the plain data of ``gradscope.model``, which ``gradscope.views`` draws (no torch). The
views register their output formats with the model when ``gradscope`` is imported. Heavier
parts are imported on first use, so ``import gradscope`` stays cheap: it imports no torch
(``gradscope --help`` relies on it); the first name that needs torch (``trace``,
``load_model_file``...) imports it.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import views as _views  # noqa: F401  (registers the output formats; no torch there)
from .errors import (
    AutogradError,
    BudgetError,
    CheckInputError,
    ExplainInputError,
    FormatError,
    GradscopeError,
    GraphLeakWarning,
    GraphvizNotFoundError,
    LayoutError,
    MemoryHooksError,
    MissingExtraError,
    ModelFileError,
    MonitorError,
    MonitorWarning,
    NoGradError,
    OutputError,
    ReportError,
    SchemaError,
    ScopesError,
    UnsupportedSetupError,
    ViewError,
)
from .model.files import output_target
from .model.formats import FormatKind, OutputFormat, format_options
from .model.formats import format_for as output_format
from .model.formats import format_names as _format_names
from .model.formats import get_format as format_spec
from .model.graph import Box, Edge, Graph, Node, Region, SavedTensor, TensorInfo, format_bytes
from .views.graphviz import dot_binary
from .views.tree import render_tree

__version__ = "0.1.0"

#: The output formats ``Graph.save`` and ``gradscope render --format`` take (from the registry).
FORMATS: tuple[str, ...] = _format_names()


def make_dot(
    var: Any,
    params: Any = None,
    show_attrs: bool = False,
    show_saved: bool = False,
    max_attr_chars: int = 50,
) -> Any:
    """Graphviz representation of the autograd graph, as ``torchviz.make_dot`` draws it.

    A drop-in for ``torchviz.make_dot``: the same node labels and colours on every graph
    torchviz can draw, built from the iterative walk, so it also draws what torchviz cannot
    (graphs deeper than the recursion limit, list/dict outputs, freed graphs, custom Functions
    that saved ``None``), with stable node ids (``n0``...).

    Args:
        var: output tensor, or any nest (tuple/list/dict/dataclass) of tensors.
        params: dict of name -> tensor (or an ``nn.Module``) to name the leaf tensors.
        show_attrs: show non-tensor attributes of backward nodes.
        show_saved: draw tensors saved by built-in backward nodes (custom Functions' saved
            tensors are always drawn, as torchviz does).
        max_attr_chars: with ``show_attrs``, truncate attribute values to this many characters.

    Returns:
        A ``graphviz.Digraph``: ``.source`` for DOT text, ``.render()`` / ``.pipe()`` for images.

    Example:
        >>> import torch, gradscope as gs
        >>> x = torch.randn(3, requires_grad=True)
        >>> dot = gs.make_dot((x * 2).sum(), params={"x": x})
        >>> "MulBackward0" in dot.source
        True
    """
    from .capture.walk import trace
    from .views.torchviz import dot_from_graph

    # custom Functions' tensors are always drawn; a compiled region stays one node, as in torchviz
    graph = trace(var, params=params, saved=True, regions=False)
    return dot_from_graph(
        graph, show_attrs=show_attrs, show_saved=show_saved, max_attr_chars=max_attr_chars
    )


# name -> module that defines it, imported on first attribute access
_LAZY = {
    "trace": ".capture.walk",
    "iter_tensors": ".capture.nest",
    "ModelFile": ".capture.loader",
    "load_model_file": ".capture.loader",
    "model_file_path": ".capture.loader",
    "BackwardRun": ".capture.loader",
    "Training": ".capture.loader",
    "trace_backward": ".capture.annotate",
    "scopes": ".capture.scopes",
    "collapse": ".model.transforms",
    "fold": ".model.transforms",
    "auto_depth": ".model.transforms",
    "readable_view": ".model.transforms",
    "terminal_text": ".views.style",
    "record_backward": ".capture.backward",
    "record_forward": ".capture.forward",
    "release": ".capture.release",
    "BackwardTrace": ".model.backward",
    "NodeStep": ".model.backward",
    "GradStat": ".model.backward",
    "NonFinite": ".model.backward",
    "GradMonitor": ".capture.monitor",
    "StepStats": ".model.monitor",
    "ParamStats": ".model.monitor",
    "Alert": ".model.monitor",
    "MonitorLog": ".model.monitor",
    "Thresholds": ".model.monitor",
    "read_jsonl": ".model.monitor",
    "Incident": ".model.incident",
    "check": ".capture.check",
    "CheckResult": ".model.check",
    "CheckFailure": ".model.check",
    "explain": ".capture.explain",
    "Explanation": ".model.explain",
    "saved_memory": ".capture.memory",
    "leak_check": ".capture.memory",
    "MemoryReport": ".model.memory",
    "SavedMemory": ".capture.memory",
    "LeakCheck": ".capture.memory",
    "Leak": ".model.memory",
    "LeakStep": ".model.memory",
    "activation_report": ".capture.memplan",
    "plan_checkpoints": ".capture.memplan",
    "measure_forward": ".capture.memplan",
    "CheckpointPlan": ".capture.memplan",
    "CheckpointHandle": ".capture.memplan",
    "ActivationReport": ".model.memplan",
    "ModuleRow": ".model.memplan",
    "Verification": ".model.memplan",
    "parse_size": ".model.memplan",
    "step_memory": ".capture.step_memory",
    "max_batch": ".capture.step_memory",
    "measure_step": ".capture.step_memory",
    "StepMemory": ".model.step_memory",
    "MaxBatch": ".model.step_memory",
    "diff": ".model.diff",
    "doctor": ".capture.doctor",
    "Finding": ".model.doctor",
    "GraphDiff": ".model.diff",
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
    "ActivationReport",
    "Alert",
    "AutogradError",
    "BackwardRun",
    "BackwardTrace",
    "Box",
    "BudgetError",
    "CheckFailure",
    "CheckInputError",
    "CheckResult",
    "CheckpointHandle",
    "CheckpointPlan",
    "Edge",
    "ExplainInputError",
    "Explanation",
    "FORMATS",
    "Finding",
    "FormatError",
    "FormatKind",
    "GradMonitor",
    "GradStat",
    "GradscopeError",
    "Graph",
    "GraphDiff",
    "GraphLeakWarning",
    "GraphvizNotFoundError",
    "Incident",
    "LayoutError",
    "Leak",
    "LeakCheck",
    "LeakStep",
    "MaxBatch",
    "MemoryHooksError",
    "MemoryReport",
    "MissingExtraError",
    "ModelFile",
    "ModelFileError",
    "ModuleRow",
    "MonitorError",
    "MonitorLog",
    "MonitorWarning",
    "NoGradError",
    "Node",
    "NodeStep",
    "NonFinite",
    "OutputError",
    "OutputFormat",
    "ParamStats",
    "Region",
    "ReportError",
    "SavedMemory",
    "SavedTensor",
    "SchemaError",
    "ScopesError",
    "StepMemory",
    "StepStats",
    "TensorInfo",
    "Thresholds",
    "Training",
    "UnsupportedSetupError",
    "Verification",
    "ViewError",
    "__version__",
    "activation_report",
    "auto_depth",
    "check",
    "collapse",
    "diff",
    "doctor",
    "dot_binary",
    "explain",
    "fold",
    "format_bytes",
    "format_options",
    "format_spec",
    "iter_tensors",
    "leak_check",
    "load_model_file",
    "make_dot",
    "max_batch",
    "measure_forward",
    "measure_step",
    "model_file_path",
    "output_format",
    "output_target",
    "parse_size",
    "plan_checkpoints",
    "read_jsonl",
    "readable_view",
    "record_backward",
    "record_forward",
    "release",
    "render_tree",
    "saved_memory",
    "scopes",
    "step_memory",
    "terminal_text",
    "trace",
    "trace_backward",
]
