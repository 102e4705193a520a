"""Small runs of every graphrt kernel for compute-sanitizer (memcheck, racecheck) on the device."""

import os

import torch

import graphrt
from graphrt.capture import uniform_
from graphrt.device_checks import error_flags
from graphrt.ops.grouped_gemm import kernels_gluon, kernels_ragged, kernels_tensor2d
from graphrt.ops.grouped_gemm.kernels import (fp8_config, launch_ragged_padded,
                                              launch_wgrad_fp8, PADDED_CONFIG,
                                              PaddedConfig, ragged_padded_bytes,
                                              ragged_padded_views)

# GRAPHRT_SANITIZE_GLUON_CONFIG=192,4,240,1,1: the 1x128 kernel's launches here at that
# GluonConfig (block_n, stages, mma_regs[, late_spread[, shared_spread]]), not the plan's
if os.environ.get("GRAPHRT_SANITIZE_GLUON_CONFIG"):
    fields = [int(f) for f in os.environ["GRAPHRT_SANITIZE_GLUON_CONFIG"].split(",")]
    kernels_gluon.GLUON_CONFIG = kernels_gluon.GluonConfig(*fields[:3], *map(bool, fields[3:]))
    print(f"the 1x128 kernel at {kernels_gluon.GLUON_CONFIG}", flush=True)
torch.manual_seed(0)
# each shape twice: the second call replays the first's binding, at the new tensors' addresses
for rows, hidden in [(3, 8), (37, 136), (300, 2048), (5, 9000)] * 2:
    x = torch.randn(rows, hidden, dtype=torch.bfloat16, device="cuda")
    res = torch.randn_like(x)
    w = torch.randn(hidden, device="cuda")
    y, rstd, h = graphrt.ops.rmsnorm_forward(x, w, residual=res)
    dx, dw = graphrt.ops.rmsnorm_backward(torch.randn_like(x), h, w, rstd, g_residual=torch.randn_like(x))
uniform_(torch.empty(3001, device="cuda"), graphrt.runtime().rng)
for t, k, n, n_pad in [(1, 64, 24, 24), (129, 1000, 24, 32), (300, 8, 1, 1)]:
    graphrt.ops.mhc_projection_backward(
        torch.randn(t, k, dtype=torch.bfloat16, device="cuda"), torch.randn(n, k, device="cuda"),
        torch.randn(t, n_pad, device="cuda"), torch.randn(t, 1, device="cuda"),
        torch.rand(t, 1, device="cuda") + 0.5, allow_tf32=True)
