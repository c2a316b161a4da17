"""The fixed-seed sketch of a tensor: ``k`` numbers that are the same linear function of the
tensor's values in every run, process and machine.

Element ``i`` of the flattened tensor (row-major, the logical order) is given the sign
``s_j``, ``j = i mod PERIOD``, a random ±1 drawn from a generator seeded per block of
``BLOCK`` elements (so the signs of element ``i`` do not depend on the tensor's size), and goes
to bucket ``j mod k``: ``sketch_b = sum over i with (i mod PERIOD) mod k = b of s_(i mod
PERIOD) x_i``. It is a count sketch: linear, ``E |S x|^2 = |x|^2``, so ``|S a - S b| / |S a|``
estimates the relative error ``|a - b| / |a|`` (within about 25% at ``k = 32`` for an error
spread over many elements), and the sketch of a shard holding elements ``o, o+1, ...`` of the
full tensor, computed with those elements' signs and buckets, adds up over the shards to the
sketch of the full tensor. A tensor longer than ``PERIOD`` is first folded (its chunks of
``PERIOD`` elements summed), so the signs kept on a device never take more than 4 MiB.

The cost is a few vectorised passes over the tensor on its own device: the fold (long tensors
only), a multiplication by the signs, one reduction into ``k`` buckets, the norm and the
max-abs; the non-finite count is one more pass, on the CPU only when the norm is not finite.
Sums accumulate in float32 (float64 for float64 tensors). Nothing is read back to the host
from another device: ``stats`` returns a small float64 tensor that the recorder reads with all
the others when it ends.
"""

from __future__ import annotations

import math
from typing import Any

import torch

#: The sketch's size.
K = 32
#: The seed every run uses (a run records it, and runs with different seeds do not compare).
SEED = 20261207
#: Signs are drawn per block of this many elements (so a prefix never depends on the length).
BLOCK = 1 << 16
#: The signs repeat with this period (odd: the element ``PERIOD`` after another falls in
#: another bucket); longer tensors are folded to it first.
PERIOD = (1 << 20) + 1

FLOATS = (torch.float64, torch.float32, torch.float16, torch.bfloat16)


def is_float(t: Any) -> bool:
    """``t`` is a tensor of a real floating-point dtype (float8 included)."""
    return isinstance(t, torch.Tensor) and t.is_floating_point()


class Projector:
    """The signs of the sketch, per device and dtype (see the module's docstring)."""

    def __init__(self, k: int = K, seed: int = SEED) -> None:
        self.k = k
        self.seed = seed
        self.cpu = torch.zeros(0, dtype=torch.bool)
        self.on: dict[Any, torch.Tensor] = {}

    def _grow(self, n: int) -> None:
        have = self.cpu.numel()
        want = min(max(n, 2 * have), PERIOD)
        blocks = [self.cpu]
        for b in range(have // BLOCK, -(-want // BLOCK)):
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + b)
            blocks.append(torch.rand(BLOCK, generator=g) < 0.5)
        self.cpu = torch.cat(blocks)[:PERIOD]
        self.on = {}

    def signs(self, n: int, device: Any, dtype: Any = torch.bool) -> torch.Tensor:
        """The signs of elements ``0 .. n-1`` (``n <= PERIOD``) on ``device``: bools (True:
        +1), or ±1 in a floating ``dtype``."""
        if self.cpu.numel() < n:
            self._grow(n)
        key = (device, dtype)
        held = self.on.get(key)
        if held is None or held.numel() < n:
            bits = self.cpu.to(device)
            held = bits if dtype == torch.bool else torch.where(bits, 1, -1).to(dtype)
            self.on[key] = held
        return held[:n]

    def shard_stats(self, t: torch.Tensor, offset: int) -> torch.Tensor:
        """``[sketch (k), norm², max-abs, non-finite count]`` of a shard whose first element
        is element ``offset`` of the full flattened tensor: each element signed and bucketed
        as in the full tensor, so summing the shards' rows (max-abs: their maximum) gives the
        full tensor's (the square root of the summed norm² its norm)."""
        x = t.detach().reshape(-1)
        if x.dtype not in FLOATS:
            x = x.float()
        n, k = x.numel(), self.k
        acc = torch.float64
        out = torch.zeros(k + 3, dtype=acc, device=x.device)
        if n == 0:
            return out
        idx = (torch.arange(n, device=x.device) + offset) % PERIOD
        signs = self.signs(PERIOD, x.device, acc)[idx]
        out[:k].index_add_(0, idx % k, x.to(acc) * signs)
        out[k] = torch.linalg.vector_norm(x, dtype=acc) ** 2
        out[k + 1] = x.abs().amax().to(acc)
        out[k + 2] = n - torch.isfinite(x).sum()
        return out

    def stats(self, t: torch.Tensor) -> torch.Tensor:
        """``[sketch (k), norm, max-abs, non-finite count]`` of ``t``'s values, float64, on
        ``t``'s device (no host transfer from another device)."""
        x = t.detach().reshape(-1)
        if x.dtype not in FLOATS:
            x = x.float()  # float8: no arithmetic of its own
        n = x.numel()
        k = self.k
        if n == 0:
            return torch.zeros(k + 3, dtype=torch.float64, device=x.device)
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        folded = x
        if n > PERIOD:
            q = n // PERIOD
            folded = x[: q * PERIOD].view(q, PERIOD).sum(0, dtype=acc)
            folded[: n - q * PERIOD] += x[q * PERIOD:]
        sign_dtype = folded.dtype if folded.dtype in (torch.float64, torch.float32) else acc
        y = folded * self.signs(folded.numel(), x.device, sign_dtype)
        m = (y.numel() // k) * k
        sketch = y[:m].view(-1, k).sum(0, dtype=acc)
        if m < y.numel():
            sketch[: y.numel() - m] += y[m:]
        norm = torch.linalg.vector_norm(x, dtype=acc)
        maxabs = x.abs().amax().to(acc)
        if x.device.type == "cpu" and math.isfinite(float(norm)):
            bad = torch.zeros(1, dtype=torch.float64)
        else:
            bad = (n - torch.isfinite(x).sum()).to(torch.float64).reshape(1)
        return torch.cat([sketch.to(torch.float64), norm.to(torch.float64).reshape(1),
                          maxabs.to(torch.float64).reshape(1), bad])
