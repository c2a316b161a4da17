"""The page of ``render --doctor`` in Chromium (issue 30 item 3): the finding's nodes outlined
and labelled, its message in the note, "Go to finding" selecting its nodes in turn,
``gradscope.findings()``; a healthy step's page says so and has no button."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SAMPLES
from viewer_page import Page, launch_browser

import gradscope as gs
from gradscope.render.html import to_html


@pytest.fixture(scope="module")
def browser():
    yield from launch_browser()


def _page(name: str, tmp_path: Path) -> tuple[Path, gs.DoctorReport]:
    mf = gs.load_model_file(SAMPLES / "doctor" / f"{name}.py")
    model, x, _ = mf.build()
    doc = gs.doctor(model)
    try:
        with doc:
            loss = mf.loss(mf.run_model(model, x))
            graph = doc.trace(loss)
            loss.backward()
    except gs.AutogradError:
        pass
    report = doc.report()
    path = tmp_path / f"{name}.html"
    path.write_text(to_html(graph, doctor=report))
    return path, report


def test_the_page_highlights_the_finding_and_goes_to_it(browser, tmp_path: Path):
    path, report = _page("inplace", tmp_path)
    (finding,) = report.findings
    nodes = [list(n) for n in finding.nodes]
    assert [r for r, _ in nodes] == ["modified", "saved"]
    p = Page(browser, path)
    try:
        (shown,) = p.js("gradscope.findings()")
        assert shown["title"] == finding.title() and shown["nodes"] == nodes
        note = p.js("gradscope.state()")["note"]
        assert note.startswith("Doctor: inplace at inplace.py:30: ") and finding.message in note
        button = p.page.locator("#go-finding")
        assert button.is_visible()
        button.click()
        p.page.wait_for_function(f"() => gradscope.selected() === {nodes[0][1]!r}")
        assert "modified in place here: zero_ at inplace.py:30" in p.js("gradscope.details()")
        assert p.js("gradscope.goToFinding()") == nodes[1][1]  # then the saver
        assert "saved the tensor here: sigmoid at inplace.py:29" in p.js("gradscope.details()")
        svg = p.js("gradscope.exportSvg()")  # the labels are drawn on the boxes
        assert "⚑ modified in place here" in svg and "⚑ saved the tensor here" in svg
    finally:
        p.close()


def test_a_healthy_page_says_so(browser, tmp_path: Path):
    path, report = _page("healthy", tmp_path)
    assert report.healthy
    p = Page(browser, path)
    try:
        assert p.js("gradscope.findings()") == []
        assert p.js("gradscope.state()")["note"].startswith("Doctor: healthy: no findings")
        assert not p.page.locator("#go-finding").is_visible()
    finally:
        p.close()


def test_a_page_without_the_doctor_has_none_of_it(browser, tmp_path: Path):
    mf = gs.load_model_file(SAMPLES / "doctor" / "healthy.py")
    model, x, _ = mf.build()
    path = gs.trace(mf.loss(mf.run_model(model, x)), model=model).save(tmp_path / "plain.html")
    p = Page(browser, path)
    try:
        assert p.js("gradscope.findings()") is None
        assert "Doctor" not in p.js("gradscope.state()")["note"]
    finally:
        p.close()
