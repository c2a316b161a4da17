"""The architecture, read from the source: the layer rule per module, and no import cycles.

gradscope is one folder per feature (``graph``, ``render``, ``backward``, ``monitor``,
``memory``, ``doctor``, ``functions``, ``output``, ``_torch``, ``integrations``). Inside each
feature every module is of one of three kinds, named here module by module (``PLAIN`` and
``RENDER``; every other module is capture), and the rule is per module, not per folder:

- a **plain-data** module (records, findings, logs, schemas, alert rules) imports none of
  torch, numpy, rich, graphviz, matplotlib, and no capture or render module;
- a **render** module imports no torch and no capture module;
- a **capture** module imports neither rich nor graphviz nor matplotlib nor a render module.

Every ``import`` and ``from ... import`` is read with ``ast`` (imports inside functions
included), relative imports resolved to module names. The CLI reaches gradscope only through
its public package (``import gradscope``). The graph of imports among gradscope's modules has no
cycle, imports under ``if TYPE_CHECKING:`` counted too (they do not run, but a module that names
another's class only for its types still depends on it). No module imports a ``_private`` name
from another folder. No folder holds more than a quarter of the package's lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "gradscope"
CLI = ROOT / "cli"

#: plain-data modules: no torch, numpy, rich, graphviz, matplotlib; no capture or render module
PLAIN = frozenset({
    "gradscope.errors",
    "gradscope.backward.records",
    "gradscope.doctor.findings",
    "gradscope.functions.check_records",
    "gradscope.functions.explain_records",
    "gradscope.graph.diff",
    "gradscope.graph.folding",
    "gradscope.graph.gcpause",
    "gradscope.graph.graph",
    "gradscope.graph.nodes",
    "gradscope.graph.paths",
    "gradscope.graph.regroup",
    "gradscope.graph.schema",
    "gradscope.graph.schema_write",
    "gradscope.graph.transforms",
    "gradscope.memory.activations_records",
    "gradscope.memory.activations_types",
    "gradscope.memory.saved_records",
    "gradscope.memory.step_records",
    "gradscope.monitor.alerts",
    "gradscope.monitor.incident",
    "gradscope.monitor.log",
    "gradscope.monitor.spikes",
    "gradscope.numerics.compare",
    "gradscope.numerics.records",
    "gradscope.output.envelope",
    "gradscope.output.files",
    "gradscope.output.formats",
})

#: render modules: draw records and graphs; no torch, no capture module
RENDER = frozenset({
    "gradscope.doctor.views",
    "gradscope.functions.check_views",
    "gradscope.functions.explain_views",
    "gradscope.memory.activations_views",
    "gradscope.memory.saved_views",
    "gradscope.memory.step_views",
    "gradscope.monitor.views",
    "gradscope.numerics.views",
    "gradscope.output.plots",
    "gradscope.output.style",
    "gradscope.render",
    "gradscope.render.containers",
    "gradscope.render.diff_page",
    "gradscope.render.dot",
    "gradscope.render.dot_clusters",
    "gradscope.render.dot_legend",
    "gradscope.render.dot_nodes",
    "gradscope.render.dot_tokens",
    "gradscope.render.graphviz",
    "gradscope.render.html",
    "gradscope.render.json_text",
    "gradscope.render.page_data",
    "gradscope.render.page_wire",
    "gradscope.render.text",
    "gradscope.render.torchviz",
    "gradscope.render.tree",
})

DRAWING = ("rich", "graphviz", "matplotlib")


def kind(mod: str) -> str:
    """``plain``, ``render`` or ``capture``: the kind of a module of the package."""
    if mod in PLAIN:
        return "plain"
    if mod in RENDER:
        return "render"
    return "capture"


def forbidden(mod: str, target: str) -> str | None:
    """Why ``mod`` may not import ``target`` (None when it may)."""
    top = target.split(".")[0]
    k = kind(mod)
    if k == "plain":
        if top in ("torch", "numpy", *DRAWING):
            return f"a plain-data module imports no {top}"
    elif k == "render":
        if top == "torch":
            return "a render module imports no torch"
    elif top in DRAWING:
        return f"a capture module imports no {top}"
    if not target.startswith("gradscope.") or not _exists(target) or _is_package(target):
        return None
    tk = kind(target)
    if k == "plain" and tk != "plain":
        return f"a plain-data module imports no {tk} module"
    if k == "render" and tk == "capture":
        return "a render module imports no capture module"
    if k == "capture" and tk == "render":
        return "a capture module imports no render module"
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(path: Path) -> list[tuple[str, bool]]:
    """(imported module, only under TYPE_CHECKING) for every import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, typing_only: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.body:
                    visit_stmt(stmt, True)
                for stmt in child.orelse:
                    visit_stmt(stmt, typing_only)
                continue
            visit_stmt(child, typing_only)

    def visit_stmt(node: ast.AST, typing_only: bool) -> None:
        if isinstance(node, ast.Import):
            out.extend((alias.name, typing_only) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((target, typing_only))
            # `from . import x` / `from .pkg import mod` may name modules: record them too
            for alias in node.names:
                candidate = f"{target}.{alias.name}"
                if _exists(candidate):
                    out.append((candidate, typing_only))
        visit(node, typing_only)

    visit(tree, False)
    return out


def _exists(mod: str) -> bool:
    rel = Path(*mod.split("."))
    return (ROOT / rel).with_suffix(".py").exists() or (ROOT / rel / "__init__.py").exists()


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _is_package(mod: str) -> bool:
    return (ROOT / Path(*mod.split(".")) / "__init__.py").exists()


def test_layer_rule():
    problems = []
    for path in sources():
        mod = module_name(path)
        if path.name == "__init__.py" and mod != "gradscope.render":
            continue  # a folder's __init__ is its map (gradscope's own imports lazily)
        for target, _ in imports(path):
            why = forbidden(mod, target)
            if why:
                problems.append(f"{mod} ({kind(mod)}) imports {target}: {why}")
    assert not problems, "\n".join(problems)


def test_every_listed_module_exists():
    for mod in PLAIN | RENDER:
        assert _exists(mod), f"{mod} is listed in tests/test_layers.py but does not exist"


def test_the_rule_is_per_module():
    """The checker itself: the same folder holds modules of each kind."""
    assert kind("gradscope.monitor.log") == "plain"
    assert kind("gradscope.monitor.views") == "render"
    assert kind("gradscope.monitor.core") == "capture"
    assert forbidden("gradscope.monitor.log", "torch")
    assert forbidden("gradscope.monitor.log", "gradscope.monitor.core")
    assert forbidden("gradscope.monitor.views", "gradscope.monitor.core")
    assert forbidden("gradscope.monitor.core", "gradscope.monitor.views")
    assert forbidden("gradscope.monitor.core", "rich.table")
    assert not forbidden("gradscope.monitor.core", "gradscope.monitor.log")
    assert not forbidden("gradscope.monitor.views", "gradscope.monitor.log")


def test_the_rule_reads_imports_inside_functions(tmp_path, monkeypatch):
    """The checker itself: an import hidden in a function body is found."""
    f = PACKAGE / "graph" / "graph.py"
    found = [t for t, _ in imports(f)]
    assert "gradscope.graph.schema" in found and "gradscope.graph.nodes" in found
    src = "def f():\n    import torch\n    from ..render import dot\n"
    fake = tmp_path / "gradscope" / "graph" / "fake.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(src)
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert ("torch", False) in imports(fake)
    assert ("gradscope.render", False) in imports(fake)


def test_cli_uses_only_the_public_package():
    for path in sorted(CLI.rglob("*.py")):
        for target, _ in imports_of_cli(path):
            assert not target.startswith("gradscope."), f"{path.name} imports {target}"


def imports_of_cli(path: Path) -> list[tuple[str, bool]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, False) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            out.append((node.module or "", False))
    return out


#: typing-only edges that still close a cycle, each waiting for its owner to remove it (the
#: test below fails once one is gone, so the list cannot go stale); none left
KNOWN_TYPING_CYCLES: set[tuple[str, str]] = set()


def test_no_import_cycles():
    graph: dict[str, set[str]] = {}
    for path in sources():
        mod = module_name(path)
        deps = set()
        for target, typing_only in imports(path):
            if not target.startswith("gradscope"):
                continue
            if typing_only and (mod, target) in KNOWN_TYPING_CYCLES:
                continue
            if _exists(target) and target != mod:
                deps.add(target)
        graph[mod] = deps
    # a package's __init__ runs before its submodules: importing gradscope.x.y depends on
    # gradscope.x too, but that edge is implicit; only explicit imports form cycles here
    state: dict[str, int] = {}
    cycles = []
    for start in graph:
        if state.get(start):
            continue
        stack = [(start, iter(sorted(graph[start])))]
        state[start] = 1
        path = [start]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                state[node] = 2
                continue
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif not state.get(nxt) and nxt in graph:
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(sorted(graph[nxt]))))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_known_typing_cycles_are_still_there():
    for mod, target in KNOWN_TYPING_CYCLES:
        path = ROOT / (mod.replace(".", "/") + ".py")
        assert path.exists() and (target, True) in imports(path), (
            f"{mod} no longer imports {target} for its types: drop it from KNOWN_TYPING_CYCLES"
        )


