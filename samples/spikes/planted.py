"""Long runs for spike detection: two small transformers and a small CNN, trained with a
linear warm-up and a cosine schedule (AdamW), clean or with ONE example of ONE batch corrupted,
or with one step's learning rate gone wrong.

    from planted import run
    mon, truth = run("cnn", corrupt=True)       # truth: the corrupted example's id, or None
    mon, _ = run("cnn", corrupt=False, lr_spike=True)

The tasks are learnable with a noise floor (a few labels are random, readings are noisy), so
the loss settles at a level instead of falling to zero (a loss of 1e-4 that moves to 1e-3 is a
10x "spike" of nothing). The corruption:
  * transformer (a language model over counting sequences): a sequence whose every target is
    flipped to another token, 70% into the run, when the model predicts the true tokens
    confidently (the issue's "flipped label with a high-confidence model"). Measured: the
    step's loss rises about 2.4x and its gradient norm about 1.5x over their medians, far
    below the 10x of a spike: one example of B moves a mean cross-entropy by at most its own
    loss / B (bounded by the confidence), and a noise floor (needed against false alarms)
    keeps the median up. It is not a spike, and the monitor says none.
  * forecast (a transformer over noisy sine waves, each reading projected to d=16, mean
    squared error on the next reading): one series reported in the wrong unit, every reading
    x1000 (the issue's "inputs scaled x1000"; the targets come from the same readings). The
    LayerNorms make the network's output nearly blind to the input's scale, so the squared
    error of that series is ~1e6 where the others' are ~0.03: the loss x2e6, the gradient
    norm ~2,000x, and the series carries all of the step's squared gradient norm.
  * cnn: an image whose pixels are replaced by noise of scale 1000 (a broken sensor; the
    issue's "inputs scaled x1000"). A correctly classified image scaled x1000 would NOT spike
    a ReLU network: its logits scale too, the softmax saturates on the right class and the
    example's gradient is about zero. The noise image is classified arbitrarily, its loss is
    in the hundreds and the step's gradient norm ~1,500x its median.
  * ``lr_spike=True`` (clean data): the learning rate of the same step is ``LR_SPIKE`` x the
    schedule's (a hand-written schedule's bug; a resume that restored 10 where 1e-2 was
    meant). AdamW moves every weight by about the rate, so the next step's loss jumps for
    every example alike: a spike in which no example stands out (on the CNN the largest
    share of the squared norm is ~6% of 32).
Every example has an id (``ID0`` + its index in the run), given to the monitor with
``observe_batch_ids``, so an incident names the corrupted example by its id.

Used by ``tests/monitor/test_spike_runs.py`` and ``benchmarks/spike_runs.py``. No global
state is changed: the weights come from a ``torch.random.fork_rng`` block, data from
generators of their own.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

import gradscope as gs

STEPS = 1000
WARMUP = 50
BATCH = {"transformer": 4, "cnn": 32, "forecast": 8}  # examples per batch
CORRUPT_STEP = 700
CORRUPT_ROW = 3
ID0 = 100_000  # ids are never positions
VOCAB = 16
LENGTH = 12
# the share of random labels (the loss's floor); for "forecast", the noise on each reading
NOISE = {"transformer": 0.03, "cnn": 0.1, "forecast": 0.05}
LR_SPIKE = 1000.0  # the learning rate of ``run(..., lr_spike=True)``'s one bad step, x the schedule


class _OneLayer(nn.Module):
    """``embed``, then positions, one pre-norm causal transformer layer (d=16), a final norm
    and a head of ``out`` features."""

    def __init__(self, embed: nn.Module, out: int, d: int = 16) -> None:
        super().__init__()
        self.embed = embed
        self.pos = nn.Parameter(torch.zeros(LENGTH, d))
        self.layer = nn.TransformerEncoderLayer(d, 2, dim_feedforward=32, dropout=0.0,
                                                batch_first=True, norm_first=True)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, out)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(LENGTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) + self.pos
        h = self.layer(h, src_mask=self.mask, is_causal=True)
        return self.head(self.norm(h))


class TinyLM(_OneLayer):
    """A language model: token embeddings, a head over the vocabulary."""

    def __init__(self, d: int = 16) -> None:
        super().__init__(nn.Embedding(VOCAB, d), VOCAB, d)


class TinyForecaster(_OneLayer):
    """A reading per time step projected to d, a head predicting the next reading."""

    def __init__(self, d: int = 16) -> None:
        super().__init__(nn.Linear(1, d), 1, d)

    def forward(self, series: torch.Tensor) -> torch.Tensor:
        return super().forward(series.unsqueeze(-1)).squeeze(-1)


class TinyCNN(nn.Module):
    """Two 3x3 convolutions (no BatchNorm: its examples would be coupled), a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, stride=2)
        self.head = nn.Linear(8 * 4 * 4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv1(x))
        h = torch.relu(self.conv2(h))
        return self.head(h.flatten(1))


