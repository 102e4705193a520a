"""What the grouped wgrad's Gluon structure gives FP8 tensor cores with no scaling at all: a
bound for issue 27's 1x128 goal (1.3x BF16's TFLOP/s; docs/perf/wgrad.md, 2026-12-07).

The 1x128 kernel (kernels_gluon.py) multiplies each 128-token block into a fresh FP32 tile and
scales it into the sum: 1.09-1.17x BF16's TFLOP/s. Here the BF16 K-K tensor2d kernel runs on
E4M3 codes instead, one long sum as in BF16 (no scales: not the contract's product, a bound):
the same loader, ring and 128 x 256 tiles of two MMA warpgroups, with m64n256k32 FP8
instructions and stages of 64 tokens (24 KB). If that reaches well past 1.3x, what holds the
1x128 kernel back is its scaling; if not, the structure itself (tile, loads, no TMA multicast
in Gluon 3.6) is the bound.

Each case, x256 counts: BF16 K-K (the package kernel), the same kernel on FP8 codes at 4, 6 and
8 stages, at its 128 x 256 tiles and at the 1x128 kernel's 128 x 128 (each checked against FP32
per expert), and the 1x128 Gluon kernel on the same codes with FP32 scales, the plan's and at
128 x 192 tiles, with and without shared_spread (checked against the dequantized codes' FP32
product).

Usage: python3 scripts/fp8_unscaled.py [--short]
"""
import itertools
import sys

import torch

from graphrt.bench.timing import stream_time_us
from graphrt.bench.wgrad import offsets_of, random_counts
from graphrt.device_checks import error_flags
from graphrt.ops.grouped_gemm import kernels_gluon as fp8k
from graphrt.ops.grouped_gemm import kernels_tensor2d as t2d
from graphrt.ops.registry import op

STAGES = (4, 6, 8)
# with --short: none at 128 x 256 (all three measured on 2026-12-07), one at
# 128 x 128
SHORT_STAGES, SHORT_STAGES_128 = (), (8,)
# the 1x128 kernel at 128 x 192 tiles (two products a block, 128 and 64 columns), scales
# spread after the product's wait (the spill at 192 without, 244 B, leaves that form out),
# and with its scales spread through its own shared buffers (``shared_spread``), the plan's
# tile too (128 x 160 read 0.90-1.00x BF16 on 2026-12-07 and is left out)
SCALED_CONFIGS = [fp8k.GluonConfig(192, 4, 240, True), fp8k.GluonConfig(128, 6, 232, False, True),
                  fp8k.GluonConfig(192, 4, 240, True, True)]


def main(short: bool):
    print(f"device {torch.cuda.get_device_name(0)}", flush=True)
    gen = torch.Generator().manual_seed(0)
    for experts, hidden, inter, tokens in op("grouped_gemm_wgrad").cases:
        counts = random_counts(experts, tokens, gen)
        offsets = offsets_of(counts)
        a16 = torch.randn(hidden, tokens, device="cuda", dtype=torch.bfloat16)
        b16 = torch.randn(inter, tokens, device="cuda", dtype=torch.bfloat16).t()
        a8 = torch.randn(hidden, tokens, device="cuda").to(torch.float8_e4m3fn)
        b8 = torch.randn(inter, tokens, device="cuda").to(torch.float8_e4m3fn).t()
        blocks = tokens // 128
        a_scale = (torch.rand(blocks, hidden, device="cuda") + 0.5).t()
        b_scale = torch.rand(blocks, inter, device="cuda") + 0.5
        out = torch.empty(experts, hidden, inter, device="cuda", dtype=torch.bfloat16)
        errors = error_flags(a16.device)
        flop = 2.0 * hidden * inter * tokens

        def tensor2d(a, b, stages, block_n=256):
            cfg = t2d.Tensor2dTmaConfig(stages=stages, block_n=block_n)
            return lambda: t2d.launch_wgrad_tensor2d_tma(
                a, b, offsets, out, None, torch.bfloat16, errors, hidden=hidden, inter=inter,
                accumulate=False, config=cfg)

        runs = {"BF16 K-K, 4 stages (the package's)": tensor2d(a16, b16, 4)}
        for stages in SHORT_STAGES if short else STAGES:
            runs[f"FP8 codes unscaled, {stages} stages"] = tensor2d(a8, b8, stages)
        for stages in SHORT_STAGES_128 if short else STAGES:   # the 1x128 kernel's tile
            runs[f"FP8 codes unscaled, 128 x 128, {stages} stages"] = tensor2d(a8, b8, stages,
                                                                                128)

        def scaled(config=fp8k.GLUON_CONFIG):
            return lambda: fp8k.launch_wgrad_fp8_gluon(
                a8, b8, a_scale, b_scale, offsets, out, None, torch.bfloat16, errors,
                hidden=hidden, inter=inter, accumulate=False, config=config)

        runs["1x128 Gluon kernel (the plan's)"] = scaled()
        for config in SCALED_CONFIGS:
            runs[f"1x128 Gluon kernel, {config}"] = scaled(config)
        a_val = a8.float() * a_scale.repeat_interleave(128, dim=1)
        b_val = b8.float() * b_scale.repeat_interleave(128, dim=0)
        begins = [0] + list(itertools.accumulate(counts))[:-1]
        for name, fn in runs.items():
            if "BF16" in name:
                continue
            a_ref, b_ref = (a8, b8) if "unscaled" in name else (a_val, b_val)
            out.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            worst = 0.0
            for e, (lo, n) in enumerate(zip(begins, counts)):
                ref = a_ref[:, lo:lo + n].float() @ b_ref[lo:lo + n].float()
                err = (out[e].float() - ref).norm() / ref.norm().clamp_min(1e-30)
                worst = max(worst, err.item())
            print(f"  {name}: worst relative error against FP32 per expert {worst:.2e}",
                  flush=True)
        print(f"E{experts} {hidden}x{inter} T{tokens}:", flush=True)
        base = None
        for name, fn in runs.items():
            us = stream_time_us(fn, calls=5, repeats=5)
            tflops = flop / us / 1e6
            base = base or tflops
            print(f"  {name:<48} {us:9.1f} us  {tflops:7.1f} TFLOP/s  ({tflops / base:.3f}x "
                  f"BF16's)", flush=True)


if __name__ == "__main__":
    main("--short" in sys.argv[1:])
