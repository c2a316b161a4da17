"""The torch-free modules need no torch, and neither do their doctests: their examples build
graphs from plain data. ``scripts/checks.sh`` runs every doctest (``pytest --doctest-modules
gradscope``); here every plain-data and render module (``PLAIN`` and ``RENDER`` of
``tests/test_layers.py``) is imported, and its doctests run, in a Python where torch cannot be
imported, and their examples' imports are held to the layer rule (read with ``ast``; the
``gradscope`` package itself is out too: its names reach capture modules)."""

from __future__ import annotations

import ast
import doctest
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT
from test_layers import PLAIN, RENDER

NO_TORCH_DOCTESTS = """
    import doctest, importlib, sys
    sys.modules["torch"] = None  # any import of torch raises ImportError
    tried = failed = 0
    for name in sys.argv[1:]:
        result = doctest.testmod(importlib.import_module(name))
        tried, failed = tried + result.attempted, failed + result.failed
    print(f"{len(sys.argv) - 1} modules, {tried} examples, {failed} failed")
    sys.exit(1 if failed or not tried else 0)
"""

#: kind -> what its examples may not import (a prefix matches submodules too); a gradscope
#: module that is not torch-free is out too, and so is the package itself
FORBIDDEN = {
    "plain": ("torch", "numpy", "rich", "graphviz"),
    "render": ("torch", "numpy"),
}
MODULES = {"plain": sorted(PLAIN), "render": sorted(RENDER)}


def _torch_free(name: str, kind: str) -> bool:
    return name in PLAIN or (kind == "render" and name in RENDER)


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


def violations(doc: str, kind: str) -> list[str]:
    bad = []
    for name in example_imports(doc):
        if name == "gradscope" or any(
            name == f or name.startswith(f + ".") for f in FORBIDDEN[kind]
        ):
            bad.append(name)
        elif name.startswith("gradscope.") and not _torch_free(name, kind):
            # a torch-free module, or a name imported from one (``from m import Name``)
            if not _torch_free(name.rpartition(".")[0], kind):
                bad.append(name)
    return bad


def test_the_checker_catches_torch_and_the_package() -> None:
    doc = """Example:
        >>> import torch, gradscope as gs
        >>> from gradscope.graph.walk import trace
        >>> from gradscope.graph.graph import Graph
    """
    assert violations(doc, "plain") == ["torch", "gradscope", "gradscope.graph.walk",
                                        "gradscope.graph.walk.trace"]


def _path(module: str) -> Path:
    rel = Path(*module.split("."))
    return ROOT / (rel / "__init__.py" if (ROOT / rel).is_dir() else rel.with_suffix(".py"))


@pytest.mark.parametrize("kind", sorted(FORBIDDEN))
def test_torch_free_modules_have_torch_free_doctests(kind: str) -> None:
    found = 0
    bad = []
    for module in MODULES[kind]:
        path = _path(module)
        for name, doc in docstrings(path.read_text(encoding="utf-8")):
            found += len(doctest.DocTestParser().get_examples(doc))
            bad += [f"{path.relative_to(ROOT)}:{name}: imports {m}"
                    for m in violations(doc, kind)]
    assert found > 0  # the modules do have doctests to hold to the rule
    assert not bad, "\n".join(bad)


def test_torch_free_modules_import_and_pass_their_doctests_without_torch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NO_TORCH_DOCTESTS), *sorted(PLAIN | RENDER)],
        capture_output=True, text=True, cwd="/", timeout=240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith(" examples, 0 failed"), proc.stdout + proc.stderr
