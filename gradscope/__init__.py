"""gradscope: see PyTorch's autograd graph and debug gradients.

Public surface (``__all__``; everything else is internal)::

    trace(outputs, params=None, *, saved=True, model=None, regions=True) -> Graph
                                                         walk grad_fn graphs (torch.compile
                                                         regions expanded into aten ops)
    Graph, Node, Edge, SavedTensor, TensorInfo, Box, Region   the plain-data graph model
    make_dot(var, params=None, ...)                      drop-in for torchviz.make_dot
    render_tree(graph)                                   rich renderable for the terminal
    scopes(model)                                        record which module made each node
    diff(a, b) -> GraphDiff                              what changed between two graphs
    record_backward(outputs), record_forward()           watch the backward pass
    trace_backward(outputs)                              run backward under the recorder:
                                                         the annotated graph
    release(outputs)                                     free a deep graph without recursion
    GradMonitor(model, ...), Incident                    gradient statistics while training,
                                                         and where a bad step began
    saved_memory(), leak_check()                         memory held by autograd graphs
    activation_report(), plan_checkpoints()              activation memory per module and
                                                         checkpoint plans under a budget
    step_memory(), max_batch()                           the peak memory of a whole step
    doctor(model=None, optimizer=None)                   autograd's errors and silent failures
    check(fn, *inputs), explain(tensor)                  custom Function checks, tensor internals
    record_numerics(model=None) -> NumericsRun           every op's output statistics and sketch
    compare_runs(reference, candidate) -> Divergence     where two runs diverge: the first op
                                                         whose error its inputs do not explain
    trace_divergence(outputs, divergence)                that divergence on the candidate's
                                                         graph page
    load_model_file(spec) -> ModelFile                   the CLI's model-file contract
    FORMATS, format_spec(name) -> OutputFormat           the output formats
    GradscopeError and subclasses                        errors whose message says the fix
                                                         (the hierarchy: gradscope.errors)

The package is one folder per feature; inside each, plain-data records (no torch, rich or
graphviz), capture (torch, never rich or graphviz) and renderers (no torch) are separate
modules, and data flows one way: capture fills the records, renderers draw them.

    _torch/        every read of torch's private internals, behind feature probes
                   (``torchcompat``), the one hook-handle type (``handles``), staying invisible
                   to Dynamo (``dynamo``), what gradscope stamps into autograd nodes (``stamps``)
    graph/         the walk (``walk``, its C part ``_cwalk.c``), module scopes, compiled
                   regions, ``release``; the ``Graph`` model, its JSON schema, collapse and
                   fold views, ``diff``
    render/        DOT, the terminal tree, the HTML page and its assets, Graphviz images, the
                   torchviz drop-in
    backward/      the backward and forward recorders and the ``BackwardTrace`` records
    monitor/       ``GradMonitor`` and its parts, alert rules, incidents and their replay,
                   spikes, the log and its views
    memory/        saved-tensor accounting (``saved``), activations and checkpoint plans
                   (``activations``), the peak of a whole step (``step``)
    doctor/        the autograd doctor: recording, explaining, findings, their view
    numerics/      ``record_numerics`` (per-op sketches of a run), ``compare_runs`` (where two
                   runs diverge), their records and view
    functions/     ``check`` (the gradcheck runner) and ``explain`` (a tensor's internals)
    output/        atomic files and output targets, the format registry, the one colour scale
    integrations/  the Hugging Face ``Trainer`` and Lightning callbacks
    modelfile.py   the model-file contract the CLI loads
    errors.py      every error a user can cause

Each folder's ``__init__`` names its modules and what each owns. ``import gradscope`` imports
no torch (``gradscope --help`` relies on it): the names that need torch are imported on first
use, and type checkers see every name with its real type (the ``TYPE_CHECKING`` imports
below).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# the graph's output formats (no torch), then the record renderers of each feature: importing
# them registers them with the registry (gradscope.output.formats)
from . import render as _render  # noqa: F401
from .doctor import views as _doctor_views  # noqa: F401
from .functions import check_views as _check_views  # noqa: F401
from .functions import explain_views as _explain_views  # noqa: F401
from .memory import activations_views as _activations_views  # noqa: F401
from .memory import saved_views as _saved_views  # noqa: F401
from .memory import step_views as _step_views  # noqa: F401
from .monitor import views as _monitor_views  # noqa: F401
from .numerics import views as _numerics_views  # noqa: F401

if not TYPE_CHECKING:
    # importing the folder gradscope/doctor/ bound the name `doctor` to it: the public name is
    # the function gs.doctor (imported on first use, below), never the folder
    del doctor  # noqa: F821
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
from .graph.graph import (
    Box,
    Edge,
    Graph,
    Node,
    Region,
    SavedTensor,
    TensorInfo,
    format_bytes,
)
from .output.files import output_target
from .output.formats import FormatKind, OutputFormat, format_options
from .output.formats import format_for as output_format
from .output.formats import format_names as _format_names
from .output.formats import get_format as format_spec
from .render.graphviz import dot_binary
from .render.tree import render_tree

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
    from .graph.walk import trace
    from .render.torchviz import dot_from_graph

    # custom Functions' tensors are always drawn; a compiled region stays one node, as in torchviz
    graph = trace(var, params=params, saved=True, regions=False)
    return dot_from_graph(
        graph, show_attrs=show_attrs, show_saved=show_saved, max_attr_chars=max_attr_chars
    )


if TYPE_CHECKING:  # what type checkers see; at run time these are imported on first use
    from .backward.annotate import trace_backward
    from .backward.forward import record_forward
    from .backward.recorder import record_backward
    from .backward.records import BackwardTrace, GradStat, NodeStep, NonFinite
    from .doctor.core import doctor
    from .doctor.findings import Finding
    from .functions.check import check
    from .functions.check_records import CheckFailure, CheckResult
    from .functions.explain import explain
    from .functions.explain_records import Explanation
    from .graph.diff import GraphDiff, diff
    from .graph.nest import iter_tensors
    from .graph.release import release
    from .graph.scopes import scopes
    from .graph.transforms import auto_depth, collapse, fold, readable_view
    from .graph.walk import trace
    from .memory.activations import (
        CheckpointHandle,
        CheckpointPlan,
        activation_report,
        measure_forward,
        plan_checkpoints,
    )
    from .memory.activations_records import ActivationReport, ModuleRow, Verification, parse_size
    from .memory.saved import LeakCheck, SavedMemory, leak_check, saved_memory
    from .memory.saved_records import Leak, LeakStep, MemoryReport
    from .memory.step import max_batch, measure_step, step_memory
    from .memory.step_records import MaxBatch, StepMemory
    from .modelfile import BackwardRun, ModelFile, Training, load_model_file, model_file_path
    from .monitor.core import GradMonitor
    from .monitor.incident import Incident
    from .monitor.log import Alert, MonitorLog, ParamStats, StepStats, Thresholds, read_jsonl
    from .numerics.compare import compare_runs
    from .numerics.page import trace_divergence
    from .numerics.record import record_numerics
    from .numerics.records import Divergence, DivergencePoint, NumericsRun, ParamDiff
    from .output.style import terminal_text


# name -> module that defines it, imported on first attribute access
_LAZY = {
    "trace": ".graph.walk",
    "iter_tensors": ".graph.nest",
    "scopes": ".graph.scopes",
    "release": ".graph.release",
    "collapse": ".graph.transforms",
    "fold": ".graph.transforms",
    "auto_depth": ".graph.transforms",
    "readable_view": ".graph.transforms",
    "diff": ".graph.diff",
    "GraphDiff": ".graph.diff",
    "terminal_text": ".output.style",
    "record_backward": ".backward.recorder",
    "record_forward": ".backward.forward",
    "trace_backward": ".backward.annotate",
    "BackwardTrace": ".backward.records",
    "NodeStep": ".backward.records",
    "GradStat": ".backward.records",
    "NonFinite": ".backward.records",
    "GradMonitor": ".monitor.core",
    "StepStats": ".monitor.log",
    "ParamStats": ".monitor.log",
    "Alert": ".monitor.log",
    "MonitorLog": ".monitor.log",
    "Thresholds": ".monitor.log",
    "read_jsonl": ".monitor.log",
    "Incident": ".monitor.incident",
    "saved_memory": ".memory.saved",
    "leak_check": ".memory.saved",
    "SavedMemory": ".memory.saved",
    "LeakCheck": ".memory.saved",
    "MemoryReport": ".memory.saved_records",
    "Leak": ".memory.saved_records",
    "LeakStep": ".memory.saved_records",
    "activation_report": ".memory.activations",
    "plan_checkpoints": ".memory.activations",
    "measure_forward": ".memory.activations",
    "CheckpointPlan": ".memory.activations",
    "CheckpointHandle": ".memory.activations",
    "ActivationReport": ".memory.activations_records",
    "ModuleRow": ".memory.activations_records",
    "Verification": ".memory.activations_records",
    "parse_size": ".memory.activations_records",
    "step_memory": ".memory.step",
    "max_batch": ".memory.step",
    "measure_step": ".memory.step",
    "StepMemory": ".memory.step_records",
    "MaxBatch": ".memory.step_records",
    "doctor": ".doctor.core",
    "Finding": ".doctor.findings",
    "check": ".functions.check",
    "CheckResult": ".functions.check_records",
    "CheckFailure": ".functions.check_records",
    "explain": ".functions.explain",
    "Explanation": ".functions.explain_records",
    "ModelFile": ".modelfile",
    "load_model_file": ".modelfile",
    "model_file_path": ".modelfile",
    "BackwardRun": ".modelfile",
    "Training": ".modelfile",
    "record_numerics": ".numerics.record",
    "compare_runs": ".numerics.compare",
    "trace_divergence": ".numerics.page",
    "NumericsRun": ".numerics.records",
    "Divergence": ".numerics.records",
    "ParamDiff": ".numerics.records",
    "DivergencePoint": ".numerics.records",
}

if not TYPE_CHECKING:  # hidden from type checkers, so that `gs.trcae` is an error there

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
    "Divergence",
    "DivergencePoint",
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
    "NumericsRun",
    "OutputError",
    "OutputFormat",
    "ParamDiff",
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
    "compare_runs",
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
    "record_numerics",
    "release",
    "render_tree",
    "saved_memory",
    "scopes",
    "step_memory",
    "terminal_text",
    "trace",
    "trace_backward",
    "trace_divergence",
]
