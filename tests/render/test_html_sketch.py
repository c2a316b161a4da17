"""The page under ``chromium --headless --screenshot`` past the quick first view (issue 27
item 5): a graph of up to 10,000 nodes whose first view is too big for dagre in the load task is
drawn there from a sketch (``layout.js`` ``sketch``: ranks by longest path, one pass), then laid
out for real; so the picture Chromium takes at load is not blank. Tested with the real binary,
as a documentation pipeline runs it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from viewer_page import CHROMIUM, Page, chain, launch_browser

import gradscope as gs


@pytest.fixture(scope="module")
def browser():
    yield from launch_browser()


def _layers(blocks: int) -> gs.Graph:
    """``blocks`` x (Linear(4, 4), ReLU) in modules: 7 nodes a block."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
                                for _ in range(blocks)])
    with gs.scopes(net):
        out = net(torch.randn(2, 4))
    return gs.trace(out, model=net)


def screenshot(page: Path, out: Path) -> tuple[int, int, list[bytes]]:
    """``chromium --headless --screenshot --window-size=1200,800 page.html``, nothing that waits
    (``--no-sandbox`` only because the tests may run as root)."""
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is missing (scripts/setup-browser.sh installs it)")
    subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", f"--screenshot={out}",
         "--window-size=1200,800", page.resolve().as_uri()],
        capture_output=True, timeout=60, cwd=out.parent, check=False)
    assert out.exists(), "chromium wrote no screenshot"
    image = pytest.importorskip("PIL.Image")  # pillow comes with matplotlib (test extras)
    with image.open(out) as img:
        rgb = img.convert("RGB")
        raw = rgb.tobytes()
    return rgb.width, rgb.height, [raw[i:i + 3] for i in range(0, len(raw), 3)]


def _variance(px: list[bytes]) -> float:
    lum = [0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2] for p in px]
    mean = sum(lum) / len(lum)
    return sum((v - mean) ** 2 for v in lum) / len(lum)


@pytest.mark.parametrize("graph", ["chain", "layers"])
def test_a_5000_node_page_is_not_blank_in_a_headless_screenshot(tmp_path: Path, graph: str):
    g = chain(5000) if graph == "chain" else _layers(715)  # 5,000 and 5,006 nodes
    assert len(g.nodes) >= 5000
    page = g.save(tmp_path / "g.html")
    width, height, px = screenshot(page, tmp_path / "shot.png")
    assert (width, height) == (1200, 800)
    # the graph's canvas: below the toolbar and the note, left of the side panel
    canvas = [px[y * width + x] for y in range(120, 750, 2) for x in range(0, 840, 2)]
    op = bytes((0xD3, 0xD3, 0xD3))  # lightgrey op boxes (a chain), lightyellow module boxes
    module = bytes((0xFF, 0xFF, 0xE0))
    drawn = canvas.count(op) + canvas.count(module)
    assert _variance(canvas) > 100 and drawn > 300, (_variance(canvas), drawn)


def test_the_sketch_is_replaced_by_the_layout(browser, tmp_path: Path):
    """In a browser that runs on after load, the sketch is drawn first (timings.sketched), then
    dagre's layout: the boxes move, the page is ready once that is drawn."""
    p = Page(browser, chain(5000).save(tmp_path / "g.html"))
    try:
        stats = p.js("gradscope.stats()")
        assert "sketched" in stats["timings"] and stats["boxes"] > 100, stats
        assert stats["readyMs"] >= stats["timings"]["sketched"]
        small = Page(browser, chain(100).save(tmp_path / "small.html"))
        try:  # a small graph's first view: dagre in the load task, no sketch
            assert "sketched" not in small.js("gradscope.stats()")["timings"]
        finally:
            small.close()
    finally:
        p.close()


def test_a_first_view_of_thousands_of_boxes_is_not_sketched(browser, tmp_path: Path):
    """5,000 boxes at once (a ``--full`` page): too many to label and draw in the load task,
    so the page takes its usual steps (and a screenshot taken at load stays blank)."""
    p = Page(browser, chain(5000).save(tmp_path / "full.html", full=True))
    try:
        stats = p.js("gradscope.stats()")
        assert "sketched" not in stats["timings"] and stats["boxes"] >= 5000, stats
    finally:
        p.close()


def test_the_sketch_breaks_cycles_and_keeps_edges_downward(browser, tmp_path: Path):
    p = Page(browser, chain(10).save(tmp_path / "g.html"))
    try:
        # a -> b -> c -> a (a cycle of boxes: two modules calling each other) and a -> d
        jobs = [{"w": [40, 30, 20, 10], "h": [10, 10, 10, 10], "c": [],
                 "e": [0, 1, 1, 2, 2, 0, 0, 3], "pad": [8, 22, 8, 8]}]
        (r,) = p.js("(jobs) => gsLayout.sketch(jobs)", jobs)
        ys = r["y"]
        assert ys[0] < ys[1] < ys[2] and ys[3] == ys[1], ys  # ranks 0, 1, 2 and 1
        assert len(r["p"]) == 4 and r["w"] == 30 + 14 + 10 and r["h"] == 3 * 10 + 2 * 26
        for (_, y0, _, y1), (a, b) in zip(r["p"][:2], [(0, 1), (1, 2)]):
            assert y0 == ys[a] + 10 and y1 == ys[b]  # from a box's bottom to the next one's top
    finally:
        p.close()
