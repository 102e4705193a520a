"""Projection GEMM + RoPE + MXFP8 against the cuBLAS GEMM alone and the unfused pipeline
(eager and torch.compile)."""
from __future__ import annotations

import torch

from ..ops import GemmProjRopeMxfp8
from ..ops.proj_rope import gemm_proj_rope_mxfp8_reference, mxfp8_quantize
from ..ops.registry import op
from . import report
from .timing import BF16_GEMM_CEILING_TFLOPS, device_time_us, stream_time_us

TOKENS, K, HEADS, NOPE, ROPE = op("gemm_proj_rope_mxfp8").cases[0]


def operands() -> tuple:
    """(x, w, cos, sin) in BF16 at the benchmark case, then x's and w's MXFP8 codes and scales
    (xq, xs, wq, ws)."""
    d = NOPE + ROPE
    x = torch.randn(TOKENS, K, dtype=torch.bfloat16, device="cuda")
    w = (torch.randn(HEADS * d, K, device="cuda") / K ** 0.5).to(torch.bfloat16)
    cos = torch.randn(TOKENS, ROPE, device="cuda").to(torch.bfloat16)
    sin = torch.randn(TOKENS, ROPE, device="cuda").to(torch.bfloat16)
    return (x, w, cos, sin, *mxfp8_quantize(x.float(), 1), *mxfp8_quantize(w.float(), 1))


def run(progress=print) -> list[dict]:
    progress(f"proj tokens={TOKENS} K={K} heads={HEADS}x{NOPE + ROPE} ...")
    d = NOPE + ROPE
    x, w, cos, sin, xq, xs, wq, ws = operands()
    plans = {"graphrt (BF16)": (GemmProjRopeMxfp8(x, w, cos, sin).compile(), (x, w), {}),
             "graphrt (MXFP8 in)": (GemmProjRopeMxfp8(xq, wq, cos, sin, x_scale=xs,
                                                      w_scale=ws).compile(), (xq, wq),
                                    {"x_scale": xs, "w_scale": ws})}
    outs = plans["graphrt (BF16)"][0].allocate_outputs(x, w, cos, sin)

    def pipeline(x, w):
        return gemm_proj_rope_mxfp8_reference(x, w, cos, sin)

    compiled = torch.compile(pipeline)
    scratch = {name: torch.empty(p.workspace_bytes(), dtype=torch.uint8, device="cuda")
               for name, (p, _, _) in plans.items()}
    impls = {name: (lambda p=p, a=a, kw=kw, ws=scratch[name]:
                    p.execute(*a, cos, sin, **kw, **outs, workspace=ws))
             for name, (p, a, kw) in plans.items()}
    impls["cuBLAS GEMM alone"] = lambda: x @ w.t()
    impls["eager pipeline"] = lambda: pipeline(x, w)
    impls["torch.compile pipeline"] = lambda: compiled(x, w)
    flops = 2.0 * TOKENS * K * HEADS * d
    times = {k: stream_time_us(f) for k, f in impls.items()}
    rows = []
    for name, us in times.items():
        tflops = flops / (us * 1e-6) / 1e12
        rows.append({"impl": name, "us": us, "TFLOP/s": tflops,
                     "of_ceiling": tflops / BF16_GEMM_CEILING_TFLOPS,
                     "vs_gemm_alone": us / times["cuBLAS GEMM alone"],
                     "do_bench_us": device_time_us(impls[name])})
    return rows


def main(progress=print) -> list[dict]:
    return report.publish("proj", run(progress), progress,
                          legend="vs_gemm_alone: time over the bf16 cuBLAS GEMM's (target: at most "
                                 "1.15 for the BF16 path)")
