"""Times the plans whose Hopper kernels are written in Gluon (grouped wgrad in every layout,
x256 and odd counts, both FP8 recipes; the projection, BF16 and MXFP8 inputs) under the Triton
this process imports, one JSON line per row, so that runs under two Tritons on one GPU compare.
``--no-gluon`` turns the Gluon kernels off first (what a Triton graphrt has not tested gets);
``--first`` times only the first wgrad case.

Usage (device machine): python3 scripts/triton_versions.py [--no-gluon] [--first] > rows.jsonl
"""
import json
import sys

import triton

if "--no-gluon" in sys.argv:   # before any kernel module reads it
    from graphrt import kernel_utils
    kernel_utils.ON_TESTED_TRITON = False

import torch  # noqa: E402

from graphrt.bench import proj, wgrad  # noqa: E402
from graphrt.bench.timing import rotating, stream_time_us  # noqa: E402
from graphrt.ops import GemmProjRopeMxfp8, GroupedGemmWgrad  # noqa: E402


def emit(**row) -> None:
    row.update(triton=triton.__version__, gluon="--no-gluon" not in sys.argv)
    print(json.dumps(row), flush=True)


def wgrad_rows(cases) -> None:
    gen = torch.Generator().manual_seed(0)
    for experts, hidden, inter, tokens in cases:
        aligned = wgrad.random_counts(experts, tokens, gen)
        flops = 2.0 * hidden * inter * tokens
        out = torch.empty(experts, hidden, inter, dtype=torch.bfloat16, device="cuda")
        for counts_name, counts in (("x256", aligned), ("odd", wgrad.odd_counts(aligned, gen))):
            offsets = wgrad.offsets_of(counts)
            impls = {}
            for a_major, b_major, order in wgrad.LAYOUTS:
                sets = [wgrad._operands(tokens, hidden, inter, a_major, b_major)
                        for _ in range(2)]
                plan = GroupedGemmWgrad(sets[0][0], sets[0][1], offsets,
                                        input_order=order).compile()
                ws = wgrad.call_workspace(plan, tokens)
                impls[f"A {a_major} B {b_major} {order}"] = rotating(
                    lambda a, b, plan=plan, ws=ws: plan.execute(a, b, offsets, wgrad=out,
                                                                workspace=ws), sets)
            if counts_name == "x256":
                impls.update(wgrad._fp8_impls(tokens, hidden, inter, offsets, out))
            for name, f in impls.items():
                us = stream_time_us(f)
                emit(op="wgrad", case=f"E{experts} {hidden}x{inter} T{tokens}",
                     counts=counts_name, layout=name, us=round(us, 1),
                     tflops=round(flops / (us * 1e-6) / 1e12, 1))


def proj_rows() -> None:
    tokens, k, heads, d = proj.TOKENS, proj.K, proj.HEADS, proj.NOPE + proj.ROPE
    x, w, cos, sin, xq, xs, wq, wsc = proj.operands()
    for name, args, kw in (("BF16", (x, w), {}),
                           ("MXFP8 in", (xq, wq), {"x_scale": xs, "w_scale": wsc})):
        plan = GemmProjRopeMxfp8(*args, cos, sin, **kw).compile()
        outs = plan.allocate_outputs(*args, cos, sin, **kw)
        scratch = torch.empty(plan.workspace_bytes(), dtype=torch.uint8, device="cuda")
        us = stream_time_us(lambda: plan.execute(*args, cos, sin, **kw, **outs,
                                                 workspace=scratch))
        emit(op="proj", case=f"T{tokens} K{k} {heads}x{d}", layout=name, us=round(us, 1),
             tflops=round(2.0 * tokens * k * heads * d / (us * 1e-6) / 1e12, 1))


if __name__ == "__main__":
    proj_rows()
    wgrad_rows(wgrad.CASES[:1] if "--first" in sys.argv else wgrad.CASES)
