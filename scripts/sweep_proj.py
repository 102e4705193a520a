"""Sweep the projection head kernel's configs on the GPU, BF16 and MXFP8 paths, each checked
byte for byte against the default config (device machine)."""
import torch

from graphrt.bench.proj import HEADS, K, NOPE, ROPE, TOKENS
from graphrt.bench.timing import stream_time_us
from graphrt.ops.proj_rope import mxfp8_quantize
from graphrt.ops.proj_rope.kernels import HeadConfig, head_config, launch_head

CONFIGS = {"bf16": [HeadConfig(*c) for c in [(128, 64, 8, 3), (64, 64, 4, 3), (64, 64, 4, 2),
                                              (64, 64, 8, 3), (128, 32, 8, 4), (64, 32, 4, 4),
                                              (64, 128, 8, 2)]],
           "mxfp8": [HeadConfig(*c, fp8_mma=True) for c in [(128, 32, 8, 6), (128, 32, 8, 4),
                                                            (64, 32, 4, 6), (64, 32, 8, 6),
                                                            (128, 32, 16, 6)]]}


def main():
    d = NOPE + ROPE
    x = torch.randn(TOKENS, K, dtype=torch.bfloat16, device="cuda")
    w = (torch.randn(HEADS * d, K, device="cuda") / K ** 0.5).to(torch.bfloat16)
    cos = torch.randn(TOKENS, ROPE, device="cuda").to(torch.bfloat16)
    sin = torch.randn(TOKENS, ROPE, device="cuda").to(torch.bfloat16)
    xq, xs = mxfp8_quantize(x.float(), 1)
    wq, ws = mxfp8_quantize(w.float(), 1)
    outs = [torch.empty(TOKENS, HEADS, d, dtype=torch.uint8, device="cuda"),
            torch.empty(TOKENS, HEADS, d // 32, dtype=torch.uint8, device="cuda"),
            torch.empty(TOKENS, HEADS, d, dtype=torch.uint8, device="cuda"),
            torch.empty(TOKENS // 32, HEADS, d, dtype=torch.uint8, device="cuda")]
    flops = 2.0 * TOKENS * K * HEADS * d
    gemm_us = stream_time_us(lambda: x @ w.t())
    print(f"cuBLAS GEMM alone: {gemm_us:.1f} us {flops / gemm_us / 1e6:.0f} TFLOP/s", flush=True)
    for path, (a, b, a_s, b_s) in {"bf16": (x, w, None, None),
                                   "mxfp8": (xq.view(torch.uint8), wq.view(torch.uint8), xs, ws)}.items():
        def run(cfg):
            launch_head(cfg, a, a_s, b, b_s, cos, sin, *outs, tokens=TOKENS, k=K, heads=HEADS,
                        nope=NOPE, rope=ROPE, w_out_in=True, dot_fp32=False)
        run(head_config(False, path == "mxfp8"))
        ref = [o.clone() for o in outs]
        for cfg in CONFIGS[path]:
            try:
                for o in outs:
                    o.fill_(0xFF)
                run(cfg)
                same = all(torch.equal(o, r) for o, r in zip(outs, ref))
                us = stream_time_us(lambda: run(cfg))
                print(f"  {path} {cfg}: {us:.1f} us {flops / us / 1e6:.0f} TFLOP/s "
                      f"{us / gemm_us:.2f}x GEMM same={same}", flush=True)
            except Exception as e:
                print(f"  {path} {cfg}: failed {type(e).__name__}: {str(e)[:150]}", flush=True)


if __name__ == "__main__":
    main()
