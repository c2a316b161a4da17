"""The cost of recording a step for ``gs.compare_runs``: forward + backward under
``gs.record_numerics(model)`` against the plain step and against PyTorch's ``DebugMode`` with
tensor hashing (``torch.utils._debug_mode.DebugMode`` + ``DebugMode.log_tensor_hashes()``, the
anchor of the issue), measured in the same run (target: recording at most 1.0x ``DebugMode``).
Also the size of the saved record of one GPT-2-small step (target: under a few MiB).

Models (random weights, nothing downloaded): a GPT-2-style ``transformers.GPT2LMHeadModel``
(``GPT2Config`` 6 x 256, 4 heads, vocab 2048; batch 4 x 128 tokens, the LM loss) for the
timings; GPT-2 small (12 x 768, 12 heads, vocab 50257; batch 1 x 128 tokens) for the record's
size. Every round times a plain step, a recorded step and a ``DebugMode`` step back to back
(``--rounds`` rounds, interleaved, so load from elsewhere on a shared machine hits every side);
each ratio is the median of the per-round ratios of wall time.

    .venv/bin/python benchmarks/numerics.py [--rounds 7] [--no-size] [--threads 1]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

import gradscope as gs

TARGET = 1.0  # recording / DebugMode with hashing
SIZE_TARGET = 4 * 2**20  # bytes of a GPT-2-small step's record


def gpt2(n_layer: int = 6, n_embd: int = 256, n_head: int = 4, vocab: int = 2048,
         batch: int = 4, tokens: int = 128
         ) -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_positions=max(tokens, 256),
                     vocab_size=vocab, attn_pdrop=0.0, embd_pdrop=0.0, resid_pdrop=0.0,
                     bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg)
    ids = torch.randint(0, vocab, (batch, tokens), generator=torch.Generator().manual_seed(0))
    return model, lambda m: m(input_ids=ids, labels=ids).loss


def debug_mode() -> Callable[[], object] | None:
    """A context factory for ``DebugMode`` with tensor hashing, or None on a torch without it."""
    try:
        from torch.utils._debug_mode import DebugMode
    except ImportError:
        return None
    import contextlib

    @contextlib.contextmanager
    def both():  # type: ignore[no-untyped-def]
        with DebugMode() as dm, DebugMode.log_tensor_hashes(hash_fn="norm"):
            yield dm

    return both


def _wall(fn: Callable[[], object]) -> float:
    gc.collect()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def timings(rounds: int) -> None:
    model, loss_of = gpt2()

    def plain() -> None:
        model.zero_grad(set_to_none=True)
        loss_of(model).backward()

    def recorded() -> None:
        model.zero_grad(set_to_none=True)
        with gs.record_numerics(model):
            loss_of(model).backward()

    hashing = debug_mode()

    def debug() -> None:
        assert hashing is not None
        model.zero_grad(set_to_none=True)
        with hashing():
            loss_of(model).backward()

    sides: dict[str, Callable[[], None]] = {"plain": plain, "record_numerics": recorded}
    if hashing is not None:
        sides["DebugMode+hashing"] = debug
    for fn in sides.values():  # warm up
        fn()
    times: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            times[name].append(_wall(fn))
    with gs.record_numerics(model) as run:
        model.zero_grad(set_to_none=True)
        loss_of(model).backward()
    print(f"GPT-2 6x256, batch 4x128, torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads, {rounds} interleaved rounds; {len(run.ops)} ops recorded per step")
    for name, ts in times.items():
        print(f"  {name:20s} median {statistics.median(ts) * 1e3:8.1f} ms")
    rec = [r / p for r, p in zip(times["record_numerics"], times["plain"], strict=True)]
    print(f"  record_numerics / plain step:        {statistics.median(rec):.2f}x")
    if hashing is None:
        print("  DebugMode: not in this torch (torch.utils._debug_mode); no anchor ratio")
        return
    dbg = [d / p for d, p in zip(times["DebugMode+hashing"], times["plain"], strict=True)]
    vs = [r / d for r, d in zip(times["record_numerics"], times["DebugMode+hashing"],
                                strict=True)]
    ratio = statistics.median(vs)
    print(f"  DebugMode+hashing / plain step:      {statistics.median(dbg):.2f}x")
    print(f"  record_numerics / DebugMode+hashing: {ratio:.2f}x (target <= {TARGET:.1f}x: "
          f"{'ok' if ratio <= TARGET else 'MISSED'})")


def size() -> None:
    model, loss_of = gpt2(n_layer=12, n_embd=768, n_head=12, vocab=50257, batch=1, tokens=128)
    with gs.record_numerics(model) as run:
        loss_of(model).backward()
    with tempfile.TemporaryDirectory() as tmp:
        path = run.save(Path(tmp) / "run.json")
        nbytes = path.stat().st_size
    n_params = sum(p.numel() for p in model.parameters())
    print(f"GPT-2 small ({n_params / 1e6:.0f}M parameters), batch 1x128: {run.summary()}")
    print(f"  saved record: {nbytes / 2**20:.2f} MiB, {nbytes / max(len(run.ops), 1):.0f} bytes "
          f"per op (target < {SIZE_TARGET / 2**20:.0f} MiB: "
          f"{'ok' if nbytes < SIZE_TARGET else 'MISSED'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-size", action="store_true", help="skip the GPT-2-small record")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch's intra-op threads (0: torch's default); 1 is steadier on "
                             "a shared machine")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    timings(args.rounds)
    if not args.no_size:
        size()


if __name__ == "__main__":
    main()
