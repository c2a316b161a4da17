"""Every error a user can cause, each with a message that says what happened and how to fix it.

Hierarchy::

    GradscopeError              base class of every error gradscope raises on purpose
    ├── ModelFileError          a model file is missing, fails to import, exits, or has nothing
    │   │                       to render
    │   └── ReportError         the model file cannot be trained by ``gradscope report``
    ├── NoGradError             the outputs carry no autograd graph
    ├── FormatError             an unknown output format, or an option the format does not take
    ├── GraphvizNotFoundError   an image format needs the Graphviz binary, which is missing
    ├── LayoutError             Graphviz failed, or ran past its time limit
    ├── OutputError             an output file could not be written (the old file is kept)
    ├── SchemaError             a JSON document is not a valid gradscope graph
    ├── ViewError               a view (collapse, fold) was asked for with unusable arguments
    ├── ScopesError             ``gs.scopes`` was used in a way it cannot record
    ├── CheckInputError         ``gs.check`` / ``gradscope check`` got inputs it cannot use
    ├── ExplainInputError       ``gs.explain`` got something that is not a strided tensor
    ├── MonitorError            ``GradMonitor`` was given arguments or a set-up it cannot use
    │   └── UnsupportedSetupError   a training set-up it cannot measure (a tensor subclass,
    │                               a DTensor with a Partial placement...)
    ├── MemoryHooksError        saved-tensor hooks could not be installed or removed in order
    ├── BudgetError             a checkpoint budget that cannot be read or reached
    ├── AutogradError           an autograd error in a ``gs.doctor`` block, explained (also a
    │                           ``RuntimeError``; torch's message is its first line)
    └── MissingExtraError       an optional dependency (an extra of the package) is missing

    UserWarning
    ├── GraphLeakWarning        ``leak_check`` found the graph of an earlier step still alive
    └── MonitorWarning          ``GradMonitor`` stopped itself rather than break a training step

The CLI turns each ``GradscopeError`` into one line on stderr and exit code 2.
"""

from __future__ import annotations

from typing import Any


class GradscopeError(Exception):
    """Base class of every error gradscope raises on purpose."""


class ModelFileError(GradscopeError):
    """A model file could not be used (missing, import error, exit, nothing to render)."""


class ReportError(ModelFileError):
    """The model file cannot be trained by ``gradscope report`` (no loss_fn, bad batches...)."""


class NoGradError(GradscopeError):
    """The outputs handed to gradscope have no autograd graph to walk."""


class FormatError(GradscopeError):
    """An output format that gradscope does not know, or an option it does not take."""


class GraphvizNotFoundError(GradscopeError):
    """An image format was asked for but the Graphviz `dot` binary is not installed."""

    def __init__(self, fmt: str) -> None:
        super().__init__(
            f"the Graphviz binary 'dot' is needed for {fmt} output but was not found on PATH; "
            "install it (apt-get install graphviz, or brew install graphviz), "
            "or write DOT text instead with -o graph.dot, which works without it"
        )


class LayoutError(GradscopeError):
    """Graphviz failed to lay out a graph, or ran past its time limit."""


class OutputError(GradscopeError):
    """An output file could not be written; the previous file at that path is unchanged."""


class SchemaError(GradscopeError):
    """A JSON document is not a valid gradscope graph; the message names the JSON path."""


class ViewError(GradscopeError):
    """A view was asked for with arguments it cannot use (a negative depth)."""


class ScopesError(GradscopeError):
    """``scopes`` was used in a way it cannot record (not a module, nested on one model)."""


class CheckInputError(GradscopeError):
    """gs.check was given something it cannot gradcheck."""


class ExplainInputError(GradscopeError):
    """gs.explain was given something that is not a strided tensor with a storage."""


class MonitorError(GradscopeError):
    """GradMonitor was given arguments, or a training set-up, it cannot use."""


class UnsupportedSetupError(MonitorError):
    """A training set-up GradMonitor cannot measure correctly; said when the monitor is built
    or at the first step, never by a wrong figure."""


class MemoryHooksError(GradscopeError):
    """Saved-tensor hooks could not be installed, or were removed out of order."""


class MissingExtraError(GradscopeError):
    """An optional dependency (an extra of the gradscope package) is not installed."""


class AutogradError(GradscopeError, RuntimeError):
    """An autograd error torch raised inside a ``gs.doctor`` block, explained: the first line
    is torch's own message, the next ones the doctor's finding (``.finding``: the ops, lines
    and fix). A ``RuntimeError`` too, so ``except RuntimeError`` code still catches it."""

    def __init__(self, torch_message: str, finding: Any = None) -> None:
        self.torch_message = torch_message
        self.finding = finding
        text = torch_message
        if finding is not None:
            text += f"\ngradscope doctor: {finding.title()}: {finding.message}\nfix: {finding.fix}"
        super().__init__(text)


class GraphLeakWarning(UserWarning):
    """An autograd graph from an earlier training step is still alive."""


class MonitorWarning(UserWarning):
    """GradMonitor hit an unexpected failure in a hook, removed its hooks and let the training
    step go on unmonitored."""


__all__ = [
    "AutogradError",
    "CheckInputError",
    "ExplainInputError",
    "FormatError",
    "GradscopeError",
    "GraphLeakWarning",
    "GraphvizNotFoundError",
    "LayoutError",
    "MemoryHooksError",
    "MissingExtraError",
    "ModelFileError",
    "MonitorError",
    "MonitorWarning",
    "NoGradError",
    "OutputError",
    "ReportError",
    "SchemaError",
    "ScopesError",
    "UnsupportedSetupError",
    "ViewError",
]


class BudgetError(GradscopeError):
    """A checkpoint budget that cannot be read, or that no plan reaches (the message says the
    smallest reachable figure)."""