def _lm_batches(corrupt: bool, at: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Sequences counting up by a per-sequence stride (mod VOCAB); the target is the next
    token; NOISE of the targets random."""
    g = torch.Generator().manual_seed(1)
    for step in itertools.count():
        start = torch.randint(0, VOCAB, (BATCH["transformer"], 1), generator=g)
        stride = torch.randint(1, 4, (BATCH["transformer"], 1), generator=g)
        seq = (start + stride * torch.arange(LENGTH + 1)) % VOCAB
        x, y = seq[:, :-1], seq[:, 1:].clone()
        noisy = torch.rand(y.shape, generator=g) < NOISE["transformer"]
        y[noisy] = torch.randint(0, VOCAB, (int(noisy.sum()),), generator=g)
        if corrupt and step == at:
            y[CORRUPT_ROW] = (y[CORRUPT_ROW] + VOCAB // 2) % VOCAB  # every target flipped
        yield x, y


def _forecast_batches(corrupt: bool, at: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Sine waves of random frequency and phase, each reading with NOISE of noise; the
    target is the next reading."""
    g = torch.Generator().manual_seed(3)
    for step in itertools.count():
        b = BATCH["forecast"]
        freq = 0.3 + 0.5 * torch.rand(b, 1, generator=g)
        phase = 2 * math.pi * torch.rand(b, 1, generator=g)
        seq = torch.sin(freq * torch.arange(LENGTH + 1) + phase)
        seq = seq + NOISE["forecast"] * torch.randn(seq.shape, generator=g)
        if corrupt and step == at:
            seq[CORRUPT_ROW] *= 1000.0  # a sensor that reported in the wrong unit
        yield seq[:, :-1], seq[:, 1:]


def _cnn_batches(corrupt: bool, at: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """8x8 images of one of 4 bars (row/column, top/left half) with noise; NOISE of the
    labels random."""
    g = torch.Generator().manual_seed(2)
    for step in itertools.count():
        b = BATCH["cnn"]
        y = torch.randint(0, 4, (b,), generator=g)
        x = 0.3 * torch.randn(b, 1, 8, 8, generator=g)
        for i, c in enumerate(y.tolist()):
            pos = int(torch.randint(0, 4, (1,), generator=g)) + (4 if c % 2 else 0)
            if c < 2:
                x[i, 0, pos, :] += 1.0
            else:
                x[i, 0, :, pos] += 1.0
        noisy = torch.rand(b, generator=g) < NOISE["cnn"]
        y[noisy] = torch.randint(0, 4, (int(noisy.sum()),), generator=g)
        if corrupt and step == at:
            x[CORRUPT_ROW] = 1000.0 * torch.randn(1, 8, 8, generator=g)  # a broken sensor
        yield x, y


def _schedule(steps: int, spike_at: int | None = None) -> Any:
    """Linear warm-up over ``WARMUP`` steps (scaled to the run), then cosine to zero;
    ``spike_at``: that one step's rate ``LR_SPIKE`` times the schedule's (a bug in a
    hand-written schedule, or a resume that restored the wrong rate for a step)."""
    warm = max(1, WARMUP * steps // STEPS)

    def factor(step: int) -> float:
        spike = LR_SPIKE if step == spike_at else 1.0
        if step < warm:
            return spike * (step + 1) / warm
        return spike * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))

    return factor


def build(kind: str) -> tuple[nn.Module, Any, Any]:
    """The model, its batches (a function of ``corrupt``) and its loss, seeded."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model: nn.Module = {"transformer": TinyLM, "cnn": TinyCNN,
                            "forecast": TinyForecaster}[kind]()
    if kind == "forecast":
        return model, _forecast_batches, nn.functional.mse_loss
    if kind == "transformer":
        def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(out.reshape(-1, VOCAB), y.reshape(-1))

        return model, _lm_batches, loss_fn
    return model, _cnn_batches, nn.functional.cross_entropy


def corrupt_step(steps: int) -> int:
    """The step whose batch holds the corrupted example (70% into the run)."""
    return CORRUPT_STEP * steps // STEPS


def run(kind: str, corrupt: bool, *, monitor: bool = True, steps: int = STEPS,
        lr_spike: bool = False, **options: Any) -> tuple[gs.GradMonitor | None, str | None]:
    """Train ``steps`` steps (warm-up + cosine, AdamW); returns the monitor (None with
    ``monitor=False``) and the corrupted example's id (None for a clean run).
    ``lr_spike``: the clean data, but the learning rate of step ``corrupt_step(steps)`` is
    ``LR_SPIKE`` x the schedule's: the next step's loss and gradient norm jump, and no one
    example is the cause."""
    model, batches, loss_fn = build(kind)
    at, b = corrupt_step(steps), BATCH[kind]
    lr = 1e-2 if kind == "cnn" else 3e-3
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(steps, at if lr_spike else None))
    mon = gs.GradMonitor(model, optimizer=opt, **options) if monitor else None
    try:
        for step, (x, y) in zip(range(steps), batches(corrupt, at), strict=False):
            if mon is not None:
                mon.observe_batch_ids(range(ID0 + step * b, ID0 + (step + 1) * b))
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            if mon is not None:
                mon.observe_loss(loss)
            loss.backward()
            opt.step()
            sched.step()
    finally:
        if mon is not None:
            mon.remove()
    truth = str(ID0 + at * b + CORRUPT_ROW) if corrupt else None
    return mon, truth
