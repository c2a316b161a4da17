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
