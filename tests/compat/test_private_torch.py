"""torch's private internals are read in one module, ``gradscope/_torch/torchcompat.py``
(behind feature probes, degrading with a note), and in the C walk (``walk.py`` reads the
documented ``grad_fn._raw_saved_*`` handles): a scan of the source (code, and string literals
that name a private attribute for ``getattr``) finds no private torch name anywhere else."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "gradscope"
ALLOWED = {"gradscope/_torch/torchcompat.py", "gradscope/graph/walk.py"}
#: files of other issues still reading a private name directly, with how many reads at most:
#: each waits for its owner to route it through torchcompat (the test fails when a count
#: grows; a file not there yet, or with fewer reads, passes)
KNOWN: dict[str, int] = {}  # none left: every read goes through _torch/torchcompat.py

#: torch._X (any private module or function; the ``_foreach_*`` kernels, which torch's own
#: optimizers and clip_grad_norm_ call, are not internals), or a private tensor/scaler/engine
#: attribute read off an object
_CODE = re.compile(
    r"\btorch\.(?!_foreach_)_[A-Za-z]\w*"
    r"|\.(_version|_raw_saved_\w*|_scale|_per_optimizer_states|_local_tensor"
    r"|_execution_engine|_InferenceMode|_cdata|_functorch|_dynamo)\b"
)
_NAMED = re.compile(
    r"^[rb]?['\"](_version|_scale|_per_optimizer_states|_local_tensor|_execution_engine"
    r"|_raw_saved_\w*|_cdata|_current_graph_task_id)['\"]$"
)


def private_reads(path: Path) -> list[str]:
    """``line: text`` of every private torch name in the file's code (comments and
    docstrings left out; a string that is exactly a private attribute's name kept)."""
    src = path.read_text(encoding="utf-8")
    code: dict[int, list[str]] = {}  # the code tokens of each line, joined without spaces
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            continue
        if tok.type == tokenize.STRING:
            if _NAMED.match(tok.string):
                found.append(f"{tok.start[0]}: {tok.string}")
            continue
        code.setdefault(tok.start[0], []).append(tok.string)
    for line, parts in sorted(code.items()):
        found.extend(f"{line}: {m.group(0)}" for m in _CODE.finditer("".join(parts)))
    return found


def test_no_private_torch_name_outside_torchcompat():
    problems, counts = [], {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel in ALLOWED:
            continue
        reads = private_reads(path)
        if rel in KNOWN:
            counts[rel] = len(reads)
            continue
        problems.extend(f"{rel}:{r}" for r in reads)
    assert not problems, "private torch names outside torchcompat:\n" + "\n".join(problems)
    grown = {f: n for f, n in counts.items() if n > KNOWN[f]}
    assert not grown, f"more private torch reads than KNOWN allows: {grown}"


def test_the_scan_finds_each_kind(tmp_path):
    src = (
        'import torch\n"""torch._C in a docstring is fine"""\n'
        "a = torch._C._current_graph_task_id\n"  # code
        "b = t._version  # torch._dynamo in a comment is fine\n"
        'c = getattr(s, "_scale", None)\n'
        "d = torch._foreach_norm\n"  # a kernel, allowed
        "import torch._dynamo\n"
    )
    f = tmp_path / "x.py"
    f.write_text(src)
    found = private_reads(f)
    assert sorted(int(r.split(":")[0]) for r in found) == [3, 4, 5, 7], found
