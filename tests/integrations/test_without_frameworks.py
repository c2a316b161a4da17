"""The integrations import where their framework is not installed (so ``pytest
--doctest-modules gradscope`` collects without Lightning or transformers), and making a
callback there says in one line what to install."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CODE = """
    import sys
    for name in ("lightning", "lightning.pytorch", "pytorch_lightning", "transformers"):
        sys.modules[name] = None  # not installed
    import gradscope as gs
    from gradscope.integrations import lightning, transformers
    for module in (lightning, transformers):
        try:
            module.GradscopeCallback()
        except gs.MissingExtraError as exc:
            print(str(exc).splitlines()[0])
"""


def test_the_integrations_import_without_their_frameworks():
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(CODE)], capture_output=True,
                          text=True, timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 2, proc.stdout
    assert "pip install lightning" in lines[0] and "pip install transformers" in lines[1]
