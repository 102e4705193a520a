"""Sweep the projection kernels' configs on the GPU (BF16 operands; the MXFP8 path runs the same
kernel after dequantizing): the Triton head kernel's and, on Hopper, the warp-specialized Gluon
kernel's, each checked byte for byte against the head kernel's default config."""
import torch

from graphrt.bench.proj import HEADS, K, NOPE, ROPE, TOKENS
from graphrt.bench.timing import stream_time_us
from graphrt.ops.proj_rope.kernels import HeadConfig, head_config, launch_head

CONFIGS = [HeadConfig(*c) for c in [(64, 64, 4, 3)]]
WS_CONFIGS = [(64, 3, 128, 96), (32, 6, 128, 96)]   # block_k, stages, MMA, epilogue registers


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
        if isinstance(cfg, HeadConfig):
            launch_head(cfg, x, w, cos, sin, *outs, tokens=TOKENS, k=K, heads=HEADS, nope=NOPE,
                        rope=ROPE, w_out_in=True, dot_fp32=False)
        else:
            launch_ws(cfg, x, w, cos, sin, *outs, tokens=TOKENS, k=K, heads=HEADS, nope=NOPE,
                      rope=ROPE, w_out_in=True)
    configs = CONFIGS
    if torch.cuda.get_device_capability()[0] == 9:
        from graphrt.ops.proj_rope.kernels_ws import WsConfig, launch_ws
        configs = CONFIGS + [WsConfig(*c) for c in WS_CONFIGS]
    run(head_config(False))
    ref = [o.clone() for o in outs]
    for cfg in configs:
        try:
            for o in outs:
                o.fill_(0xFF)
            run(cfg)
            same = min((o == r).float().mean().item() for o, r in zip(outs, ref))
            us = stream_time_us(lambda: run(cfg))
            print(f"  {cfg}: {us:.1f} us {flops / us / 1e6:.0f} TFLOP/s {us / gemm_us:.2f}x GEMM "
                  f"bytes equal to the head kernel's: {same:.6f}", flush=True)
        except Exception as e:
            print(f"  {cfg}: failed {type(e).__name__}: {str(e)[:150]}", flush=True)


if __name__ == "__main__":
    main()
