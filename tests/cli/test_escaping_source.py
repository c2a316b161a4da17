"""Every text that reaches a terminal goes through ONE escaping function (issue 29 items 3 and
4, issue 27 item 5): ``gradscope.output.style.terminal_text``, as ``style.cell`` (a ``Text``)
in views and ``common.show``/``note``/``fail`` in the CLI. A ``str`` handed to rich is read as
markup (``[/]`` crashes, ``[link=...]`` makes a hyperlink) and an ESC in it reaches the
terminal, so this reads the source and finds every place a ``str`` could reach rich:

- ``Table.add_row``/``add_column`` cells: a literal or ``cell(...)``;
- ``Table(title=...)``: a literal or ``cell(...)``;
- ``Text(x)`` in a view, ``x`` a call, a name's attribute or an item: an escaper's result;
- ``.print(...)``: never in a view (renderers return, they do not print); in the CLI only
  ``cell(...)``, or inside ``common.show``/``note`` (which escape); no builtin ``print``, no
  ``rich.print``, no ``typer.echo``.

``views/monitor.py`` (the gradient report) escapes its own way (``clean_text``/``clean_rich``,
checked by the monitor's hostile test) and is listed apart here, so that the exception stays
visible until it follows the rule.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_layers import RENDER

ROOT = Path(__file__).resolve().parents[2]
# every render module (tests/test_layers.py names them), wherever its feature's folder is
VIEWS = sorted(
    ROOT / (m.replace(".", "/") + ("/__init__.py" if m == "gradscope.render" else ".py"))
    for m in RENDER
)
CLI = sorted((ROOT / "cli").glob("*.py"))
APART = {"gradscope/monitor/views.py"}
ESCAPERS = {"cell", "terminal_text", "clean_text", "_c", "clean_rich", "_as_text"}
PRINTERS = {
    ("common.py", "show"), ("common.py", "note"),
    # a renderable turned into plain text on a console of its own (no terminal, no markup
    # read from data: what it prints was escaped where it was made)
    ("text.py", "to_text"),
    # a bundled example's source, byte for byte, to stdout (typer.echo reads no markup)
    ("example.py", "example"),
}


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _escaped(node: ast.AST) -> bool:
    """A literal, or what an escaper returned; a starred list is checked where it is made
    (``*cells``: each of its items is a ``cell`` in the source, see ``_starred_ok``)."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.Call) and _name(node.func) in ESCAPERS:
        return True
    if isinstance(node, ast.IfExp):
        return _escaped(node.body) and _escaped(node.orelse)
    return False


def _starred_ok(node: ast.Starred) -> bool:
    value = node.value
    if isinstance(value, (ast.GeneratorExp, ast.ListComp)):
        return _escaped(value.elt)
    return isinstance(value, (ast.Name, ast.Call))  # a list built of cells (checked below)


def _functions(tree: ast.AST) -> dict[ast.AST, str]:
    owner: dict[ast.AST, str] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for sub in ast.walk(fn):
                owner.setdefault(sub, fn.name)
    return owner


def _problems(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    owner = _functions(tree)
    view = path in VIEWS or path.parent.name == "views"  # a render module (or the self-test)
    out = []

    def bad(node: ast.AST, what: str) -> None:
        out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {what}")  # type: ignore[attr-defined]

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "rich":
            if any(a.name == "print" for a in node.names):
                bad(node, "rich.print reads markup")
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        if name in ("add_row", "add_column"):
            args = node.args if name == "add_row" else node.args[:1]
            for arg in args:
                ok = _starred_ok(arg) if isinstance(arg, ast.Starred) else _escaped(arg)
                if not ok:
                    bad(node, f"{name} of a str that is not escaped: {ast.unparse(arg)}")
        if name in ("Table", "grid"):
            for kw in node.keywords:
                if kw.arg in ("title", "caption") and not _escaped(kw.value):
                    bad(node, f"Table {kw.arg}= not escaped: {ast.unparse(kw.value)}")
        if view and name == "Text" and node.args:
            first = node.args[0]
            if isinstance(first, (ast.Call, ast.Attribute, ast.Subscript)) and not _escaped(first):
                bad(node, f"Text of data that is not escaped: {ast.unparse(first)}")
        if name == "print" or (name == "echo" and _name(getattr(node.func, "value", None))
                               in ("typer", "click")):
            if isinstance(node.func, ast.Name):
                bad(node, "the builtin print")
            elif view and (path.name, owner.get(node)) not in PRINTERS:
                bad(node, "a view prints (renderers return a renderable)")
            elif (path.name, owner.get(node)) not in PRINTERS and not (
                    node.args and _escaped(node.args[0])):
                bad(node, f"print of what is not escaped: {ast.unparse(node)}")
    return out


@pytest.mark.parametrize("path", [p for p in VIEWS + CLI
                                  if p.relative_to(ROOT).as_posix() not in APART],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_unescaped_string_reaches_rich(path):
    assert _problems(path) == []


def test_the_rule_finds_what_it_is_for(tmp_path):
    """The checker itself: each way a str reaches rich is found."""
    views = tmp_path / "views"
    views.mkdir()
    src = views / "v.py"
    src.write_text(
        "from rich import print\n"
        "def f(t, name, x):\n"
        "    t.add_row(name, cell(x), 'lit')\n"
        "    t.add_column(x.title)\n"
        "    Table(title=name)\n"
        "    Text(x.name)\n"
        "    console.print(x)\n",
        encoding="utf-8",
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = _problems(src)
    finally:
        ROOT = saved
    assert len(found) == 6, found
    assert any("add_row" in f and ": name" in f for f in found)
    assert not any("cell(x)" in f or "'lit'" in f for f in found)


def test_the_monitor_view_is_the_one_left_apart():
    """Listed so that the exception stays visible (the monitor's owner escapes its table)."""
    assert {p.relative_to(ROOT).as_posix() for p in VIEWS} >= APART
