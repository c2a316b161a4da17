"""The README's Python examples run as written (a feature only in the README does not exist)."""

from __future__ import annotations

import re
import runpy

from conftest import ROOT


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    import pytest

    import gradscope as gs

    if gs.dot_binary() is None:
        pytest.skip("the README saves an SVG, which needs the Graphviz binary")
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    monkeypatch.chdir(tmp_path)
    from gradscope.model import formats

    # the "adding an output format" example registers one: keep the registry as it was
    monkeypatch.setattr(formats, "_FORMATS", dict(formats._FORMATS))
    for i, block in enumerate(blocks):
        path = tmp_path / f"readme_{i}.py"
        path.write_text(block, encoding="utf-8")
        runpy.run_path(str(path), run_name="__main__")
    assert (tmp_path / "mlp.svg").exists() or "graph.save" not in text
    assert "mermaid" in formats._FORMATS  # the example ran
