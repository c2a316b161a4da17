"""The interactive HTML page: self-contained, and working in a real headless Chromium (Debian's
`chromium`, driven by playwright pointed at /usr/bin/chromium; scripts/setup-browser.sh installs
both). The browser test fails on any network request, page error, or a click that does not
expand a cluster."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import SAMPLES

import gradscope as gs

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]


def transformer() -> tuple[gs.Graph, object]:
    fwd = gs.load_model_file(SAMPLES / "transformer.py").forward()
    return gs.trace(fwd.outputs, model=fwd.model), fwd


def embedded_data(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="gs-data">(.*?)</script>', page, re.S)
    assert m, "no embedded graph data"
    return json.loads(m.group(1))


def test_page_is_self_contained() -> None:
    graph, _ = transformer()
    page = graph.to_html(title="t <&>")
    assert page.startswith("<!DOCTYPE html>") and "<title>t &lt;&amp;&gt;</title>" in page
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", page))
    assert urls <= {"http://www.w3.org/2000/svg"}  # an XML namespace name, never fetched
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=", page)
    assert "sourceMappingURL" not in page
    data = embedded_data(page)
    assert [n["id"] for n in data["nodes"]] == [n.id for n in graph.nodes]
    assert len(data["edges"]) == len(graph.edges)
    assert data["modules"]["encoder.layers.1"]["cls"] == "TransformerEncoderLayer"
    assert data["total_bytes"] == graph.saved_bytes()


def test_default_first_view_fits_the_budget() -> None:
    graph, _ = transformer()
    everything = embedded_data(graph.to_html(max_nodes=len(graph.nodes)))
    assert set(everything["expanded"]) == set(everything["modules"])
    small = embedded_data(graph.to_html(max_nodes=20))
    assert set(small["expanded"]) < set(everything["modules"])


def test_save_html(tmp_path: Path) -> None:
    graph, _ = transformer()
    path = graph.save(tmp_path / "g.html")
    assert path.read_text(encoding="utf-8") == graph.to_html()


@pytest.fixture(scope="module")
def browser():
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
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS, headless=True)
        yield b
        b.close()


def test_viewer_in_chromium(browser, tmp_path: Path) -> None:
    graph, fwd = transformer()
    path = graph.save(tmp_path / "g.html", depth=1)
    url = path.resolve().as_uri()
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    page.set_default_timeout(20_000)  # a click that does not expand fails in 20 s, not 30
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.route("**/*", lambda r: r.continue_() if r.request.url == url else r.abort())
    page.goto(url)
    page.wait_for_selector('.node[data-id="box:encoder"]')

    # clicking the collapsed module expands it: its cluster and its layers appear
    assert page.locator('.node[data-id^="box:encoder.layers"]').count() == 0
    shown = page.locator(".node").count()
    page.click('.node[data-id="box:encoder"]')
    page.wait_for_selector('.cluster[data-path="encoder"]')
    layers = page.locator('.node[data-id^="box:encoder.layers."]')
    assert layers.count() == len(fwd.model.encoder.layers)
    assert page.locator('.node[data-id="box:encoder"]').count() == 0
    assert page.locator(".node").count() > shown
    assert "TransformerEncoder" in page.inner_text("#details")

    # clicking the cluster's title collapses it again
    page.click('.cluster[data-path="encoder"] > .title')
    page.wait_for_selector('.node[data-id="box:encoder"]')

    # search by module path reveals a node inside a collapsed module and shows its details
    page.fill("#search", "encoder.layers.1.linear2")
    page.press("#search", "Enter")
    page.wait_for_selector('.cluster[data-path="encoder.layers.1.linear2"]')
    assert page.locator(".node.selected").count() == 1
    assert "encoder.layers.1.linear2" in page.inner_text("#details")

    # details of the head's matmul: saved tensors with bytes, against torch's own saved tensor
    addmm = fwd.outputs.grad_fn.next_functions[0][0]
    mat1 = addmm._saved_mat1
    node = next(n for n in graph.nodes if n.name == "AddmmBackward0" and n.module == "head")
    page.fill("#search", "head")
    page.click(f'#results li[data-id="{node.id}"]')
    page.wait_for_selector(f'.node.selected[data-id="{node.id}"]')
    text = page.inner_text("#details")
    assert "op" in text and "head" in text
    shape = "(" + ", ".join(str(s) for s in mat1.shape) + ")"
    row = page.inner_text("#details table.saved")
    assert f"mat1\t{shape}\tfloat32\t{mat1.numel() * mat1.element_size()} B" in row

    # the wheel zooms
    before = page.get_attribute("#viewport", "transform")
    page.mouse.move(400, 400)
    page.mouse.wheel(0, -300)
    moved = f"document.getElementById('viewport').getAttribute('transform') !== {before!r}"
    page.wait_for_function(moved)

    assert errors == []
    assert requests == [url], f"the page made network requests: {requests[1:]}"
    page.close()
