"""The page's first view of a real model is a readable overview (issue 46 item 5): a model
whose budget-sized first view is too big to read whole (a Hugging Face GPT-2, the 64-layer
encoder) opens as its top-level boxes, opened level by level while the whole stays readable,
never zoomed into one corner of hundreds of ops."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from viewer_page import Page, launch_browser, traced

import gradscope as gs

#: Text is drawn 11 px tall times the zoom: 9 px or more is readable (the page's READ_K).
READ_K = 9 / 11


@pytest.fixture(scope="module")
def browser():
    yield from launch_browser()


def _gpt2() -> gs.Graph:
    tf = pytest.importorskip("transformers")
    cfg = tf.GPT2Config(n_layer=4, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                        bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 256, (2, 16))
    with gs.scopes(model):
        out = model(ids, labels=ids)
    return gs.trace(out.loss, model=model)


def _boxes(p: Page) -> list[str]:
    return p.js("gradscope.geometry().boxes.map((b) => b[0])")


def _first_view(p: Page, what: str) -> None:
    view = p.js("gradscope.view()")
    assert view["k"] >= READ_K, f"{what}: zoom {view['k']:.3f}, text {11 * view['k']:.1f} px"
    assert p.js("gradscope.stats().overview"), f"{what}: not the overview"
    assert "readable size" not in p.page.inner_text("#note")  # whole, not one corner of it
    geo = p.js("gradscope.geometry()")
    assert 2 <= len(geo["boxes"]) <= 80, len(geo["boxes"])
    width, height = p.js("[innerWidth, innerHeight]")
    for b in geo["boxes"]:  # every box inside the window
        x, y = b[1], b[2]
        assert -1 <= x <= width and -1 <= y <= height, b


def test_gpt2_opens_as_a_readable_overview(browser, tmp_path: Path) -> None:
    graph = _gpt2()
    p = Page(browser, graph.save(tmp_path / "gpt2.html"), 1200, 800)
    _first_view(p, "GPT-2 first view")
    boxes = " ".join(map(str, _boxes(p)))
    assert "transformer" in boxes  # module boxes, not hundreds of ops
    if os.environ.get("GRADSCOPE_SCREENSHOTS"):
        p.page.screenshot(path=os.environ["GRADSCOPE_SCREENSHOTS"] + "/gpt2.png")
    p.js("gradscope.expand('transformer')")  # the boxes still open on a click
    assert p.js("gradscope.visible()") > len(boxes.split())
    p.close()


def test_deep_encoder_opens_as_a_readable_overview(browser, tmp_path: Path) -> None:
    graph = traced("deep_encoder.py")[0]
    p = Page(browser, graph.save(tmp_path / "deep.html"), 1200, 800)
    _first_view(p, "encoder first view")
    if os.environ.get("GRADSCOPE_SCREENSHOTS"):
        p.page.screenshot(path=os.environ["GRADSCOPE_SCREENSHOTS"] + "/deep.png")
    p.close()


def test_a_graph_readable_whole_keeps_its_first_view(browser, tmp_path: Path) -> None:
    graph = traced("mlp.py")[0]
    p = Page(browser, graph.save(tmp_path / "mlp.html"), 1200, 800)
    assert not p.js("gradscope.stats().overview")
    assert p.js("gradscope.visible()") == len(graph.nodes)
    p.close()


def test_a_depth_asked_for_is_kept(browser, tmp_path: Path) -> None:
    graph = _gpt2()
    p = Page(browser, graph.save(tmp_path / "gpt2_depth.html", depth=3), 1200, 800)
    assert not p.js("gradscope.stats().overview")
    p.close()