def test_type_checking_imports_are_edges_of_the_cycle_check(tmp_path, monkeypatch):
    """The checker itself: an import under ``if TYPE_CHECKING:`` is read (and marked)."""
    fake = tmp_path / "gradscope" / "graph" / "fake.py"
    fake.parent.mkdir(parents=True)
    fake.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import walk\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", tmp_path)
    assert ("gradscope.graph", True) in imports(fake)


def test_every_exception_class_lives_in_errors():
    """One module holds the hierarchy (as httpx does); every class is exported."""
    import gradscope as gs

    for path in sources():
        if path.name == "errors.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                bases = {getattr(b, "id", getattr(b, "attr", "")) for b in node.bases}
                assert not any(b.endswith(("Error", "Exception", "Warning")) for b in bases), (
                    f"{path.relative_to(ROOT)} defines {node.name}; exceptions live in "
                    "gradscope/errors.py"
                )
    from gradscope import errors

    for name in errors.__all__:
        assert getattr(gs, name) is getattr(errors, name), name
        assert name in errors.__doc__, f"{name} is missing from the hierarchy in the docstring"


def _folder(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return rel.parts[0] if len(rel.parts) > 1 else "(top level)"


def test_no_folder_holds_more_than_a_quarter_of_the_package():
    lines: dict[str, int] = {}
    for path in sources():
        n = len(path.read_text(encoding="utf-8").splitlines())
        lines[_folder(path)] = lines.get(_folder(path), 0) + n
    total = sum(lines.values())
    big = {k: f"{v / total:.0%}" for k, v in lines.items() if v > total / 4}
    assert not big, f"folders over a quarter of {total} lines: {big}"


def test_no_private_name_crosses_a_folder():
    """``from gradscope.x.y import _name`` only from inside the folder ``x``."""
    problems = []
    for path in sources():
        mod = module_name(path)
        folder = _folder(path)
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("gradscope."):
                continue
            parts = target.split(".")
            target_folder = parts[1] if _is_package(".".join(parts[:2])) else "(top level)"
            if target_folder == folder:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not _exists(f"{target}.{alias.name}"):
                    problems.append(f"{mod} imports {target}.{alias.name}")
    assert not problems, "private names imported across folders:\n" + "\n".join(problems)


def test_every_module_is_named_in_its_folders_map():
    """Each folder's ``__init__`` docstring names every module of the folder."""
    missing = []
    for init in sorted(PACKAGE.rglob("__init__.py")):
        folder = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        for path in sorted(folder.glob("*.py")):
            if path.name != "__init__.py" and path.stem not in doc:
                missing.append(f"{path.relative_to(ROOT)} is not named in {init.relative_to(ROOT)}")
    top = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8")))
    for child in sorted(PACKAGE.iterdir()):
        if child.is_dir() and (child / "__init__.py").exists() and f"{child.name}/" not in top:
            missing.append(f"gradscope/{child.name}/ is not named in gradscope/__init__.py")
        elif child.suffix == ".py" and child.name != "__init__.py" and child.name not in top:
            missing.append(f"gradscope/{child.name} is not named in gradscope/__init__.py")
    assert not missing, "\n".join(missing)
