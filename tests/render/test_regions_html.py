"""A compiled region in the HTML page: a box like a module's, that expands and collapses in a
real headless Chromium (the same set-up as tests/render/test_html.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn

import gradscope as gs

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def compiled_graph() -> gs.Graph:
    torch._dynamo.reset()
    opt = torch.compile(Net(), backend="aot_eager")
    with gs.scopes(opt):
        out = opt(torch.randn(4, 6))
    return gs.trace(out.sum(), model=opt)


def test_region_is_a_module_of_the_page_data():
    from gradscope.render.html import graph_data

    graph = compiled_graph()
    rows = graph_data(graph, depth=1)["containers"]
    region = [r for r in rows if r[0] == "<compiled>"]
    assert [(r[2], r[3]) for r in region] == [("torch.compile region", "m")]
    assert region[0][5] == 1  # at depth 1: closed in the first view of a depth-1 page


def test_region_expands_and_collapses_in_chromium(tmp_path: Path):
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("playwright is not installed; run scripts/setup-browser.sh")
        pytest.skip("playwright is not installed (scripts/setup-browser.sh installs it)")
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail("/usr/bin/chromium is missing; run scripts/setup-browser.sh")
        pytest.skip("/usr/bin/chromium is missing (scripts/setup-browser.sh installs it)")
    graph = compiled_graph()
    region = next(n for n in graph.nodes if n.compiled is not None)
    # an aten op directly in the region (the others sit in its fc1/fc2 modules)
    mm = next(n for n in graph.nodes if n.name.startswith("aten.") and n.module == "<compiled>")
    path = graph.save(tmp_path / "c.html", depth=1)
    url = path.resolve().as_uri()
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            page.set_default_timeout(20_000)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.route("**/*", lambda r: r.continue_() if r.request.url == url else r.abort())
            page.goto(url)
            page.wait_for_function("() => window.gradscope !== undefined")
            page.evaluate("gradscope.ready")
            # closed: one box, none of its aten ops drawn
            box = page.evaluate("gradscope.boxAt('box:<compiled>')")
            assert box and page.evaluate(f"gradscope.boxAt('{mm.id}')") is None
            canvas = page.locator("#graph").bounding_box()
            page.mouse.click(canvas["x"] + box["x"] + 5, canvas["y"] + box["y"] + 5)
            page.wait_for_function(f"() => gradscope.boxAt('{mm.id}') !== null")
            assert page.evaluate(f"gradscope.boxAt('{region.id}')") is not None
            assert page.evaluate("gradscope.boxAt('box:<compiled>.fc1')") is not None
            assert "torch.compile region" in page.evaluate("gradscope.details()")
            page.evaluate("gradscope.collapse('<compiled>')")
            assert page.evaluate(f"gradscope.boxAt('{mm.id}')") is None
        finally:
            browser.close()
    assert errors == []
