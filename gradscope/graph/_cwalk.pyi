"""Types of the compiled walk (``_cwalk.c``), for mypy: the extension has no Python source.
``gradscope.graph.walk`` gives it everything it uses: see the docstrings in ``_cwalk.c``."""

from collections.abc import Callable
from typing import Any

def configure(*layouts_and_helpers: Any) -> None: ...
def walk(
    start: Any,
    nodes: list[Any],
    ids: dict[Any, str],
    raw_edges: list[Any],
    names: dict[int, str],
    storage_ids: dict[int, tuple[str, int]],
    want_saved: bool,
    read_modules: bool,
    record_of: Callable[[Any], tuple[Any, Any]],
    visit_modules: Callable[[Any, Any], None],
    custom_saved: Callable[[Any, Any], None],
    read_saved: Callable[..., None],
    read_saved_seq: Callable[..., None],
    saved_record: Callable[[str, Any], Any],
    shape_of: Callable[[Any], list[int | None]],
) -> None: ...
def make_edges(raw_edges: list[Any], ids: dict[Any, str]) -> list[Any]: ...
def param_names(params: object) -> dict[int, str] | None: ...
