"""Small models shared by the capture example, benchmark and tests."""
from __future__ import annotations

import torch

from ..nn import RMSNorm


class Block(torch.nn.Module):
    """Pre-norm MLP block: x + W2 GELU(W1 RMSNorm(x)), BF16."""

    def __init__(self, hidden: int, ffn: int, device=None):
        super().__init__()
        self.norm = RMSNorm(hidden, device=device)
        self.up = torch.nn.Linear(hidden, ffn, bias=False, device=device, dtype=torch.bfloat16)
        self.down = torch.nn.Linear(ffn, hidden, bias=False, device=device, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Stack(torch.nn.Sequential):
    """``layers`` Blocks and a final RMSNorm: a small transformer-like stack without attention."""

    def __init__(self, hidden: int = 512, ffn: int = 1024, layers: int = 4, device=None):
        super().__init__(*[Block(hidden, ffn, device) for _ in range(layers)],
                         RMSNorm(hidden, device=device))


def mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.mse_loss(out.float(), target.float())
