"""Type checkers see the public API: every name of ``gradscope.__all__`` has its real type (not
``Any``), a misspelt name and a wrong keyword are errors, and ``import gradscope`` still imports
no torch (the names are imported under ``TYPE_CHECKING`` beside the lazy ``__getattr__``,
which type checkers do not see).

mypy runs on a user's snippet against the installed package (the wheel in CI), with torch and
the other heavy dependencies skipped (their types become ``Any``): what is checked is
gradscope's own surface, in about a second.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import gradscope as gs

pytest.importorskip("mypy")

CONFIG = """
[mypy]
ignore_missing_imports = True
follow_imports = silent
cache_dir = {cache}
[mypy-torch.*,transformers.*,lightning.*,pytorch_lightning.*,numpy.*,rich.*,graphviz.*,matplotlib.*,tensorboard.*]
follow_imports = skip
"""


def mypy(tmp_path: Path, source: str) -> list[str]:
    (tmp_path / "snippet.py").write_text(textwrap.dedent(source))
    (tmp_path / "mypy.ini").write_text(CONFIG.format(cache=tmp_path / "cache"))
    # an editable install's import hook is not followed by mypy: point it at the checkout; the
    # wheel's site-packages it finds itself (and refuses in MYPYPATH)
    env = dict(os.environ)
    home = Path(gs.__file__).resolve().parent.parent
    if "site-packages" not in home.parts:
        env["MYPYPATH"] = str(home)
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--no-error-summary",
         "snippet.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env,
    )
    return [line for line in proc.stdout.splitlines() if line.startswith("snippet.py")]


def test_a_misspelt_name_and_a_wrong_keyword_are_errors(tmp_path):
    out = mypy(tmp_path, """
        import gradscope as gs

        graph = gs.trcae(None)
        monitor = gs.GradMonitor(None, evry=3)
    """)
    text = "\n".join(out)
    assert re.search(r'snippet.py:4: error: Module has no attribute "trcae"', text), text
    assert re.search(r'snippet.py:5: error: Unexpected keyword argument "evry"', text), text


def test_every_public_name_has_its_real_type(tmp_path):
    names = [n for n in gs.__all__ if n != "__version__"]
    out = mypy(tmp_path, "import gradscope as gs\n" + "".join(
        f"reveal_type(gs.{n})\n" for n in names))
    revealed = [line.split("Revealed type is ", 1)[1] for line in out if "Revealed type" in line]
    assert len(revealed) == len(names), "\n".join(out)
    untyped = [n for n, t in zip(names, revealed) if t.strip('"') == "Any"]
    assert not untyped, f"Any to a type checker: {untyped}"
    errors = [line for line in out if ": error:" in line]
    assert not errors, "\n".join(errors)


def test_import_gradscope_stays_torch_free():
    code = "import sys, gradscope; print('torch' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd="/")
    assert proc.stdout.strip() == "False", proc.stdout + proc.stderr
