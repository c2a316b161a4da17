"""Every example in the documentation runs: README.md and docs/**/*.md.

* ```` ```python ```` blocks run per page, in order, in one namespace, in a process of their
  own started in the repository root (``samples/`` paths work); ```` ```python skip ```` is not
  run. A ```` ```text ```` block right after one is the stdout it must print (whitespace
  normalised and ``...`` matching anything, as doctest's NORMALIZE_WHITESPACE and ELLIPSIS).
* ```` ```console ```` lines ``$ gradscope ...`` run as a subprocess (the installed ``gradscope``,
  ``COLUMNS=80``); the lines after one, up to the next ``$``, are its output (stdout and stderr),
  compared the same way. ``# exit N`` at the end of the ``$`` line is the exit code (default 0).
* docs/reference/api.md has an entry for every name of ``gradscope.__all__``.
* Every relative link points at a file that exists (or at a picture docs/hooks.py draws).

Pages are found, not listed: a page not written yet has no test.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [p for p in [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))] if p.is_file()]
GRADSCOPE = Path(sys.executable).parent / "gradscope"


def page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def blocks(page: Path) -> list[tuple[str, str, int, bool]]:
    """The fenced blocks of a page: (info string, body, line number, follows the block before
    it with nothing but blank lines between)."""
    found, lines, i, last_end = [], page.read_text(encoding="utf-8").splitlines(), 0, -2
    while i < len(lines):
        m = re.match(r"^(\s*)(`{3,}|~{3,})(.*)$", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.groups()
        start, i, body = i, i + 1, []
        while i < len(lines) and not re.match(rf"^\s*{fence}[`~]*\s*$", lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        adjacent = all(not s.strip() for s in lines[last_end + 1:start])
        found.append((info.strip(), "\n".join(body) + "\n", start + 1, adjacent))
        last_end, i = i, i + 1
    return found


def prose(page: Path) -> str:
    """The page without its fenced blocks."""
    kept, fence = [], None
    for text in page.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^\s*(`{3,}|~{3,})", text)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and re.match(rf"^\s*{fence}[`~]*\s*$", text):
            fence = None
        elif fence is None:
            kept.append(text)
    return "\n".join(kept)


def python_examples(page: Path) -> list[tuple[str, int, str | None]]:
    """(source, line, expected stdout or None) of each ```python block to run."""
    bs, out = blocks(page), []
    for k, (info, body, line, _) in enumerate(bs):
        if info.split()[:1] == ["python"] and "skip" not in info.split()[1:]:
            nxt = bs[k + 1] if k + 1 < len(bs) else None
            expected = nxt[1] if nxt and nxt[0] == "text" and nxt[3] else None
            out.append((body, line, expected))
    return out


def console_examples(page: Path) -> list[tuple[str, int, int, str]]:
    """(command, line, exit code, expected output) of each ``$ gradscope`` line."""
    out = []
    for info, body, line, _ in blocks(page):
        if info.split()[:1] != ["console"]:
            continue
        current = None
        for n, text in enumerate(body.splitlines()):
            if text.startswith("$ "):
                current = None
                if text.startswith("$ gradscope "):
                    m = re.match(r"^\$ (.*?)(?:\s+#\s*exit\s+(\d+))?\s*$", text)
                    current = [m.group(1), line + 1 + n, int(m.group(2) or 0), []]
                    out.append(current)
            elif current is not None:
                current[3].append(text)
    return [(c, n, code, "\n".join(lines)) for c, n, code, lines in out]


def matches(expected: str, got: str) -> bool:
    """Whitespace-normalised comparison (doctest's NORMALIZE_WHITESPACE: any run of spaces and
    newlines is one space, so a line wrapped at another width matches) where ``...`` stands for
    anything (ELLIPSIS)."""
    regex, words = "", expected.split()
    for k, word in enumerate(words):
        if k:  # a lone ``...`` may also stand for no text at all
            regex += r"\s*" if "..." in (word, words[k - 1]) else r"\s+"
        regex += ".*?".join(re.escape(part) for part in word.split("..."))
    return re.fullmatch(rf"\s*{regex}\s*", got, re.DOTALL) is not None


def _pages_with(find) -> list:
    return [pytest.param(p, id=page_id(p)) for p in PAGES if find(p)]


#: Runs a page's blocks in order in one namespace (the script's own ``__main__``), each block's
#: stdout captured, and writes [{"stdout", "error"}, ...] as JSON to the file named by argv[1].
RUNNER = """
import contextlib, io, json, sys, traceback
results, namespace = [], sys.modules["__main__"].__dict__
for source, name in json.load(sys.stdin):
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(source, name, "exec"), namespace)
        results.append({"stdout": out.getvalue(), "error": None})
    except BaseException:
        results.append({"stdout": out.getvalue(), "error": traceback.format_exc()})
        break
with open(sys.argv[1], "w", encoding="utf-8") as f:
    json.dump(results, f)
"""
ENV = {**os.environ, "COLUMNS": "80", "PYTHONSAFEPATH": "1"}


@pytest.mark.parametrize("page", _pages_with(python_examples))
def test_python_examples(page: Path, tmp_path: Path) -> None:
    """A page's examples run in a process of their own, as a user's script would: what they
    change (seeds, registered formats, torch settings) stays there."""
    examples = python_examples(page)
    blocks_in = [(source, f"{page_id(page)}:{line}") for source, line, _ in examples]
    results = tmp_path / "results.json"
    run = subprocess.run([sys.executable, "-c", RUNNER, str(results)], cwd=ROOT, env=ENV,
                         input=json.dumps(blocks_in), capture_output=True, text=True,
                         timeout=300)
    assert results.is_file(), f"{page_id(page)}: the runner failed\n{run.stderr}"
    for (_, line, expected), result in zip(examples, json.loads(results.read_text())):
        where = f"{page_id(page)}:{line}"
        assert result["error"] is None, f"{where}: the block raised\n{result['error']}"
        if expected is not None:
            assert matches(expected, result["stdout"]), (
                f"{where}: the block printed\n{result['stdout']}\ninstead of\n{expected}"
            )


@pytest.mark.parametrize("page", _pages_with(console_examples))
def test_console_examples(page: Path) -> None:
    for command, line, code, expected in console_examples(page):
        argv = [str(GRADSCOPE), *shlex.split(command)[1:]]
        run = subprocess.run(argv, cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=120)
        where = f"{page_id(page)}:{line}: $ {command}"
        assert run.returncode == code, f"{where}: exit {run.returncode}\n{run.stdout}"
        assert matches(expected, run.stdout), (
            f"{where}: printed\n{run.stdout}\ninstead of\n{expected}"
        )


def _resolve(path: str) -> object:
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(path)


def test_api_reference_names_every_public_name() -> None:
    import gradscope as gs

    api = DOCS / "reference" / "api.md"
    entries = re.findall(r"^::: ([\w.]+)", api.read_text(encoding="utf-8"), re.MULTILINE)
    documented = {path.rsplit(".", 1)[-1]: _resolve(path) for path in entries}
    missing = [n for n in gs.__all__ if n not in documented]
    assert not missing, f"docs/reference/api.md has no ::: entry for {missing}"
    wrong = [n for n in gs.__all__ if documented[n] is not getattr(gs, n)]
    assert not wrong, f"docs/reference/api.md documents other objects as {wrong}"


def _generated_pictures() -> set[str]:
    """The docs-relative paths of the pictures docs/hooks.py draws (read, not imported: the
    hook needs mkdocs)."""
    for node in ast.parse((DOCS / "hooks.py").read_text(encoding="utf-8")).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "PICTURES":
            return set(ast.literal_eval(node.value))
    raise AssertionError("docs/hooks.py has no PICTURES")


def test_relative_links_point_at_files() -> None:
    pictures = {(DOCS / p).resolve() for p in _generated_pictures()}
    broken = []
    for page in PAGES:
        text = re.sub(r"`[^`\n]*`", "", prose(page))  # links inside code are not links
        for target in re.findall(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)", text):
            if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", target):
                continue  # a URL, an anchor on the same page, or site-absolute
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists() and path not in pictures:
                broken.append(f"{page_id(page)}: {target}")
    assert not broken, "links to missing files:\n" + "\n".join(broken)
