"""The public surface is what the design and the documentation say (httpx's
test_exported_members)."""

from __future__ import annotations

import gradscope as gs

DESIGN_NAMES = {
    "trace", "Graph", "Node", "Edge", "SavedTensor", "make_dot", "record_backward",
    "GradMonitor", "check", "scopes", "record_forward", "BackwardTrace", "NodeStep", "GradStat",
    "NonFinite", "StepStats", "ParamStats", "Alert", "CheckResult", "CheckFailure", "explain",
    "saved_memory", "leak_check", "GradscopeError",
}


def test_design_names_are_exported_and_resolve():
    assert DESIGN_NAMES <= set(gs.__all__)
    for name in gs.__all__:
        assert getattr(gs, name) is not None, name


def test_all_is_exactly_the_public_names():
    public = {n for n in dir(gs) if not n.startswith("_")} - {
        "annotations", "importlib", "Any", "TYPE_CHECKING"}
    assert set(gs.__all__) | {"__version__"} >= public - {
        # submodules that importing the lazy names loads
        n for n in public if type(getattr(gs, n)).__name__ == "module"
    }


def test_errors_share_one_base():
    for name in gs.__all__:
        obj = getattr(gs, name)
        if isinstance(obj, type) and issubclass(obj, Exception) and obj is not gs.GradscopeError:
            if not issubclass(obj, Warning):
                assert issubclass(obj, gs.GradscopeError), name


def test_unknown_attribute():
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        gs.nope  # noqa: B018


#: ``gradscope.__all__`` before the package was split into capture/model/views (issue 11):
#: every one of these names must stay importable from ``gradscope``.
BEFORE_THE_LAYOUT = [
    "Alert", "BackwardTrace", "CheckFailure", "CheckInputError", "CheckResult", "Edge",
    "ExplainInputError", "Explanation", "FORMATS", "FormatError", "GradMonitor", "GradStat",
    "GradscopeError", "Graph", "GraphLeakWarning", "GraphvizNotFoundError", "Leak", "LeakCheck",
    "LeakStep", "MemoryHooksError", "MemoryReport", "ModelFile", "ModelFileError", "NoGradError",
    "Node", "NodeStep", "NonFinite", "ParamStats", "SavedMemory", "SavedTensor", "StepStats",
    "TensorInfo", "__version__", "auto_depth", "check", "collapse", "dot_binary", "explain",
    "fold", "format_bytes", "iter_tensors", "leak_check", "load_model_file", "make_dot",
    "output_format", "readable_view", "record_backward", "record_forward", "render_tree",
    "saved_memory", "scopes", "trace",
]


def test_every_name_exported_before_the_layout_still_is():
    missing = [n for n in BEFORE_THE_LAYOUT if n not in gs.__all__]
    assert not missing
    for name in BEFORE_THE_LAYOUT:
        assert getattr(gs, name) is not None
    assert gs.FORMATS == ("dot", "json", "html", "svg", "png", "pdf")


def _docs_api_names() -> set[str]:
    """The names in the first column of the API tables of the user documentation (every
    table headed ``| name | what it does |`` in README.md, docs/*.md and docs/guides/*.md):
    each backticked identifier, with its call signature left off."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md")),
             *sorted((root / "docs" / "guides").glob("*.md"))]
    names: set[str] = set()
    for page in pages:
        in_table = False
        for line in page.read_text(encoding="utf-8").splitlines():
            if re.match(r"^\| name \| what it does \|", line):
                in_table = True
                continue
            if not line.startswith("|"):
                in_table = False
                continue
            if not in_table or line.startswith("| ---"):
                continue
            first = line.split(" | ")[0].lstrip("| ")
            for code in re.findall(r"`([^`]+)`", first):
                m = re.match(r"(?:gs\.)?([A-Za-z_][A-Za-z0-9_]*)", code)
                if m:
                    names.add(m.group(1))
    return names


def test_all_is_sorted_and_equals_the_documented_api_tables():
    """httpx's test_exported_members, both ways: every exported name has a row in an API table
    of the guides (each guide ends with the table of its names), and every name there is
    exported."""
    assert list(gs.__all__) == sorted(gs.__all__)
    documented = _docs_api_names()
    exported = set(gs.__all__) - {"__version__"}
    assert sorted(exported - documented) == [], "exported, but in no API table of the docs"
    assert sorted(documented - exported) == [], "in an API table of the docs, but not exported"
