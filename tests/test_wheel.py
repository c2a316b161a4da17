"""What users install is what the suite tests: the built wheel holds every package of the
checkout, and ``gradscope`` is imported from it, not from the checkout.

``scripts/test.sh`` builds the sdist and the wheel (``python -m build``: the wheel is built from
the sdist, so a file the sdist lacks is missing here too), installs the wheel into each leg's
venv and names it in ``GRADSCOPE_WHEEL``. Without that variable (an editable install, a
developer's run) these tests skip: there is no wheel to read.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WHEEL = os.environ.get("GRADSCOPE_WHEEL")

pytestmark = pytest.mark.skipif(
    not WHEEL, reason="GRADSCOPE_WHEEL is not set (scripts/test.sh installs the built wheel)"
)


def _package_dirs(top: Path, installed_as: str) -> dict[str, Path]:
    """Every folder under ``top`` holding a file the package ships (not caches), by the dotted
    name it is installed under."""
    found = {}
    for d in [top, *sorted(p for p in top.rglob("*") if p.is_dir())]:
        rel = d.relative_to(top)
        if "__pycache__" in rel.parts or any(part.endswith(".egg-info") for part in rel.parts):
            continue
        if any(f.is_file() and f.suffix not in (".pyc", ".so") for f in d.iterdir()):
            found[".".join([installed_as, *rel.parts])] = d
    return found


def _wheel_names() -> list[str]:
    assert WHEEL is not None
    with zipfile.ZipFile(WHEEL) as zf:
        return zf.namelist()


def test_every_package_folder_and_file_of_the_checkout_is_in_the_wheel() -> None:
    names = set(_wheel_names())
    missing = []
    for top, installed_as in ((ROOT / "gradscope", "gradscope"), (ROOT / "cli", "gradscope_cli")):
        for dotted, folder in _package_dirs(top, installed_as).items():
            for f in folder.iterdir():
                if f.is_file() and f.suffix in (".py", ".js", ".html", ".pyi", ".typed"):
                    arc = "/".join([*dotted.split("."), f.name])
                    if arc not in names:
                        missing.append(arc)
    assert not missing, f"files of the checkout the wheel lacks: {missing}"
    # the compiled walk is in the wheel, built
    assert any(n.startswith("gradscope/graph/_cwalk.") and n.endswith(".so") for n in names)


def test_gradscope_is_imported_from_the_installed_wheel_not_the_checkout() -> None:
    import gradscope_cli

    import gradscope

    for mod in (gradscope, gradscope_cli):
        where = Path(mod.__file__ or "").resolve()
        assert "site-packages" in where.parts, where
        for src in (ROOT / "gradscope", ROOT / "cli"):
            assert not where.is_relative_to(src), f"{mod.__name__} imported from the checkout"


def test_the_public_pieces_import_from_the_wheel() -> None:
    import gradscope as gs

    assert gs.GradMonitor.__module__.startswith("gradscope.monitor")
    for name in ("gradscope.integrations.transformers", "gradscope.integrations.lightning"):
        assert hasattr(importlib.import_module(name), "GradscopeCallback")
    cwalk = importlib.import_module("gradscope.graph._cwalk")
    assert "site-packages" in Path(cwalk.__file__ or "").parts
    from importlib.resources import files

    assets = files("gradscope.render.assets")
    for asset in ("viewer.js", "viewer.html", "layout.js", "dagre.min.js"):
        assert assets.joinpath(asset).read_text(encoding="utf-8"), asset


def test_the_console_script_runs_from_another_folder(tmp_path: Path) -> None:
    """``gradscope`` from the venv, in a folder with no checkout: it renders a sample."""
    exe = Path(sys.executable).parent / "gradscope"
    out = tmp_path / "mlp.dot"
    proc = subprocess.run(
        [str(exe), "render", str(ROOT / "samples" / "mlp.py"), "-o", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().startswith("digraph")


def test_the_metadata_names_the_distribution_and_the_torch_ci_runs() -> None:
    """The wheel installs as ``torch-gradscope`` (import name and command stay ``gradscope``),
    with complete metadata, and its torch range says exactly what CI runs: every torch a leg
    of scripts/test.sh pins is in it (this leg's torch too), the minor version below the oldest
    and the one above the newest are not."""
    import re
    from importlib import metadata

    import torch
    from packaging.requirements import Requirement
    from packaging.version import Version

    meta = metadata.metadata("torch-gradscope")
    assert meta["Name"] == "torch-gradscope"
    for field in ("Summary", "License-Expression", "Requires-Python", "Author"):
        assert meta[field], field
    assert meta["Description-Content-Type"] == "text/markdown"
    assert (meta["Description"] or meta.get_payload() or "").lstrip().startswith("# gradscope")
    assert meta.get_all("Project-URL") and meta.get_all("Keywords")
    classifiers = meta.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3.11" in classifiers
    scripts = {ep.name: ep.value for ep in metadata.distribution("torch-gradscope").entry_points
               if ep.group == "console_scripts"}
    assert scripts == {"gradscope": "gradscope_cli.main:main"}

    (torch_req,) = [r for r in map(Requirement, meta.get_all("Requires-Dist") or [])
                    if r.name == "torch" and r.marker is None]
    spec = torch_req.specifier
    pinned = sorted({Version(v) for v in re.findall(
        r"torch==(\d+\.\d+\.\d+)", (ROOT / "scripts" / "test.sh").read_text())})
    assert len(pinned) >= 2, pinned
    assert all(spec.contains(v) for v in pinned), (str(spec), pinned)
    assert spec.contains(Version(torch.__version__).base_version)
    oldest, newest = pinned[0], pinned[-1]
    assert not spec.contains(f"{oldest.major}.{oldest.minor - 1}.0"), str(spec)
    assert not spec.contains(f"{newest.major}.{newest.minor + 1}.0"), str(spec)