for n, d in [(1, 8), (37, 136), (64, 256), (300, 512)] * 2:
    x, u = (torch.randn(n, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    w, b = (torch.randn(d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    y, mean, rstd, mask = graphrt.ops.hstu_lmsd_forward(x, u, w, b, dropout_ratio=0.1, seed=1)
    flags = dict(dropout_ratio=0.1, apply_u_silu=True, concat_u=True, concat_x=True)
    args = (torch.randn_like(y), x, u, w, b, mean, rstd, mask)
    # the functional call sums dweight/dbias in its own launch (the arena's counters); a plan
    # with the caller's workspace, in a second launch
    graphrt.ops.hstu_lmsd_backward(*args, **flags)
    plan = graphrt.runtime().plan(graphrt.ops.HstuLmsdBackward, *args, **flags)
    plan.execute(*args, dx=torch.empty_like(x), du=torch.empty_like(u), dweight=torch.empty_like(w),
                 dbias=torch.empty_like(b),
                 workspace=torch.empty(plan.workspace_bytes(), dtype=torch.uint8, device="cuda"))
# every layout; [0, 17, 5, 0, 34] sums to 56: K-major operands take the 8-token path
for counts in ([0, 17, 5, 0, 33], [0, 17, 5, 0, 34], [64, 0], [16, 3, 8, 5]):
    offsets = torch.tensor(counts, dtype=torch.int32, device="cuda").cumsum(0).to(torch.int32)
    tokens = sum(counts)
    for a_k_major, b_k_major in ((False, False), (True, False), (True, True), (False, True)):
        a = torch.randn(tokens, 136, dtype=torch.bfloat16, device="cuda").t()
        b = torch.randn(tokens, 72, dtype=torch.bfloat16, device="cuda")
        graphrt.ops.grouped_gemm_wgrad(a.contiguous() if a_k_major else a,
                                       b.t().contiguous().t() if b_k_major else b, offsets)
        # Hopper's tensor2d TMA kernel, launched directly (K-major operands: tokens_sum a
        # multiple of 8), experts sharing its blocks of 64 tokens, both work splits
        a, b = (a.contiguous() if a_k_major else a), (b.t().contiguous().t() if b_k_major else b)
        if kernels_tensor2d.fits_tensor2d_kernel(a, b, torch.cuda.get_device_capability()):
            for sorted_experts in (True, False):
                kernels_tensor2d.launch_wgrad_tensor2d_tma(
                    a, b, offsets, torch.empty(len(counts), 136, 72, device="cuda"), None,
                    torch.float32, error_flags(a.device), hidden=136, inter=72,
                    accumulate=False,
                    config=kernels_tensor2d.Tensor2dTmaConfig(sorted_experts=sorted_experts))
    # ragged: hidden 136 (a multiple of 8) takes Hopper's TMA kernel; hidden 132 the Triton
    # kernel, where aligned experts (16, 8) load 8 tokens at a time and the others are first
    # copied as rows into the workspace the functional call allocates, or without one load two
    # bytes at a time
    for hidden in (136, 132):
        a = torch.randn(hidden, tokens, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(tokens, 72, dtype=torch.bfloat16, device="cuda")
        graphrt.ops.grouped_gemm_wgrad(a, b, offsets, input_order="tensor_ragged")
        graphrt.ops.GroupedGemmWgrad(a, b, offsets, input_order="tensor_ragged").compile().execute(
            a, b, offsets, wgrad=torch.empty(len(counts), hidden, 72, dtype=torch.bfloat16,
                                             device="cuda"))
    # the TMA kernel launched directly with its other split (experts in order)
    a = torch.randn(136, tokens, dtype=torch.bfloat16, device="cuda")
    kernels_ragged.launch_wgrad_ragged_tma(
        a, b, offsets, torch.empty(len(counts), 136, 72, dtype=torch.bfloat16, device="cuda"),
        None, torch.bfloat16, error_flags(a.device), hidden=136, inter=72, accumulate=False,
        config=kernels_ragged.RaggedTmaConfig(sorted_experts=False))
    # the padded copy of the experts off multiples of 8 tokens, read by the TMA kernel (both
    # splits)
    scratch = torch.empty(ragged_padded_bytes(tokens, len(counts), 136, 72), dtype=torch.uint8,
                          device="cuda")
    padded = ragged_padded_views(scratch, tokens, len(counts), 136, 72)
    out = torch.empty(len(counts), 136, 72, dtype=torch.bfloat16, device="cuda")
    # (two-byte loads and the word form pipelined first, then the plan's, which the TMA
    # kernel reads)
    for other in (PaddedConfig(aligned_loads=False), PaddedConfig(stages=3), PADDED_CONFIG):
        launch_ragged_padded(other, a, b, *padded, offsets, out, None, torch.bfloat16,
                             error_flags(a.device), hidden=136, inter=72, accumulate=False)
    for sorted_experts in (True, False):
        kernels_ragged.launch_wgrad_ragged_tma(
            a, b, offsets, out, None, torch.bfloat16, error_flags(a.device), hidden=136,
            inter=72, accumulate=False,
            config=kernels_ragged.RaggedTmaConfig(sorted_experts=sorted_experts), padded=padded)
    # offsets out of order: the copy's kernel computes the valid odd experts itself
    # (flagged), accumulating into a discrete output's experts
    disordered = offsets.clone()
    disordered[1] = disordered[0] - 1
    ptrs = torch.tensor([t.data_ptr() for t in out], dtype=torch.int64, device="cuda")
    launch_ragged_padded(PADDED_CONFIG, a, b, *padded, disordered, out, ptrs, torch.bfloat16,
                         error_flags(a.device), hidden=136, inter=72, accumulate=True)
    try:
        graphrt.check_errors()
    except graphrt.DeviceCheckError:
        pass
# FP8 inputs, both recipes: experts sharing scale blocks, one inside a single block, an empty
# one; tokens_sum 368 (rows 16-byte aligned), 360 (8 codes a load) and 367
for counts in ([37, 5, 0, 300, 26], [37, 5, 0, 300, 18], [37, 5, 0, 300, 25]):
    offsets = torch.tensor(counts, dtype=torch.int32, device="cuda").cumsum(0).to(torch.int32)
    tokens = sum(counts)
    for scale_dtype, block in ((torch.uint8, 32), (torch.float32, 128)):
        blocks = -(-tokens // block)
        a = torch.randn(136, tokens, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(72, tokens, device="cuda").to(torch.float8_e4m3fn).t()
        sa, sb = (torch.ones(rows, blocks, device="cuda").to(scale_dtype) for rows in (136, 72))
        graphrt.ops.grouped_gemm_wgrad(a, b, offsets, a_scale=sa, b_scale=sb.t())
        if block == 32:   # the plan's MXFP8 path without the values' workspace
            launch_wgrad_fp8(fp8_config(False, 32), a, b, sa, sb.t(), offsets,
                             torch.empty(5, 136, 72, dtype=torch.bfloat16, device="cuda"),
                             None, torch.bfloat16, error_flags(a.device), hidden=136,
                             inter=72, accumulate=False, dot_fp32=False)
        if block == 128 and kernels_gluon.fits_gluon_kernel(a, b,
                                                            torch.cuda.get_device_capability()):
            # the warp-specialized kernel (the plan's for 1x128, which then leaves the Triton
            # kernel's aligned path to run here)
            launch_wgrad_fp8(fp8_config(False, 128), a, b, sa, sb.t(), offsets,
                             torch.empty(5, 136, 72, dtype=torch.bfloat16, device="cuda"),
                             None, torch.bfloat16, error_flags(a.device), hidden=136,
                             inter=72, accumulate=False, dot_fp32=False)
            kernels_gluon.launch_wgrad_fp8_gluon(
                a, b, sa, sb.t(), offsets, torch.empty(5, 136, 72, dtype=torch.bfloat16,
                                                       device="cuda"),
                None, torch.bfloat16, error_flags(a.device), hidden=136, inter=72,
                accumulate=False)
# the 1x128 warp-specialized kernel with more work items than SMs: each program takes several,
# reading the next items' bounds and first scales ahead, and past the last item
counts = torch.randint(0, 60, (300,), generator=torch.Generator().manual_seed(1))
counts[::7] = 0
counts[-1] += -int(counts.sum()) % 16   # tokens_sum a multiple of 16, as the kernel needs
offsets = counts.cumsum(0).to(torch.int32).cuda()
tokens = int(counts.sum())
a = torch.randn(136, tokens, device="cuda").to(torch.float8_e4m3fn)
b = torch.randn(72, tokens, device="cuda").to(torch.float8_e4m3fn).t()
sa, sb = (torch.rand(rows, -(-tokens // 128), device="cuda") for rows in (136, 72))
if kernels_gluon.fits_gluon_kernel(a, b, torch.cuda.get_device_capability()):
    kernels_gluon.launch_wgrad_fp8_gluon(
        a, b, sa, sb.t(), offsets, torch.empty(300, 136, 72, dtype=torch.bfloat16,
                                               device="cuda"),
        None, torch.bfloat16, error_flags(a.device), hidden=136, inter=72, accumulate=False)
# bad offsets through the plan (no host check): past tokens_sum, negative, decreasing, the
# largest int32; the kernel must stay inside a and b and flag them
a_bad = torch.randn(136, 40, dtype=torch.bfloat16, device="cuda")
b_bad = torch.randn(40, 72, dtype=torch.bfloat16, device="cuda")
for bad in ([4, 9, 400], [4, -30, 40], [30, 3, 40], [4, 9, 2**31 - 1], [-2**31, 0, 40]):
    offsets = torch.tensor(bad, dtype=torch.int32, device="cuda")
    plan = graphrt.ops.GroupedGemmWgrad(a_bad, b_bad, offsets).compile()
    plan.execute(a_bad, b_bad, offsets, wgrad=torch.empty(3, 136, 72, dtype=torch.bfloat16,
                                                        device="cuda"))
    try:
        graphrt.check_errors()
        raise SystemExit(f"bad offsets {bad} were not flagged")
    except graphrt.DeviceCheckError:
        pass
from graphrt.ops.proj_rope import mxfp8_quantize
x = torch.randn(64, 64, dtype=torch.bfloat16, device="cuda")
w = torch.randn(2 * 192, 64, dtype=torch.bfloat16, device="cuda")
cs = torch.randn(64, 64, device="cuda").to(torch.bfloat16)
graphrt.ops.gemm_proj_rope_mxfp8(x, w, cs, cs)
# with nvidia-cutlass-dsl on Hopper: the CuTe kernel with more tiles than clusters
w70 = torch.randn(70 * 192, 64, dtype=torch.bfloat16, device="cuda")
cs4 = torch.randn(256, 64, device="cuda").to(torch.bfloat16)
graphrt.ops.gemm_proj_rope_mxfp8(torch.randn(256, 64, dtype=torch.bfloat16, device="cuda"), w70,
                                 cs4, cs4)
# on Hopper: the warp-specialized kernel over two tiles and a last one of 32 tokens, W as
# (K, N); then the head kernel (a head too wide for the warp-specialized one)
x2 = torch.randn(288, 128, dtype=torch.bfloat16, device="cuda")
cs2 = torch.randn(288, 64, device="cuda").to(torch.bfloat16)
w_kn = torch.randn(128, 2 * 192, dtype=torch.bfloat16, device="cuda")
graphrt.ops.gemm_proj_rope_mxfp8(x2, w_kn, cs2, cs2, w_out_in=False)
w_wide = torch.randn(2 * 320, 128, dtype=torch.bfloat16, device="cuda")
graphrt.ops.gemm_proj_rope_mxfp8(x2, w_wide, cs2, cs2, qk_nope_dim=256)
(xq, xs), (wq, ws) = mxfp8_quantize(x.float(), 1), mxfp8_quantize(w.float(), 1)
graphrt.ops.gemm_proj_rope_mxfp8(xq, wq, cs, cs, x_scale=xs, w_scale=ws)
# NaN and infinity on the way to the quantizer (the OCP MX NaN scale)
x_bad = x.clone()
x_bad[3, 5], x_bad[40, 7] = float("nan"), float("inf")
graphrt.ops.gemm_proj_rope_mxfp8(x_bad, w, cs, cs)
# AdamW: tensors of one element, one block plus one, and a float and a device lr; the sizes
# that are multiples of 8 share one launch (BF16 and FP32 groups), the others go one by one
shapes = [(1,), (4097,), (33, 65), (4104,), (8,), (16, 24)]
lists = [[torch.randn(s, device="cuda").to(dt) for s in shapes] for dt in (torch.bfloat16,) * 4]
lists[3] = [v.abs() for v in lists[3]]
steps = [torch.ones((), device="cuda") for _ in shapes]
graphrt.ops.adamw_step(*lists, steps, lr=1e-3)
graphrt.ops.adamw_step(*lists, steps, lr=torch.full((), 1e-3, device="cuda"), maximize=True)
lists = [[t.float() for t in ts] for ts in lists]
graphrt.ops.adamw_step(*lists, steps, lr=1e-3)
torch.cuda.synchronize()
print("sanitize run done")
