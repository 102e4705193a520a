"""Sweep the projection head kernel's configs on the GPU (BF16 operands; the MXFP8 path runs the
same kernel after dequantizing), each checked byte for byte against the default config."""
import torch

from graphrt.bench.proj import HEADS, K, NOPE, ROPE, TOKENS
from graphrt.bench.timing import stream_time_us
from graphrt.ops.proj_rope.kernels import HeadConfig, head_config, launch_head

CONFIGS = [HeadConfig(*c) for c in [(64, 64, 4, 3), (128, 64, 8, 3), (64, 32, 4, 4),
                                     (64, 32, 4, 6), (64, 128, 4, 2)]]


def main():
    d = NOPE + ROPE
    x = torch.randn(TOKENS, K, dtype=torch.bfloat16, device="cuda")
    w = (torch.randn(HEADS * d, K, device="cuda") / K ** 0.5).to(torch.bfloat16)
    cos = torch.randn(TOKENS, ROPE, device="cuda").to(torch.bfloat16)
    sin = torch.randn(TOKENS, ROPE, device="cuda").to(torch.bfloat16)
    outs = [torch.empty(TOKENS, HEADS, d, dtype=torch.uint8, device="cuda"),
            torch.empty(TOKENS, HEADS, d // 32, dtype=torch.uint8, device="cuda"),
            torch.empty(TOKENS, HEADS, d, dtype=torch.uint8, device="cuda"),
            torch.empty(TOKENS // 32, HEADS, d, dtype=torch.uint8, device="cuda")]
    flops = 2.0 * TOKENS * K * HEADS * d
    gemm_us = stream_time_us(lambda: x @ w.t())
    print(f"cuBLAS GEMM alone: {gemm_us:.1f} us {flops / gemm_us / 1e6:.0f} TFLOP/s", flush=True)

    def run(cfg):
        launch_head(cfg, x, w, cos, sin, *outs, tokens=TOKENS, k=K, heads=HEADS, nope=NOPE,
                    rope=ROPE, w_out_in=True, dot_fp32=False)
    run(head_config(False))
    ref = [o.clone() for o in outs]
    for cfg in CONFIGS:
        try:
            for o in outs:
                o.fill_(0xFF)
            run(cfg)
            same = all(torch.equal(o, r) for o, r in zip(outs, ref))
            us = stream_time_us(lambda: run(cfg))
            print(f"  {cfg}: {us:.1f} us {flops / us / 1e6:.0f} TFLOP/s {us / gemm_us:.2f}x GEMM "
                  f"same={same}", flush=True)
        except Exception as e:
            print(f"  {cfg}: failed {type(e).__name__}: {str(e)[:150]}", flush=True)


if __name__ == "__main__":
    main()
