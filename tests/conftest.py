"""Shared fixtures and helpers: reference walks and graph builders used across test files."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

from gradscope.graph import walk as _walk

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
GOLDEN = Path(__file__).resolve().parent / "golden"

#: Regenerate golden files with `pytest --update-golden` (never silently).
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite tests/golden/*")


@pytest.fixture
def golden(request: pytest.FixtureRequest):
    """``golden(name, text)``: compare ``text`` with ``tests/golden/name``."""
    update = request.config.getoption("--update-golden")

    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        if update or not path.exists():
            if not update:
                pytest.fail(f"golden file {path} is missing; run pytest --update-golden once")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        assert text == path.read_text(encoding="utf-8"), f"output differs from {path}"

    return check


def reference_walk(roots) -> tuple[Counter, int]:
    """Ground truth: names of every backward node reachable over ``next_functions`` and the
    number of (non-None) edges between them, by a plain BFS that knows nothing of gradscope."""
    if isinstance(roots, torch.Tensor):
        roots = [roots]
    seen = set()
    queue = [t.grad_fn for t in roots if t.grad_fn is not None]
    names: Counter = Counter()
    edges = 0
    while queue:
        fn = queue.pop()
        if fn in seen:
            continue
        seen.add(fn)
        names[type(fn).__name__] += 1
        for nxt, _ in fn.next_functions:
            if nxt is not None:
                edges += 1
                queue.append(nxt)
    return names, edges


def graph_counts(graph) -> tuple[Counter, int]:
    """The same two figures read off a gradscope Graph."""
    kinds = {"op", "custom", "accumulate"}
    ids = {n.id for n in graph.nodes if n.kind in kinds}
    names = Counter(n.name for n in graph.nodes if n.kind in kinds)
    edges = sum(1 for e in graph.edges if e.src in ids and e.dst in ids)
    return names, edges


_REAL_EMPTY = torch.empty


def nan_empty(*args, **kwargs) -> torch.Tensor:
    """``torch.empty`` whose floating memory is all NaN (the worst uninitialised memory can
    hold), made where no torch function mode sees it, as the allocator hands it over; tests
    put it in place with ``monkeypatch.setattr(torch, "empty", nan_empty)``."""
    with torch._C.DisableTorchFunction():
        t = _REAL_EMPTY(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(float("nan"))
    return t


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def run_cli(*args: str, cwd: Path | None = None, timeout: int = 240):
    """Run the installed `gradscope` console script in a subprocess."""
    import subprocess

    exe = Path(sys.executable).parent / "gradscope"
    # one intra-op thread: beside the second xdist worker on 2 cores, torch's spinning pool
    # made a subprocess up to 2x slower (the compiled incident sample: 5 s alone, 10.4 s)
    env = dict(os.environ, COLUMNS="120", NO_COLOR="1", TERM="dumb", OMP_NUM_THREADS="1")
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, cwd=cwd or ROOT, timeout=timeout, env=env
    )


def in_process_cli(capsys, monkeypatch, columns: int):
    """The console script's entry point run in this process at ``columns`` columns:
    ``run(*args) -> (exit code, stdout, stderr)``, never a traceback."""
    from gradscope_cli.main import main

    monkeypatch.setenv("COLUMNS", str(columns))

    def run(*args: str) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exc:
            main(list(args))
        out, err = capsys.readouterr()
        assert "Traceback" not in out + err
        return int(exc.value.code or 0), out, err

    return run


def spawn_ranks(worker, world: int, folder, args) -> Path:
    """``torch.multiprocessing.spawn(worker, args=args(out), nprocs=world)`` in a fresh folder
    ``folder(attempt)`` (its own rendezvous file); one retry in a new folder: on a loaded
    2-core machine gloo's set-up between the spawned processes has failed (a refused TCP
    connection, a SIGABRT in one process) once in many runs. Returns the folder of the run
    that finished; both failures are reported when the retry fails too."""
    import torch.multiprocessing as mp

    errors = []
    for attempt in range(2):
        out = Path(folder(attempt))
        try:
            mp.spawn(worker, args=args(out), nprocs=world, join=True)
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
            errors.append(str(exc))
            continue
        return out
    raise AssertionError(f"the {world}-process run failed twice:\n" + "\n---\n".join(errors))


def read_ranks(out: Path, world: int) -> list:
    """The ``rank{r}.json`` each spawned rank wrote into ``out``, in rank order."""
    import json

    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


# ---------------------------------------------------------------------------- capture fixtures
#: The compiled walk as imported (None when it was not built or GRADSCOPE_PURE_PYTHON=1).
COMPILED_WALK = _walk.CWALK


@pytest.fixture(params=["compiled", "python"])
def walker(request, monkeypatch):
    """Run the test once with each walker (the compiled one skipped when it is off)."""
    if request.param == "compiled":
        if COMPILED_WALK is None:
            pytest.skip("compiled walk off (not built, or GRADSCOPE_PURE_PYTHON=1)")
        monkeypatch.setattr(_walk, "CWALK", COMPILED_WALK)
    else:
        monkeypatch.setattr(_walk, "CWALK", None)
    return request.param


@pytest.fixture
def fresh_dynamo():
    """Dynamo's caches and counters empty before and after the test."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


_GLOBAL_HOOKS = (
    "_global_forward_hooks",
    "_global_forward_pre_hooks",
    "_global_backward_hooks",
    "_global_backward_pre_hooks",
    "_global_module_registration_hooks",
    "_global_parameter_registration_hooks",
    "_global_buffer_registration_hooks",
    "_global_forward_hooks_always_called",
    "_global_forward_hooks_with_kwargs",
)


def _global_hooks() -> dict[str, int]:
    mod = torch.nn.modules.module
    return {name: len(getattr(mod, name, {})) for name in _GLOBAL_HOOKS}


@pytest.fixture(autouse=True)
def _no_global_hooks_left() -> None:
    """Hooks leave nothing behind: torch's global module hooks are as they were after each
    test (a hook left there makes every later torch.compile(module) warn, and runs forever)."""
    before = _global_hooks()
    yield
    after = _global_hooks()
    if after != before:
        import gc

        gc.collect()  # a monitor dropped without .remove() lets go of its hooks when collected
        after = _global_hooks()
    left = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    if torch.nn.modules.module._has_any_global_hook():
        left["any global hook"] = 1
    assert not left, f"global module hooks left behind by this test: {left}"


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (restored after): tiny ops on a shared 2-core machine,
    where a thread pool only adds contention (``pytestmark = usefixtures("one_thread")``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

