"""The README sells and points: short, the two commands first under "Development", links that
resolve, no history. Its examples (and the docs pages') are run by tests/test_docs.py."""

from __future__ import annotations

import re

from conftest import ROOT

README = ROOT / "README.md"
#: the pictures the docs build generates from samples/ (docs/hooks.py): the only ones pages use
PICTURES = {"img/mlp.svg", "img/nan_backward.svg", "img/deep_encoder.svg", "img/compiled.svg"}
LINK = re.compile(r"(!?)\[[^\]]*\]\(([^)\s]+)\)")


def _pages():
    docs = ROOT / "docs"
    return [README, docs / "index.md", docs / "getting-started.md",
            *sorted((docs / "guides").glob("*.md"))]


def test_the_readme_is_short():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


def test_the_two_commands_are_the_first_code_of_the_development_section():
    text = README.read_text(encoding="utf-8")
    section = text[text.index("\n## Development\n"):]
    block = re.search(r"```[a-z]*\n(.*?)```", section, re.S)
    assert block is not None
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    assert commands[:2] == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    assert (ROOT / "scripts" / "demo.sh").is_file() and (ROOT / "scripts" / "test.sh").is_file()


def test_the_readme_tells_no_history():
    text = README.read_text(encoding="utf-8")
    for pattern in (r"\bissue \d+", r"load average", r"\b20\d\d-\d\d-\d\d\b",
                    r"\b(January|February|March|April|May|June|July|August|September|October|"
                    r"November|December) \d{1,2}, 20\d\d"):
        assert not re.search(pattern, text, re.I), pattern


def test_every_relative_link_resolves_and_pictures_are_generated_ones():
    for page in _pages():
        for bang, target in LINK.findall(page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = target.split("#")[0]
            if bang:
                # pictures come from the docs build, never from a committed file
                assert page != README, f"README shows a picture: {target}"
                rel = (page.parent / path).resolve().relative_to((ROOT / "docs").resolve())
                assert rel.as_posix() in PICTURES, f"{page.name}: {target}"
                continue
            assert (page.parent / path).exists(), f"{page.relative_to(ROOT)}: {target}"


def test_the_readme_names_the_install_and_the_supported_versions():
    text = README.read_text(encoding="utf-8")
    assert "pip install torch-gradscope" in text
    assert "pip install ." in text
    assert "[plot]" in text and "[tensorboard]" in text
    assert "2.13" in text and "2.15" in text and "3.10" in text
