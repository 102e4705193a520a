"""A DeepSeek-V4-like block (mHC projection/RMS stage gating 4 residual streams, then an
RMSNorm/MLP) whose whole forward and backward is captured as one CUDA graph; replays are checked
against eager execution with verify_replay.

    python examples/deepseek_block.py [--tokens 1024]
"""
from __future__ import annotations

import argparse

import torch

from graphrt.bench.models import MhcBlock, loss_and_grads
from graphrt.capture import capture, verify_replay


def run(tokens: int = 1024, hidden: int = 1024, streams: int = 4, out=print):
    if not torch.cuda.is_available():
        out("CUDA graphs need a GPU; running the block eagerly on the CPU reference path.")
        block = MhcBlock(64, streams, 128)
        x = torch.randn(16, streams * 64, dtype=torch.bfloat16)
        loss, *grads = loss_and_grads(block)(x, x)
        out(f"  loss {loss.item():.5f}, {len(grads)} gradients")
        return None
    torch.manual_seed(0)
    block = MhcBlock(hidden, streams, 2 * hidden, device="cuda")
    step = loss_and_grads(block)

    def batch(_step=0):
        return (torch.randn(tokens, streams * hidden, dtype=torch.bfloat16, device="cuda"),
                torch.randn(tokens, streams * hidden, dtype=torch.bfloat16, device="cuda"))

    fragment = capture(step, *batch())
    out(f"deepseek_block: {tokens} tokens, {streams} streams x {hidden}; captured forward + "
        f"backward: {fragment.nodes()}")
    report = verify_replay(fragment, step, batch, steps=3)
    out(str(report))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=1024)
    run(parser.parse_args().tokens)


if __name__ == "__main__":
    main()
