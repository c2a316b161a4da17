"""A compiled region in the HTML page: a box like a module's, that expands and collapses in a
real headless Chromium (the same set-up as tests/test_html.py)."""

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
    graph = compiled_graph()
    import json
    import re

    page = graph.to_html(depth=1)
    data = json.loads(re.search(r'id="gs-data">(.*?)</script>', page, re.S).group(1))
    assert data["modules"]["<compiled>"]["cls"] == "torch.compile region"
    assert "<compiled>" not in data["expanded"]


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
            box = '.node[data-id="box:<compiled>"]'
            page.wait_for_selector(box)
            assert page.locator(".node", has_text="aten.mm.default").count() == 0
            page.click(box)
            page.wait_for_selector('.cluster[data-path="<compiled>"]')
            assert page.locator(f'.node[data-id="{region.id}"]').count() == 1
            assert "torch.compile region" in page.inner_text("#details")
            page.click('.cluster[data-path="<compiled>"] > .title')
            page.wait_for_selector(box)
        finally:
            browser.close()
    assert errors == []
