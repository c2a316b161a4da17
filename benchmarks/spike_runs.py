"""The 1,000-step planted runs of ``samples/spikes/planted.py`` (the tests run 200 steps).

    .venv/bin/python benchmarks/spike_runs.py [--steps 1000] [--threads 1]

For each of the small language model, the small forecasting transformer and the small CNN
(AdamW, linear warm-up then cosine), a clean run and a run with one corrupted example, and the
CNN's clean data with one step's learning rate x1000 (``lr_spike``), every step logged, the
loss observed and the batch ids given: the seconds the run took, the loss at the start and
the end, the largest ratio of each signal to its running median (computed here from the
history: how close a clean run came to the factor), and each spike incident: its step,
signal, ratio, the top sample's id and share, against the corrupted example's id.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def _planted():
    spec = importlib.util.spec_from_file_location("planted", ROOT / "samples/spikes/planted.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _largest(values: list[float], warmup: int, window: int) -> tuple[float, int]:
    best = (0.0, -1)
    for i in range(warmup + 5, len(values)):
        w = values[max(warmup, i - window):i]
        best = max(best, (values[i] / statistics.median(w), i))
    return best


def _told(inc) -> str:  # noqa: ANN001
    if not inc.samples:
        return f"step {inc.step} {inc.signal} x{inc.ratio:.3g} ({inc.note})"
    top = inc.samples[0]
    return (f"step {inc.step} {inc.signal} x{inc.ratio:.3g}, top sample {top.id} "
            f"({top.share:.0%})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    planted = _planted()
    print(f"torch {torch.__version__}, {args.threads} thread(s), {args.steps} steps each")
    runs = [(kind, corrupt, False) for kind in ("transformer", "forecast", "cnn")
            for corrupt in (False, True)] + [("cnn", False, True)]
    for kind, corrupt, lr_spike in runs:
        t0 = time.perf_counter()
        mon, truth = planted.run(kind, corrupt, steps=args.steps, lr_spike=lr_spike)
        seconds = time.perf_counter() - t0
        h, th = mon.history, mon.thresholds
        gn = _largest([st.total_norm for st in h], th.spike_warmup, th.spike_window)
        lo = _largest([st.loss for st in h], th.spike_warmup, th.spike_window)
        spikes = [i for i in mon.incidents if i.kind == "spike"]
        told = "; ".join(_told(i) for i in spikes) or "none"
        print(
            f"{kind:11} {'lr x1000' if lr_spike else 'corrupted' if corrupt else 'clean':9} "
            f"{seconds:6.1f} s; loss "
            f"{h[0].loss:.3f} -> {h[-1].loss:.3f}; largest ratio to the running median: "
            f"grad norm x{gn[0]:.2f} (step {gn[1]}), loss x{lo[0]:.2f} (step {lo[1]}); "
            f"spikes: {told}" + (f"; corrupted example {truth} at step "
                                 f"{planted.corrupt_step(args.steps)}" if truth else "")
            + (f"; learning rate x{planted.LR_SPIKE:g} at step "
               f"{planted.corrupt_step(args.steps)}" if lr_spike else ""),
            flush=True,
        )


if __name__ == "__main__":
    main()
