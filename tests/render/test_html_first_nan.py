"""The page and a forward NaN (issue 27 item 4): the node where the forward first made NaN is
the page's first NaN (red, with its forward line), its "Go to first NaN" button and
``gradscope.firstNonfinite()``; and the page draws when Chromium takes a picture of it
(``chromium --headless --screenshot``, the way documentation pipelines do, issue 27 item 5):
the first view of a small graph is drawn before the load event, and a layout worker that never
answers is replaced by the main thread."""

from __future__ import annotations

import subprocess
import textwrap
import zlib
from pathlib import Path

import pytest
from conftest import SAMPLES
from viewer_page import CHROMIUM, Page, chain, embedded_data, launch_browser, traced

import gradscope as gs

FORWARD_NAN = """
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.fc(x)
            bad = h.log()   # NaN where h < 0
            return torch.where(h > 0, bad, torch.zeros_like(h))

    torch.manual_seed(0)
    model = Net()
    example_input = torch.randn(8, 4)

    def loss_fn(out):
        return out.sum()
"""


@pytest.fixture(scope="module")
def browser():
    yield from launch_browser()


@pytest.fixture
def forward_nan(tmp_path: Path) -> gs.Graph:
    f = tmp_path / "fwd_nan.py"
    f.write_text(textwrap.dedent(FORWARD_NAN))
    run = gs.load_model_file(f).backward()
    assert run.forward_nonfinite is not None and run.trace.first_nonfinite is None
    return run.trace.graph


def test_the_forward_s_nan_is_the_page_s_first_nan(browser, forward_nan, tmp_path: Path):
    graph = forward_nan
    (bad,) = [n for n in graph.nodes if n.forward_nonfinite]
    assert bad.name == "LogBackward0" and bad.created_at and "h.log()" in bad.created_at
    path = graph.save(tmp_path / "g.html")
    data = embedded_data(path.read_text())
    assert data["nodes"][data["first"]][0] == bad.id  # the header's first NaN is that node
    p = Page(browser, path)
    try:
        assert p.js("gradscope.firstNonfinite()") == bad.id
        button = p.page.locator("#first-bad")
        assert button.is_visible() and button.inner_text() == "Go to first NaN"
        button.click()
        p.page.wait_for_function(f"() => gradscope.details().includes({bad.id!r})")
        details = p.js("gradscope.details()")
        assert "the first op whose forward output was non-finite" in details
        assert "h.log()" in details  # its forward line
        svg = p.js("gradscope.exportSvg()")
        red = data["style"]["colors"]["bad"]
        lines = svg.splitlines()
        at = next(i for i, ln in enumerate(lines) if "LogBackward0<" in ln)
        assert f'fill="{red}"' in lines[at - 1]  # the box drawn red, the first NaN's colour
        box = "\n".join(lines[at:at + 6])
        assert "nan first made here, in the forward" in box
        assert "h.log()" in box  # with the line that made it
    finally:
        p.close()


# ---------------------------------------------------------------------- chromium --screenshot
def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """A PNG's width, height and rows of RGB(A) bytes: a small decoder (8-bit RGB or RGBA,
    non-interlaced, the five filters), enough for Chromium's screenshots."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        size = int.from_bytes(data[pos:pos + 4], "big")
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + size]
        pos += 12 + size
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
    width, height = int.from_bytes(header[:4], "big"), int.from_bytes(header[4:8], "big")
    depth, colour, interlace = header[8], header[9], header[12]
    assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(height):
        kind = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return width, height, [bytes(r[i:i + 3]) for r in rows for i in range(0, stride, bpp)]


def screenshot(page: Path, out: Path) -> tuple[int, int, list[bytes]]:
    """``chromium --headless --screenshot`` as a documentation pipeline runs it (no flag that
    waits, no GPU flag); ``--no-sandbox`` only because the tests may run as root."""
    if not CHROMIUM.exists():
        pytest.skip("/usr/bin/chromium is missing (scripts/setup-browser.sh installs it)")
    subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", f"--screenshot={out}",
         "--window-size=800,600", page.resolve().as_uri()],
        capture_output=True, timeout=60, cwd=out.parent, check=False)
    assert out.exists(), "chromium wrote no screenshot"
    return png_pixels(out.read_bytes())


@pytest.mark.parametrize("sample", ["mlp.py", "transformer.py"])
def test_the_page_draws_in_a_headless_screenshot(tmp_path: Path, sample: str):
    """The graph's canvas (left of the side panel, below the toolbar) holds the drawn boxes:
    many pixels of the op colour (lightgrey boxes) where a blank canvas has none."""
    graph = traced(sample)[0]
    page = graph.save(tmp_path / "g.html")
    width, height, px = screenshot(page, tmp_path / "shot.png")
    assert (width, height) == (800, 600)
    canvas = [px[y * width + x] for y in range(110, 540) for x in range(0, 520)]
    op = bytes((0xD3, 0xD3, 0xD3))  # lightgrey, the op boxes' fill (torchviz's)
    leaf = bytes((0xAD, 0xD8, 0xE6))  # lightblue, the parameters'
    ops, leaves = canvas.count(op), canvas.count(leaf)
    assert ops > 500 and leaves > 200, (ops, leaves, SAMPLES / sample)


#: A Worker that starts and never answers (what headless Chromium's screenshot mode showed).
MUTE_WORKER = """
window.Worker = class { constructor() {} postMessage() {} terminate() { window.__muted = 1; } };
"""


def test_a_worker_that_never_answers_is_replaced_by_the_main_thread(browser, tmp_path: Path):
    """A graph past the quick first view (2,000 nodes) goes to the worker; the worker never
    acknowledges the request, so the page drops it and lays out on its main thread."""
    page = chain(2000).save(tmp_path / "chain.html")
    p = browser.new_page(viewport={"width": 1000, "height": 700})
    try:
        errors: list[str] = []
        p.on("pageerror", lambda e: errors.append(str(e)))
        p.add_init_script(MUTE_WORKER)
        p.goto(page.resolve().as_uri())
        p.wait_for_function("() => window.gradscope !== undefined")
        p.evaluate("gradscope.ready")
        stats = p.evaluate("gradscope.stats()")
        assert stats["boxes"] > 0 and stats["worker"] is False, stats
        assert p.evaluate("window.__muted") == 1  # dropped, not left pending
        assert errors == []
    finally:
        p.close()
