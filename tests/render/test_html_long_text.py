"""A huge string in a graph (issue 29 item 27, the page's part): a 50 MB node name, attribute,
tensor name or source line is cut in the page's data, its full length said, so the page opens
as fast as without it (a 50 MB name drawn and searched whole took the page 40 s to open; one of
words made it crash)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from viewer_page import Page, embedded_data, launch_browser

import gradscope as gs
from gradscope.render.html import to_html
from gradscope.render.page_data import PAGE_TEXT, cut_text

BIG = 50 * 1024 * 1024  # 52,428,800 characters


@pytest.fixture(scope="module")
def browser():
    yield from launch_browser()


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    return []


@pytest.fixture(scope="module")
def huge() -> gs.Graph:
    x = torch.randn(4, requires_grad=True)
    g = gs.trace((x * 2).sum(), params={"x": x})
    op = next(n for n in g.nodes if n.name == "MulBackward0")
    op.name = "ab " * (BIG // 3)  # words: the label wrapper's worst case
    op.attrs = {**op.attrs, "huge": "A" * BIG}
    op.created_at = "model.py:3: " + "B" * BIG
    leaf = next(n for n in g.nodes if n.kind == "leaf")
    assert leaf.tensor is not None
    leaf.tensor.name = "C" * BIG
    return g


def test_every_string_of_the_page_is_cut_with_its_length_said(huge: gs.Graph):
    page = to_html(huge)
    assert len(page) < 1_000_000  # not 4 x 50 MB
    data = embedded_data(page)
    longest = max(len(s) for s in _strings(data))
    assert longest <= PAGE_TEXT + len("… (52,428,800 chars)") + 20, longest
    rows = {r[0]: r for r in data["nodes"]}
    op = next(n for n in huge.nodes if n.attrs.get("huge"))
    name = rows[op.id][1]
    assert name == op.name[:PAGE_TEXT] + f"… ({len(op.name):,} chars)"
    info = rows[op.id][4]
    assert info["a"]["huge"] == "A" * PAGE_TEXT + "… (52,428,800 chars)"
    assert info["at"].endswith(f"… ({len('model.py:3: ') + BIG:,} chars)")
    leaf = next(n for n in huge.nodes if n.kind == "leaf")
    assert rows[leaf.id][4]["t"][0] == "C" * PAGE_TEXT + "… (52,428,800 chars)"


def test_short_strings_are_left_as_they_are():
    assert cut_text("x" * PAGE_TEXT) == "x" * PAGE_TEXT
    assert cut_text(None) is None and cut_text(3) == 3


def test_the_page_opens_quickly_and_shows_the_cut_text(browser, huge: gs.Graph, tmp_path: Path):
    path = huge.save(tmp_path / "huge.html")
    p = Page(browser, path)
    try:
        stats = p.js("gradscope.stats()")
        assert stats["readyMs"] < 5_000, stats  # 40 s before the cut
        op = next(n for n in huge.nodes if n.attrs.get("huge"))
        p.js(f"gradscope.select({op.id!r})")
        details = p.js("gradscope.details()")
        assert "(52,428,800 chars)" in details and len(details) < 10_000
    finally:
        p.close()
