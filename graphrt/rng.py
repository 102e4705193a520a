"""Graph-safe random state: (seed, offset) in device memory, read by random kernels."""
from __future__ import annotations

import torch


class RngState:
    """A device-resident (seed, offset) pair. Random kernels read both from ``state`` and the
    caller then ``advance``s the offset on the stream, so a captured CUDA graph draws fresh
    values on every replay, and an eager run from the same (seed, offset) draws the same ones.

    >>> rng = graphrt.runtime().rng                  # doctest: +SKIP
    >>> rng.set(1234, 0)                             # doctest: +SKIP
    """

    def __init__(self, device: torch.device, seed: int = 0, offset: int = 0):
        self.device = torch.device(device)
        self.state = torch.tensor([seed, offset], dtype=torch.int64, device=self.device)

    def set(self, seed: int, offset: int = 0) -> None:
        """Set (seed, offset); not capturable (it copies from the host)."""
        self.state.copy_(torch.tensor([int(seed), int(offset)], dtype=torch.int64))

    def get(self) -> tuple[int, int]:
        """(seed, offset) on the host; synchronizes."""
        seed, offset = self.state.tolist()
        return seed, offset

    def advance(self, count: int) -> None:
        """Move the offset on by ``count`` on the current stream (capturable)."""
        self.state[1:].add_(int(count))

    def snapshot(self) -> torch.Tensor:
        return self.state.clone()

    def restore(self, snapshot: torch.Tensor) -> None:
        self.state.copy_(snapshot)
