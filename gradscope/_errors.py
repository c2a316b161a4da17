"""Errors a user can cause, each with a message that says what happened and how to fix it.

Hierarchy::

    GradscopeError
    ├── ModelFileError        a model file is missing, fails to import, or has nothing to render
    ├── NoGradError           the outputs carry no autograd graph
    ├── FormatError           an unknown output format was asked for
    ├── GraphvizNotFoundError an image format needs the Graphviz binary, which is missing
    └── CheckInputError       gs.check / gradscope check got inputs it cannot use

The CLI turns each of these into one line on stderr and exit code 2.
"""

from __future__ import annotations


class GradscopeError(Exception):
    """Base class of every error gradscope raises on purpose."""


class ModelFileError(GradscopeError):
    """A model file could not be used (missing, import error, nothing to render)."""


class NoGradError(GradscopeError):
    """The outputs handed to gradscope have no autograd graph to walk."""


class FormatError(GradscopeError):
    """An output format that gradscope does not know."""


class GraphvizNotFoundError(GradscopeError):
    """An image format was asked for but the Graphviz `dot` binary is not installed."""

    def __init__(self, fmt: str) -> None:
        super().__init__(
            f"the Graphviz binary 'dot' is needed for {fmt} output but was not found on PATH; "
            "install it (apt-get install graphviz, or brew install graphviz), "
            "or write DOT text instead with -o graph.dot, which works without it"
        )


class CheckInputError(GradscopeError):
    """gs.check was given something it cannot gradcheck."""
