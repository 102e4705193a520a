"""Compile every graphrt Triton kernel for sm_90a on this machine (no GPU needed): catches
kernels that the interpreter accepts but the compiler rejects, and reports registers, spills,
shared memory and the global-memory instructions per kernel (are loads 16 bytes wide, are they
async copies?), with ptxas from Triton's package."""
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from graphrt import reduction
from graphrt.capture import random as capture_random
from graphrt.ops.grouped_gemm import kernels as wgrad
from graphrt.ops.hstu import kernels as hstu
from graphrt.ops.mhc import kernels as mhc
from graphrt.ops.proj_rope import kernels as proj
from graphrt.ops.proj_rope import kernels_ws as proj_ws
from graphrt.ops.registry import op
from graphrt.ops.rmsnorm import kernels as rms

TARGET = GPUTarget("cuda", 90, 32)
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def check(name, fn, signature, constexprs, num_warps=4, maxnreg=None, gluon=False):
    attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(signature.values())
             if t.startswith("*")}
    source = GluonASTSource if gluon else triton.compiler.ASTSource
    src = source(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    try:
        k = triton.compile(src, target=TARGET, options={"num_warps": num_warps, "maxnreg": maxnreg})
    except Exception as err:  # report and go on
        print(f"FAIL {name}: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
        return False
    ptx = k.asm["ptx"]
    memory = collections.Counter(re.findall(r"(ld\.global[\w.]*|st\.global[\w.]*|cp\.async\.c[ag]\w*)",
                                            ptx))
    assembled, report = assemble(ptx)
    if assembled is None:   # no ptxas here reads this PTX version: the PTX itself compiled
        print(f"ok   {name}: PTX only ({report}); {k.metadata.shared} B shared; {dict(memory)}")
        return True
    if not assembled:
        print(f"FAIL {name}: ptxas: {report}")
        return False
    regs = re.findall(r"Used (\d+) registers", report)
    spills = re.findall(r"(\d+) bytes spill stores", report)
    print(f"ok   {name}: {regs[0] if regs else '?'} registers, {spills[0] if spills else '?'} B "
          f"spilled, {k.metadata.shared} B shared; {dict(memory)}")
    return True


def assemble(ptx: str):
    """(True, ptxas's report) once a ptxas assembles ``ptx`` for sm_90a; (False, its error) when
    one rejects it for a reason other than its PTX version; (None, why) when every ptxas found
    (Triton's own, then the CUDA toolkit's) is older than the PTX. The .ptx file is removed."""
    candidates = [p for p in (PTXAS, shutil.which("ptxas"), "/usr/local/cuda/bin/ptxas")
                  if p and os.path.exists(p)]
    too_old = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        for exe in dict.fromkeys(os.path.realpath(p) for p in candidates):
            res = subprocess.run([exe, "-v", "--gpu-name", "sm_90a", path, "-o", os.devnull],
                                 capture_output=True, text=True)
            if res.returncode == 0:
                return True, res.stderr
            if "Unsupported .version" not in res.stderr:
                return False, res.stderr.strip().splitlines()[0] if res.stderr.strip() else f"rc {res.returncode}"
            too_old.append(re.search(r"current version is '([\d.]+)'", res.stderr))
    version = re.search(r"^\.version ([\d.]+)", ptx, re.M)
    have = ", ".join(m.group(1) for m in too_old if m) or "none"
    return None, (f"PTX ISA {version.group(1) if version else '?'}; the ptxas found here read up "
                  f"to {have}")


def sig(**kinds):
    return kinds


def main():
    ok = True
    c = "constexpr"
    # the benchmark shapes, from the op registry
    _, mhc_k = op("mhc_projection_backward").cases[0]
    _, wgrad_hidden, wgrad_inter, _ = op("grouped_gemm_wgrad").cases[0]
    _, proj_k, heads, nope, rope = op("gemm_proj_rope_mxfp8").cases[0]
    _, hstu_d = op("hstu_lmsd_forward").cases[1]
    ok &= check("rmsnorm fwd rows", rms._rmsnorm_fwd_rows_kernel, sig(
        X="*bf16", RES="*bf16", W="*fp32", Y="*bf16", RSTD="*fp32", H_NEW="*bf16", n_rows="i32",
        stride_x="i32", stride_res="i32", stride_y="i32", stride_h="i32", eps="fp32", HIDDEN=c,
        BLOCK_H=c, BLOCK_ROWS=c, HAS_RESIDUAL=c, NUM_STAGES=c, PDL=c),
        dict(HIDDEN=4096, BLOCK_H=4096, BLOCK_ROWS=2, HAS_RESIDUAL=True, NUM_STAGES=4, PDL=True))
    ok &= check("rmsnorm bwd rows", rms._rmsnorm_bwd_rows_kernel, sig(
        G="*bf16", X="*bf16", W="*fp32", RSTD="*fp32", G_RES="*bf16", DX="*bf16", PARTIAL="*fp32",
        n_rows="i32", stride_g="i32", stride_x="i32", stride_gres="i32", stride_dx="i32",
        HIDDEN=c, BLOCK_H=c, BLOCK_ROWS=c, HAS_G_RESIDUAL=c, NUM_STAGES=c, PDL=c),
        dict(HIDDEN=5120, BLOCK_H=8192, BLOCK_ROWS=1, HAS_G_RESIDUAL=True, NUM_STAGES=4, PDL=True), 8)
    ok &= check("rmsnorm fwd chunked", rms._rmsnorm_fwd_chunked_kernel, sig(
        X="*bf16", RES="*bf16", W="*bf16", Y="*bf16", RSTD="*fp32", H_NEW="*bf16",
        stride_x="i32", stride_res="i32", stride_y="i32", stride_h="i32", eps="fp32", HIDDEN=c,
        BLOCK_H=c, NUM_CHUNKS=c, HAS_RESIDUAL=c),
        dict(HIDDEN=16392, BLOCK_H=4096, NUM_CHUNKS=5, HAS_RESIDUAL=True), 8)
    ok &= check("rmsnorm bwd chunked", rms._rmsnorm_bwd_chunked_kernel, sig(
        G="*bf16", X="*bf16", W="*fp32", RSTD="*fp32", G_RES="*bf16", DX="*bf16", PARTIAL="*fp32",
        n_rows="i32", rows_per_program="i32", stride_g="i32", stride_x="i32", stride_gres="i32",
        stride_dx="i32", HIDDEN=c, BLOCK_H=c, NUM_CHUNKS=c, HAS_G_RESIDUAL=c, PDL=c),
        dict(HIDDEN=16392, BLOCK_H=4096, NUM_CHUNKS=5, HAS_G_RESIDUAL=False, PDL=True), 8)
    ok &= check("reduction", reduction._sum_partials_kernel, sig(
        PARTIAL="*fp32", OUT_A="*bf16", OUT_B="*bf16", n_parts="i32", COLS=c, BLOCK_P=c,
        BLOCK_C=c, NUM_STAGES=c, AFTER_PRIMARY=c, EVICTION=c),
        dict(COLS=512, BLOCK_P=64, BLOCK_C=16, NUM_STAGES=3, AFTER_PRIMARY=True,
             EVICTION="evict_last"))
    ok &= check("uniform", capture_random._uniform_kernel, sig(OUT="*fp32", STATE="*i64", n="i32",
                                                              BLOCK=c), dict(BLOCK=1024))
    mhc_cfg = mhc.TILE
    bt, bk = mhc_cfg.block_t, mhc_cfg.block_k
    for n_pad in (24, 25):
        ok &= check(f"mhc bwd n_pad={n_pad}", mhc._mhc_bwd_kernel, sig(
            X_DESC=f"tensordesc<bf16[{bt},{bk}]>", DX_DESC=f"tensordesc<bf16[{bt},{bk}]>",
            P_DESC=f"tensordesc<fp32[{bt},32]>", GP="*fp32", W="*fp32", GR="*fp32", R="*fp32",
            PARTIAL="*fp32", n_rows="i32", K=c, N=c, N_PAD=c, N_BLOCK=c, BLOCK_T=c, BLOCK_K=c,
            NUM_STAGES=c, P_TMA=c, DOT_FP32=c, PDL=c, EVICTION=c),
            dict(K=mhc_k, N=24, N_PAD=n_pad, N_BLOCK=32, BLOCK_T=bt, BLOCK_K=bk,
                 NUM_STAGES=mhc_cfg.num_stages, P_TMA=mhc.p_through_tma(n_pad), DOT_FP32=False,
                 PDL=True, EVICTION=mhc.PARTIAL_EVICTION),
            mhc_cfg.num_warps, maxnreg=mhc_cfg.max_registers)
    for dropout, from_tensors, concat in ((True, False, True), (True, True, True),
                                          (False, False, False)):
        ok &= check(f"hstu fwd dropout={dropout} tensor_seed={from_tensors}", hstu._hstu_fwd_kernel, sig(
            X="*bf16", U="*bf16", W="*bf16", B="*bf16", Y="*bf16", MEAN="*fp32", RSTD="*fp32",
            MASK="*i8", SEED="*i64", OFFSET="*i64", n_rows="i32", stride_x="i32", stride_u="i32",
            stride_y="i32", seed_lo="i32", seed_hi="i32", off_lo="i32", off_hi="i32", eps="fp32",
            D=c, BLOCK_D=c, BLOCK_ROWS=c, SILU=c, CONCAT_U=c, CONCAT_X=c, DROPOUT=c, THRESHOLD=c,
            SCALE=c, SEED_FROM_TENSORS=c, NUM_STAGES=c, PDL=c, HARDWARE=c),
            dict(D=hstu_d, BLOCK_D=hstu_d, BLOCK_ROWS=4, SILU=concat, CONCAT_U=concat, CONCAT_X=concat,
                 DROPOUT=dropout, THRESHOLD=6553, SCALE=1 / 0.9, SEED_FROM_TENSORS=from_tensors,
                 NUM_STAGES=3, PDL=True, HARDWARE=True),
            num_warps=8)
    ok &= check("hstu bwd", hstu._hstu_bwd_kernel, sig(
        DY="*bf16", X="*bf16", U="*bf16", W="*bf16", B="*bf16", MEAN="*fp32", RSTD="*fp32",
        MASK="*i8", DX="*bf16", DU="*bf16", PARTIAL="*fp32", n_rows="i32", stride_dy="i32",
        stride_x="i32", stride_u="i32", stride_dx="i32", stride_du="i32", D=c, BLOCK_D=c,
        BLOCK_ROWS=c, SILU=c, CONCAT_U=c, CONCAT_X=c, DROPOUT=c, SCALE=c, COMPUTE_DW=c,
        NUM_STAGES=c, PDL=c),
        dict(D=hstu_d, BLOCK_D=hstu_d, BLOCK_ROWS=4, SILU=True, CONCAT_U=True, CONCAT_X=True,
             DROPOUT=True, SCALE=1 / 0.9, COMPUTE_DW=True, NUM_STAGES=3, PDL=True), num_warps=4)
    import triton.language as tl
    for a_k, b_k, ragged, discrete, acc, k_aligned in (
            (False, False, False, False, False, False), (True, False, False, False, False, False),
            (True, False, False, False, False, True), (True, True, False, False, False, True),
            (False, True, False, True, True, True), (False, True, False, True, True, False),
            (True, False, True, False, False, False), (True, True, True, False, False, True)):
        # ragged: k_aligned stands for RAGGED_ALIGNED (the aligned experts' 8-token loop)
        ok &= check(f"wgrad a_k={a_k} b_k={b_k} ragged={ragged} discrete={discrete} acc={acc} "
                    f"k_aligned={k_aligned}",
                    wgrad._wgrad_kernel, sig(
                        A="*bf16", B="*bf16", OFFSETS="*i32", OUT="*bf16", OUT_PTRS="*i64",
                        ERRORS="*i32",
                        tokens_sum="i32", HIDDEN=c, INTER=c, A_K_MAJOR=c, B_K_MAJOR=c, RAGGED=c,
                        DISCRETE=c, ACCUMULATE=c, DOT_FP32=c, OUT_DTYPE=c, K_ALIGNED=c,
                        RAGGED_ALIGNED=c, BLOCK_M=c, BLOCK_N=c, BLOCK_K=c, NUM_STAGES=c, GROUP_M=c),
                    dict(HIDDEN=wgrad_hidden, INTER=wgrad_inter, A_K_MAJOR=a_k, B_K_MAJOR=b_k, RAGGED=ragged,
                         DISCRETE=discrete, ACCUMULATE=acc, DOT_FP32=False, OUT_DTYPE=tl.bfloat16,
                         K_ALIGNED=k_aligned and not ragged,
                         RAGGED_ALIGNED=k_aligned and ragged, BLOCK_M=128, BLOCK_N=128, BLOCK_K=64,
                         NUM_STAGES=3, GROUP_M=8),
                    num_warps=8)
    for scale_block, mn_major, rows_aligned, discrete in (
            (128, True, True, False), (128, False, True, False), (32, True, True, False),
            (32, False, True, False), (128, False, False, True)):
        cfg = wgrad.fp8_config(False, scale_block)
        ok &= check(f"wgrad fp8 scale_block={scale_block} scales_mn_major={mn_major} "
                    f"rows_aligned={rows_aligned} discrete={discrete}",
                    wgrad._wgrad_fp8_kernel, sig(
                        A="*fp8e4nv", B="*fp8e4nv", A_SCALE="*u8" if scale_block == 32 else "*fp32",
                        B_SCALE="*u8" if scale_block == 32 else "*fp32", OFFSETS="*i32",
                        OUT="*bf16", OUT_PTRS="*i64", ERRORS="*i32", tokens_sum="i32", sa_m="i64",
                        sa_k="i64", sb_k="i64", sb_n="i64", HIDDEN=c, INTER=c, SCALE_BLOCK=c,
                        E8M0=c, SCALES_MN_MAJOR=c, ROWS_ALIGNED=c, DISCRETE=c, ACCUMULATE=c, DOT_FP32=c, OUT_DTYPE=c,
                        BLOCK_M=c, BLOCK_N=c, NUM_STAGES=c, GROUP_M=c),
                    dict(HIDDEN=wgrad_hidden, INTER=wgrad_inter, SCALE_BLOCK=scale_block,
                         E8M0=scale_block == 32, SCALES_MN_MAJOR=mn_major,
                         ROWS_ALIGNED=rows_aligned, DISCRETE=discrete,
                         ACCUMULATE=discrete, DOT_FP32=False, OUT_DTYPE=tl.bfloat16,
                         BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, NUM_STAGES=cfg.num_stages,
                         GROUP_M=cfg.group_m),
                    num_warps=cfg.num_warps)
    for w_out_in in (True, False):
        ok &= check(f"proj block w_out_in={w_out_in}", proj._proj_rope_block_kernel, sig(
            X="*bf16", W="*bf16", COS="*bf16", SIN="*bf16", ROW="*u8", ROW_S="*u8", COL="*u8",
            COL_S="*u8", tokens="i32", K=c, HEADS=c, NOPE=c, ROPE=c, W_OUT_IN=c, HW_CVT=c,
            DOT_FP32=c),
            dict(K=proj_k, HEADS=heads, NOPE=nope, ROPE=rope, W_OUT_IN=w_out_in, HW_CVT=True,
                 DOT_FP32=False))
        w_nope, w_rope = (("tensordesc<bf16[128,64]>", "tensordesc<bf16[64,64]>") if w_out_in
                          else ("tensordesc<bf16[64,128]>", "tensordesc<bf16[64,64]>"))
        ok &= check(f"proj head w_out_in={w_out_in}", proj._proj_rope_head_kernel, sig(
            X_DESC="tensordesc<bf16[64,64]>", W_NOPE=w_nope, W_ROPE=w_rope, COS="*bf16",
            SIN="*bf16", ROW="*u8", ROW_S="*u8", COL="*u8", COL_S="*u8", tokens="i32", K=c,
            HEADS=c, NOPE=c, ROPE=c, W_OUT_IN=c, HW_CVT=c, DOT_FP32=c, BLOCK_M=c, BLOCK_K=c,
            NUM_STAGES=c),
            dict(K=proj_k, HEADS=heads, NOPE=nope, ROPE=rope, W_OUT_IN=w_out_in, HW_CVT=True,
                 DOT_FP32=False, BLOCK_M=64, BLOCK_K=64, NUM_STAGES=3), num_warps=4)
        def gluon_desc(block):
            layout = gl.NVMMASharedLayout.get_default_for(block, gl.bfloat16)
            return f"tensordesc<bf16[{block[0]},{block[1]}],{layout!r}>"
        w_blocks = ([128, 64], [64, 64]) if w_out_in else ([64, 128], [64, 64])
        cfg = proj_ws.WS_CONFIG
        if not proj_ws.GLUON_API_OK:
            print(f"skip proj warp-specialized: written for Triton 3.6, this is {triton.__version__}")
            continue
        ok &= check(f"proj warp-specialized w_out_in={w_out_in}", proj_ws._proj_rope_ws_kernel, sig(
            x_desc=gluon_desc([128, 64]), wn_desc=gluon_desc(w_blocks[0]),
            wr_desc=gluon_desc(w_blocks[1]), COS="*bf16", SIN="*bf16", ROW="*u8", ROW_S="*u8",
            COL="*u8", COL_S="*u8", tokens="i32", HEADS=c, NOPE=c, ROPE=c, W_OUT_IN=c, STAGES=c,
            MMA_REGS=c, EPILOGUE_REGS=c, num_warps=c),
            dict(HEADS=heads, NOPE=nope, ROPE=rope, W_OUT_IN=w_out_in, STAGES=cfg.stages,
                 MMA_REGS=cfg.mma_regs, EPILOGUE_REGS=cfg.epilogue_regs, num_warps=4),
            num_warps=4, maxnreg=proj_ws.LAUNCH_REGS, gluon=True)
    for along_cols in (True, False):   # W's blocks along its columns or rows; x's along columns
        ok &= check(f"mxfp8 dequant W blocks_along_cols={along_cols}", proj._mxfp8_dequant_kernel,
                    sig(CODES_A="*u8", SCALES_A="*u8", OUT_A="*bf16", rows_a="i32", tiles_a="i32",
                        CODES_B="*u8", SCALES_B="*u8", OUT_B="*bf16", rows_b="i32", COLS_A=c,
                        COLS_B=c, ALONG_COLS_A=c, ALONG_COLS_B=c, HW_CVT=c, BLOCK_R=c, BLOCK_C=c,
                        PDL=c),
                    dict(COLS_A=proj_k if along_cols else heads * (nope + rope), COLS_B=proj_k,
                         ALONG_COLS_A=along_cols, ALONG_COLS_B=True, HW_CVT=True,
                         BLOCK_R=proj.DEQUANT_ROWS, BLOCK_C=proj.DEQUANT_COLS, PDL=True),
                    num_warps=proj.DEQUANT_WARPS)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
