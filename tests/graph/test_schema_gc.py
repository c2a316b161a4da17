"""``Graph.from_json`` pauses the garbage collector while it parses (issue 33 item 3) and must
leave the process's setting as it found it: on success, on a SchemaError, when the caller had
turned the collector off, and (untouched throughout) while another thread runs."""

from __future__ import annotations

import gc
import threading

import pytest

from gradscope.errors import SchemaError
from gradscope.graph.graph import Edge, Graph, Node


def _text() -> str:
    return Graph([Node("n0", "out", "output"), Node("n1", "MulBackward0", "op")],
                 [Edge("n0", "n1")], ["n0"]).to_json()


def test_collector_paused_while_reading_and_put_back() -> None:
    seen: list[bool] = []
    original = Node.__init__

    def spy(self: Node, *args: object, **kwargs: object) -> None:
        seen.append(gc.isenabled())
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    assert gc.isenabled()
    text = _text()
    # paused only when this is the one Python thread (under pytest-xdist, execnet has its own)
    alone = threading.active_count() == 1
    Node.__init__ = spy  # type: ignore[method-assign]
    try:
        g = Graph.from_json(text)
    finally:
        Node.__init__ = original  # type: ignore[method-assign]
    assert [n.id for n in g.nodes] == ["n0", "n1"]
    assert seen == [not alone] * 2  # off while the records were built, if alone
    assert gc.isenabled()


def test_collector_back_on_after_a_schema_error() -> None:
    with pytest.raises(SchemaError):
        Graph.from_json('{"gradscope": 3, "nodes": [{"id": 5}], "edges": [], "roots": []}')
    assert gc.isenabled()
    with pytest.raises(SchemaError):
        Graph.from_json("{not json")
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        Graph.from_json(_text())
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_left_alone_while_another_thread_runs() -> None:
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    seen: list[bool] = []
    original = Node.__init__

    def spy(self: Node, *args: object, **kwargs: object) -> None:
        seen.append(gc.isenabled())
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    text = _text()
    Node.__init__ = spy  # type: ignore[method-assign]
    try:
        Graph.from_json(text)
    finally:
        Node.__init__ = original  # type: ignore[method-assign]
        stop.set()
        worker.join()
    assert seen and all(seen)


def test_graph_memory_pauses_the_collector_too_and_puts_it_back(monkeypatch) -> None:
    """``Graph.memory()`` (model/memory.py) builds a few objects per storage, none freed:
    it runs under the same pause (model/gcpause.py), and leaves the setting as it was."""
    from gradscope.graph.nodes import SavedTensor
    from gradscope.memory import saved_records as memory

    seen: list[bool] = []
    real_add = memory.add_use
    monkeypatch.setattr(memory, "add_use", lambda r, u: seen.append(gc.isenabled())
                        or real_add(r, u))
    g = Graph([Node("n0", "MulBackward0", "op",
                    saved=[SavedTensor("self", [4], "float32", "cpu", 16, "s0")])], [], ["n0"])
    alone = threading.active_count() == 1
    assert g.memory().total == 16
    assert seen == [not alone] and gc.isenabled()
    gc.disable()
    try:
        assert g.memory().total == 16
        assert not gc.isenabled()
    finally:
        gc.enable()
