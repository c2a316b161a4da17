"""The doctests of the torch-free layers need no torch: their examples build graphs from plain
data. ``scripts/checks.sh`` runs every doctest (``pytest --doctest-modules gradscope``); here
the doctests of ``gradscope.model`` and ``gradscope.views`` run in a Python where torch cannot
be imported, and their imports are held to the layer rule of ``tests/test_layers.py`` (read
with ``ast``; the ``gradscope`` package itself is out too: its names reach the capture layer)."""

from __future__ import annotations

import ast
import doctest
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

NO_TORCH_DOCTESTS = """
    import doctest, importlib, pkgutil, sys
    sys.modules["torch"] = None  # any import of torch raises ImportError
    import gradscope.model, gradscope.views
    tried = failed = 0
    for pkg in (gradscope.model, gradscope.views):
        for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
            result = doctest.testmod(importlib.import_module(info.name))
            tried, failed = tried + result.attempted, failed + result.failed
    print(f"{tried} examples, {failed} failed")
    sys.exit(1 if failed or not tried else 0)
"""

#: layer -> what its examples may not import (a prefix matches submodules too)
FORBIDDEN = {
    "model": ("torch", "numpy", "rich", "graphviz", "gradscope.capture", "gradscope.views"),
    "views": ("torch", "numpy", "gradscope.capture"),
}


def docstrings(source: str) -> list[tuple[str, str]]:
    """(qualified name, docstring) of a module's source: the module, its classes, functions
    and methods."""
    tree = ast.parse(source)
    out = []
    doc = ast.get_docstring(tree, clean=False)
    if doc:
        out.append(("<module>", doc))

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                doc = ast.get_docstring(child, clean=False)
                if doc:
                    out.append((name, doc))
                visit(child, name + ".")

    visit(tree, "")
    return out


def example_imports(doc: str) -> list[str]:
    """Every module the doctest examples of ``doc`` import (``import a.b``: ``a.b``; ``from a
    import b``: ``a`` and ``a.b``)."""
    names: list[str] = []
    for ex in doctest.DocTestParser().get_examples(doc):
        for node in ast.walk(ast.parse(ex.source)):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.append(node.module)
                names += [f"{node.module}.{a.name}" for a in node.names]
    return names


def violations(doc: str, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for name in example_imports(doc):
        if name == "gradscope" or any(name == f or name.startswith(f + ".") for f in forbidden):
            bad.append(name)
    return bad


def test_the_checker_catches_torch_and_the_package() -> None:
    doc = """Example:
        >>> import torch, gradscope as gs
        >>> from gradscope.capture.walk import trace
        >>> from gradscope.model.graph import Graph
    """
    assert violations(doc, FORBIDDEN["model"]) == ["torch", "gradscope", "gradscope.capture.walk",
                                                   "gradscope.capture.walk.trace"]


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_torch_free_layers_have_torch_free_doctests(layer: str) -> None:
    files = sorted((ROOT / "gradscope" / layer).glob("*.py"))
    found = 0
    bad = []
    for path in files:
        for name, doc in docstrings(path.read_text(encoding="utf-8")):
            found += len(doctest.DocTestParser().get_examples(doc))
            bad += [f"{Path(path).relative_to(ROOT)}:{name}: imports {m}"
                    for m in violations(doc, FORBIDDEN[layer])]
    assert found > 0  # the layer does have doctests to hold to the rule
    assert not bad, "\n".join(bad)


def test_the_doctests_of_model_and_views_pass_without_torch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NO_TORCH_DOCTESTS)],
        capture_output=True, text=True, cwd=ROOT, timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith(" examples, 0 failed"), proc.stdout
