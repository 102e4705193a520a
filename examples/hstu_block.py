"""An HSTU-style block (fused LayerNorm-Multiply-SiLU-Dropout over (x, u) and an output
projection) whose forward and backward is captured as one CUDA graph. Dropout draws from the
runtime's device-side (seed, offset), which the graph advances, so every replay sees fresh masks;
verify_replay checks each replay against eager execution from the same random state.

    python examples/hstu_block.py [--rows 65536] [--d 512]
"""
from __future__ import annotations

import argparse

import torch

import graphrt
from graphrt.models import HstuBlock, loss_and_grads
from graphrt.capture import capture, verify_replay


def run(rows: int = 65536, d: int = 512, out=print):
    if not torch.cuda.is_available():
        out(f"hstu_block: no GPU here, so the capture and the timings are skipped: the block "
            f"({rows} rows, d {d}) runs eagerly on the CPU reference kernels")
        block = HstuBlock(d, 0.1)
        step = loss_and_grads(block, lambda xu: block(*xu.chunk(2, dim=1)))
        loss, *_ = step(torch.randn(rows, 2 * d, dtype=torch.bfloat16),
                        torch.randn(rows, d, dtype=torch.bfloat16))
        out(f"  loss {loss.item():.5f}")
        return None
    torch.manual_seed(0)
    block = HstuBlock(d, 0.1, device="cuda")
    step = loss_and_grads(block, lambda xu: block(*xu.chunk(2, dim=1)))

    def batch(_step=0):
        return (torch.randn(rows, 2 * d, dtype=torch.bfloat16, device="cuda"),
                torch.randn(rows, d, dtype=torch.bfloat16, device="cuda"))

    graphrt.runtime().rng.set(2026, 0)
    fragment = capture(step, *batch())
    out(f"HSTU block: {rows} rows x {d}; captured forward + backward: {fragment.nodes()}")
    report = verify_replay(fragment, step, batch, steps=3)
    out(str(report))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=65536)
    parser.add_argument("--d", type=int, default=512)
    args = parser.parse_args()
    run(args.rows, args.d)


if __name__ == "__main__":
    main()
