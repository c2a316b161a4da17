"""Render benchmark: a 64-layer nn.TransformerEncoder (d_model 64), samples/deep_encoder.py.

Times, in one run on this machine:
  1. `gradscope render samples/deep_encoder.py -o X.svg` with default settings, as a subprocess
     (interpreter start, torch import, forward, trace, fold/auto-depth, Graphviz layout);
  2. the same pipeline in process (load the file, forward under module scopes, trace, the CLI's
     default view, SVG through Graphviz);
  3. the anchor, in process on the same model and input: torchview.draw_graph(...) plus rendering
     its graph to SVG (torchview is a benchmark-only dependency: pip install torchview==0.2.7).
Prints each time and the ratio gradscope / torchview (target: the CLI within 10 s).

    .venv/bin/python benchmarks/render.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "samples" / "deep_encoder.py"


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times) if repeat < 3 else statistics.median(times)


def cli_render(out: Path) -> None:
    exe = Path(sys.executable).parent / "gradscope"
    cmd = [str(exe), "render", str(SAMPLE), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"gradscope render failed: {proc.stderr.strip()}")
    print("  cli says:", proc.stderr.strip().replace("\n", " | "))


def gradscope_in_process(out: Path) -> int:
    """The CLI's default view (``readable_view``: fold repeats and collapse when too big)."""
    import gradscope as gs
    from gradscope.graph.transforms import readable_view

    fwd = gs.load_model_file(SAMPLE).forward()
    graph, _ = readable_view(gs.trace(fwd.outputs, model=fwd.model))
    graph.save(out)
    return len(graph.nodes)


def torchview_render(out: Path) -> int:
    import torchview

    import gradscope as gs

    mf = gs.load_model_file(SAMPLE)
    model = mf.get("model")
    cg = torchview.draw_graph(model, input_data=mf.get("example_input"), device="cpu")
    out.write_bytes(cg.visual_graph.pipe(format="svg"))
    return len(cg.visual_graph.body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        print(f"model: {SAMPLE.relative_to(ROOT)} (64 x TransformerEncoderLayer, d_model 64)")
        t_cli = best_of(lambda: cli_render(d / "cli.svg"), args.repeat)
        print(f"gradscope render (CLI, subprocess, default settings): {t_cli:.2f} s"
              f" {'OK' if t_cli <= 10 else 'OVER'} (target <= 10 s)")
        gradscope_in_process(d / "warm.svg")  # imports, first calls: torchview gets the same
        t_gs = best_of(lambda: gradscope_in_process(d / "gs.svg"), args.repeat)
        print(f"gradscope in process (forward + trace + fold + auto-depth + SVG): {t_gs:.2f} s")
        try:
            import torchview  # noqa: F401
        except ImportError:
            print("torchview is not installed (pip install torchview==0.2.7): no ratio")
            return
        torchview_render(d / "warm_tv.svg")
        t_tv = best_of(lambda: torchview_render(d / "tv.svg"), args.repeat)
        print(f"torchview.draw_graph + SVG render (in process): {t_tv:.2f} s")
        print(f"ratio gradscope / torchview (in process): {t_gs / t_tv:.2f}x")
        print(f"ratio gradscope CLI / torchview (in process): {t_cli / t_tv:.2f}x")


if __name__ == "__main__":
    main()
