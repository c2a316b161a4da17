"""The public surface is what the design and README say (httpx's test_exported_members)."""

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
    public = {n for n in dir(gs) if not n.startswith("_")} - {"annotations", "importlib", "Any"}
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
