"""What the viewer's browser tests share: a headless Chromium (Debian's `chromium`, driven by
playwright pointed at /usr/bin/chromium; scripts/setup-browser.sh installs both), a `Page` that
fails on a page error or on a request for anything but the page itself, and the graphs and
helpers the tests build pages from."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import SAMPLES

import gradscope as gs
from gradscope.render import page_wire

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]
#: A setInterval heartbeat in every page: the longest gap between ticks is the longest stall
#: of the main thread (JavaScript, layout and drawing all block it).
HEARTBEAT = """
window.__gap = 0;
(() => { let last = performance.now();
  setInterval(() => { const t = performance.now(); window.__gap = Math.max(window.__gap, t - last);
                      last = t; }, 10); })();
"""


def traced(sample: str) -> tuple[gs.Graph, object]:
    fwd = gs.load_model_file(SAMPLES / sample).forward()
    return gs.trace(fwd.outputs, model=fwd.model), fwd


def chain(n: int) -> gs.Graph:
    """``n - 3`` multiplications in a row from one leaf: no module structure at all."""
    x = torch.randn(4, requires_grad=True)
    y = x
    for _ in range(n - 3):
        y = y * 1.0001
    return gs.trace(y, params={"x": x})


def embedded_data(page: str) -> dict:
    """The page's data: its header block, with the node and edge blocks joined in order."""
    m = re.search(r'<script type="application/json" id="gs-data">(.*?)</script>', page, re.S)
    assert m, "no embedded graph data"
    data = json.loads(m.group(1))
    blocks = re.findall(r'<script type="application/json" class="gs-part" '
                        r'data-kind="(\w+)">(.*?)</script>', page, re.S)
    data |= page_wire.decode([(kind, json.loads(block)) for kind, block in blocks])
    for kind in ("nodes", "edges"):
        assert len(data[kind]) == data["n_" + kind]
    return data


def launch_browser() -> Iterator[Any]:
    """A headless Chromium for a module's tests (``yield from launch_browser()`` in a fixture);
    skipped where playwright or the browser is missing, failed so on CI."""
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


class Page:
    """One page of the viewer, loaded from a file, with its errors and requests recorded."""

    def __init__(self, browser, path: Path, width: int = 1400, height: int = 900) -> None:
        self.url = path.resolve().as_uri()
        self.page = browser.new_page(viewport={"width": width, "height": height})
        self.page.set_default_timeout(20_000)
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.route("**/*", lambda r: r.continue_() if r.request.url == self.url
                        else r.abort())
        self.page.add_init_script(HEARTBEAT)
        self.page.goto(self.url)
        self.page.wait_for_function("() => window.gradscope !== undefined")
        self.page.evaluate("gradscope.ready")

    def js(self, expr: str, arg=None):
        return self.page.evaluate(expr, arg)

    def close(self) -> None:
        try:
            assert self.errors == [], self.errors
            outside = [u for u in self.requests if u != self.url and not u.startswith("blob:")]
            assert outside == [], f"the page made requests: {outside}"
        finally:
            self.page.close()


#: Overlaps in what is drawn: edges passing through a box (its saved-tensor boxes included; a
#: sample every tenth of each segment), labels over labels, labels over boxes.
OVERLAPS = """() => { const g = gradscope.geometry(); let through = 0, ll = 0, lb = 0;
  const boxes = g.boxes.map((b) => [b[0], b[1], b[2], b[5], b[4]]);  // with saved boxes
  const inside = (x, y, b) => x > b[1] + 1 && x < b[1] + b[3] - 1
    && y > b[2] + 1 && y < b[2] + b[4] - 1;
  for (const e of g.edges) { const hit = new Set(); const p = e.pts;
    for (let q = 0; q + 3 < p.length; q += 2) for (let t = 0.1; t < 1; t += 0.1) {
      const x = p[q] + (p[q + 2] - p[q]) * t, y = p[q + 1] + (p[q + 3] - p[q + 1]) * t;
      boxes.forEach((b, i) => { if (inside(x, y, b)) hit.add(i); }); }
    through += hit.size; }
  const labels = g.edges.map((e) => e.label).filter((l) => l);
  const ov = (a, b) => a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
  labels.forEach((a, i) => { for (let j = i + 1; j < labels.length; j++) if (ov(a, labels[j])) ll++;
    for (const b of boxes) if (ov(a, { x: b[1], y: b[2], w: b[3], h: b[4] })) lb++; });
  return { through, labels: labels.length, label_label: ll, label_box: lb }; }"""
