"""DeepSeek-V4-like blocks captured as one CUDA graph each (forward + backward), replays checked
against eager execution with verify_replay:

1. the mHC projection/RMS stage gating 4 residual streams, then an RMSNorm/MLP;
2. the same stage with RMSNorm, an MoE MLP of grouped expert weights (weight gradients on a side
   stream, overlapped with the input gradients; routing changes every step) and the MLA Q
   projection fused with RoPE and MXFP8 quantization.

    python examples/deepseek_block.py [--tokens 1024]
"""
from __future__ import annotations

import argparse

import torch

from graphrt.models import DeepSeekBlock, MhcBlock, loss_and_grads, mse
from graphrt.capture import capture, verify_replay


def _random_routing(rows: int, experts: int, step: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(step)
    cuts = sorted(torch.randint(0, rows + 1, (experts - 1,), generator=gen).tolist())
    return torch.tensor(cuts + [rows], dtype=torch.int32, device="cuda")


def run(tokens: int = 1024, hidden: int = 1024, streams: int = 4, out=print):
    if not torch.cuda.is_available():
        out(f"deepseek_block: no GPU here, so the MoE block, the capture and the timings are "
            f"skipped: the mHC block ({tokens} tokens, hidden {hidden}, {streams} streams) runs "
            f"eagerly on the CPU reference kernels")
        block = MhcBlock(hidden, streams, 2 * hidden)
        x = torch.randn(tokens, streams * hidden, dtype=torch.bfloat16)
        loss, *grads = loss_and_grads(block)(x, x)
        out(f"  mHC block: loss {loss.item():.5f}, {len(grads)} gradients")
        return None
    torch.manual_seed(0)
    block = MhcBlock(hidden, streams, 2 * hidden, device="cuda")
    step = loss_and_grads(block)

    def batch(_step=0):
        return (torch.randn(tokens, streams * hidden, dtype=torch.bfloat16, device="cuda"),
                torch.randn(tokens, streams * hidden, dtype=torch.bfloat16, device="cuda"))

    fragment = capture(step, *batch())
    out(f"mHC block: {tokens} tokens, {streams} streams x {hidden}; captured forward + backward: "
        f"{fragment.nodes()}")
    report = verify_replay(fragment, step, batch, steps=3)
    out(str(report))

    experts, rows = 8, tokens * streams
    moe = DeepSeekBlock(hidden, streams, experts, 2 * hidden, heads=8, device="cuda")
    params = list(moe.parameters())
    cos = torch.randn(rows, 64, device="cuda").to(torch.bfloat16)

    def moe_step(x, target, offsets):
        y, q = moe(x, offsets, cos, cos)
        loss = mse(y, target)
        return (loss.detach(), q.out_fp8_row.view(torch.uint8), *torch.autograd.grad(loss, params))

    def moe_batch(i=0):
        return (*batch(), _random_routing(rows, experts, i))

    fragment = capture(moe_step, *moe_batch())
    out(f"MoE block (experts' wgrad on a side stream, Q projection + RoPE + MXFP8): "
        f"{fragment.nodes()}, {fragment.shape()}")
    moe_report = verify_replay(fragment, moe_step, moe_batch, steps=3)
    out(str(moe_report))
    return report, moe_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--streams", type=int, default=4)
    args = parser.parse_args()
    run(args.tokens, args.hidden, args.streams)


if __name__ == "__main__":
    main()
