"""Experimental Hopper kernel (Gluon, Triton 3.6) for the 1x128 FP8 grouped wgrad: the tensor
cores multiply block j+1 while the CUDA cores scale block j.

Triton keeps a dot asynchronous only when its result feeds nothing but the next dot, so the
Triton kernel (kernels.py) waits for every block's product before scaling it. Here each block
of 128 tokens is its own product (``use_acc=False``), issued before the previous block's
product is waited for (``warpgroup_mma_wait(num_outstanding=1)``) and scaled into the running
FP32 sum. Three [128, 64] FP32 tiles live per program (the sum, the product being scaled, the
one in flight), over two warpgroups of 64 rows: 198 registers a thread and no spills, compiled
for sm_90a with Triton 3.6. Operands come through TMA into a ring of shared-memory stages, one
block ahead per stage. A block the expert shares with a neighbour (its first and last, when
they are not whole) is loaded whole and the other tokens are zeroed in shared memory, in both
operands, so that no neighbour's value (NaN or Inf included) reaches the sum.

Not used by the plan yet: ``scripts/sweep_wgrad.py --fp8`` times it against the Triton kernel
and a GPU test compares it with the FP64 reference; neither has run on a GPU. It needs
tokens_sum % 16 == 0 (16-byte TMA rows) and 16-byte aligned operands.
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma, warpgroup_mma_init,
                                                              warpgroup_mma_wait)

from ...kernel_utils import (cdiv, CompileCase, CONSTEXPR, gluon_descriptor, gluon_descriptor_type,
                             launch, ON_TESTED_TRITON, TL_DTYPES)
from . import kernels as _triton_kernels

BLOCK_M, BLOCK_N, BLOCK_K = 128, 64, 128   # BLOCK_K: the scale block
STAGES = 4                                # 24 KB a stage, 96 KB in all
WARPS = gl.constexpr(8)   # two warpgroups, 64 rows each
GROUP_M = 8
GLUON_API_OK = ON_TESTED_TRITON   # written for Triton 3.6's Gluon, whose API moves

# The program's tile, its expert's bounds (with their checks) and the output store are the
# Triton kernels' own code, compiled as Gluon functions: both kernels walk tiles, flag bad
# offsets and write alike.
_tile_origin = gluon.jit(_triton_kernels._tile_origin.fn)
_expert_tokens = gluon.jit(_triton_kernels._expert_tokens.fn)
_store_tile = gluon.jit(_triton_kernels._store_tile.fn)   # its tensors carry their layouts


@gluon.jit
def _zero_outside(buf, lo, hi, k0, ROWS: gl.constexpr, COLS: gl.constexpr):
    """Zeroes the tokens (columns) of a staged [ROWS, COLS] block outside [lo, hi), in place,
    and makes the writes visible to the tensor cores."""
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [WARPS, 1], [1, 0])
    codes = buf.load(layout)
    k = k0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    keep = (k >= lo) & (k < hi)
    buf.store(gl.where(keep[None, :], codes, gl.zeros_like(codes)))
    fence_async_shared()
    gl.thread_barrier()


@gluon.jit
def _issue_load(a_desc, b_desc, a_bufs, b_bufs, ready, block, stage, m0, n0, pred):
    """TMA copies of block ``block``'s A [BLOCK_M, BLOCK_K] and B^T [BLOCK_N, BLOCK_K] codes
    into ``stage`` (only where ``pred``)."""
    BK: gl.constexpr = a_desc.block_type.shape[1]
    bar = ready.index(stage)
    mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
    k0 = (block * BK).to(gl.int32)
    tma.async_copy_global_to_shared(a_desc, [m0, k0], bar, a_bufs.index(stage), pred=pred)
    tma.async_copy_global_to_shared(b_desc, [n0, k0], bar, b_bufs.index(stage), pred=pred)


@gluon.jit
def _block_scales(A_SCALE, B_SCALE, block, m, n, sa_m, sa_k, sb_k, sb_n, HIDDEN: gl.constexpr,
                  INTER: gl.constexpr):
    """a_scale[m, block] and b_scale[block, n] (kept as vectors: a [BLOCK_M, BLOCK_N] tile of
    their products would cost as many registers as an accumulator)."""
    sa = gl.load(A_SCALE + m.to(gl.int64) * sa_m + block * sa_k, mask=m < HIDDEN, other=0.0)
    sb = gl.load(B_SCALE + block * sb_k + n.to(gl.int64) * sb_n, mask=n < INTER, other=0.0)
    return sa, sb


@gluon.jit(do_not_specialize=["tokens_sum", "sa_m", "sa_k", "sb_k", "sb_n"])
def _wgrad_fp8_overlap_kernel(a_desc, b_desc, A_SCALE, B_SCALE, OFFSETS, OUT, OUT_PTRS, ERRORS,
                              tokens_sum, sa_m, sa_k, sb_k, sb_n, HIDDEN: gl.constexpr,
                              INTER: gl.constexpr, DISCRETE: gl.constexpr,
                              ACCUMULATE: gl.constexpr, OUT_DTYPE: gl.constexpr,
                              NUM_STAGES: gl.constexpr, GROUP: gl.constexpr):
    BM: gl.constexpr = a_desc.block_type.shape[0]
    BK: gl.constexpr = a_desc.block_type.shape[1]
    BN: gl.constexpr = b_desc.block_type.shape[0]
    tile = gl.program_id(0)
    expert = gl.program_id(1)
    m0, n0 = _tile_origin(tile, HIDDEN, INTER, BM, BN, GROUP)
    begin, count = _expert_tokens(OFFSETS, ERRORS, expert, tile, tokens_sum)
    end = begin + count
    if ACCUMULATE:
        if end == begin:
            return

    acc_layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BN, 32])
    m = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, acc_layout))
    n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, acc_layout))
    total = gl.zeros([BM, BN], gl.float32, acc_layout)

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES, BM, BK], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_STAGES, BN, BK], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(s), count=1)

    first = begin // BK                    # the blocks holding the expert's tokens
    stop = (end + BK - 1) // BK
    for s in gl.static_range(NUM_STAGES - 1):
        _issue_load(a_desc, b_desc, a_bufs, b_bufs, ready, first + s, s, m0, n0,
                    first + s < stop)

    # loop-carried as the asynchronous product it becomes (zeros before the first block)
    product = warpgroup_mma_init(gl.zeros([BM, BN], gl.float32, acc_layout))
    sa = gl.zeros([BM], gl.float32, gl.SliceLayout(1, acc_layout))
    sb = gl.zeros([BN], gl.float32, gl.SliceLayout(0, acc_layout))
    for block in range(first, stop):
        i = block - first
        stage = (i % NUM_STAGES).to(gl.int32)
        mbarrier.wait(ready.index(stage), ((i // NUM_STAGES) & 1).to(gl.int32))
        k0 = block * BK
        lo = gl.maximum(begin, k0)
        hi = gl.minimum(end, k0 + BK)
        if (lo > k0) | (hi < k0 + BK):   # shared with a neighbour: keep the expert's tokens
            _zero_outside(a_bufs.index(stage), lo, hi, k0, BM, BK)
            _zero_outside(b_bufs.index(stage), lo, hi, k0, BN, BK)
        issued = warpgroup_mma(a_bufs.index(stage), b_bufs.index(stage).permute((1, 0)),
                               gl.zeros([BM, BN], gl.float32, acc_layout), use_acc=False,
                               is_async=True)
        next_sa, next_sb = _block_scales(A_SCALE, B_SCALE, block, m, n, sa_m, sa_k, sb_k,
                                         sb_n, HIDDEN, INTER)
        # the previous block's product is done (this one may still run): scale it in, and
        # its stage (on the first block: the one stage the prologue left empty) takes the
        # block NUM_STAGES - 1 ahead
        done = warpgroup_mma_wait(num_outstanding=1, deps=(product,))
        total += done * sa[:, None] * sb[None, :]
        # each warpgroup waited for its own products only: both must be done with the stage
        # before the copy into it is issued
        gl.thread_barrier()
        ahead = block + NUM_STAGES - 1
        _issue_load(a_desc, b_desc, a_bufs, b_bufs, ready, ahead,
                    ((i + NUM_STAGES - 1) % NUM_STAGES).to(gl.int32), m0, n0, ahead < stop)
        product, sa, sb = issued, next_sa, next_sb
    done = warpgroup_mma_wait(num_outstanding=0, deps=(product,))
    total += done * sa[:, None] * sb[None, :]
    for s in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(ready.index(s))

    out_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [WARPS, 1], [1, 0])
    total = gl.convert_layout(total, out_layout)
    rows = m0 + gl.arange(0, BM, layout=gl.SliceLayout(1, out_layout))
    cols = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, out_layout))
    _store_tile(total, OUT, OUT_PTRS, expert, rows, cols, HIDDEN, INTER, DISCRETE, ACCUMULATE,
                OUT_DTYPE)


def fits_overlap_kernel(a, b, capability) -> bool:
    """Whether the experimental kernel takes these FP8 operands: a Hopper GPU, Triton 3.6,
    both tokens-major, tokens_sum % 16 == 0 and 16-byte aligned bases (TMA rows and
    addresses)."""
    return (GLUON_API_OK and capability is not None and capability[0] == 9
            and a.stride(1) == 1 and b.stride(0) == 1 and a.shape[1] % 16 == 0
            and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0)


def launch_wgrad_fp8_overlap(a, b, a_scale, b_scale, offsets, out, out_ptrs, out_dtype, errors,
                             *, hidden: int, inter: int, accumulate: bool) -> None:
    """The 1x128 FP8 wgrad through the experimental kernel: arguments as
    kernels.launch_wgrad_fp8's (a (hidden, T) and b (T, intermediate) both tokens-major,
    FP32 scales per 128 tokens), on operands ``fits_overlap_kernel`` accepts."""
    experts = offsets.numel()
    if experts == 0:
        return
    a_desc = gluon_descriptor(a, [BLOCK_M, BLOCK_K])
    b_desc = gluon_descriptor(b.t(), [BLOCK_N, BLOCK_K])
    grid = (cdiv(hidden, BLOCK_M) * cdiv(inter, BLOCK_N), experts)
    out_arg, ptrs_arg = (a, out_ptrs) if out_ptrs is not None else (out, offsets)
    launch(_wgrad_fp8_overlap_kernel, grid, a_desc, b_desc, a_scale, b_scale, offsets, out_arg,
           ptrs_arg, errors, a.shape[1], a_scale.stride(0), a_scale.stride(1),
           b_scale.stride(0), b_scale.stride(1), HIDDEN=hidden, INTER=inter,
           DISCRETE=out_ptrs is not None, ACCUMULATE=accumulate, OUT_DTYPE=TL_DTYPES[out_dtype],
           NUM_STAGES=STAGES, GROUP=GROUP_M, num_warps=WARPS.value)


def compile_cases() -> list[CompileCase]:
    """The variants scripts/compile_check.py compiles: dense and discrete output at the first
    benchmark case's sizes."""
    import triton

    from ..registry import op
    _, hidden, inter, _ = op("grouped_gemm_wgrad").cases[0]
    c = CONSTEXPR
    cases = []
    for discrete in (False, True):
        name = f"wgrad fp8 1x128 overlap (Gluon) discrete={discrete}"
        if not GLUON_API_OK:
            cases.append(CompileCase(name, None, {}, {}, skip=f"written for Triton 3.6, this is "
                                                             f"{triton.__version__}"))
            continue
        fp8 = torch.float8_e4m3fn
        cases.append(CompileCase(name, _wgrad_fp8_overlap_kernel, dict(
            a_desc=gluon_descriptor_type([BLOCK_M, BLOCK_K], fp8),
            b_desc=gluon_descriptor_type([BLOCK_N, BLOCK_K], fp8), A_SCALE="*fp32",
            B_SCALE="*fp32", OFFSETS="*i32", OUT="*bf16", OUT_PTRS="*i64", ERRORS="*i32",
            tokens_sum="i32", sa_m="i32", sa_k="i32", sb_k="i32", sb_n="i32", HIDDEN=c, INTER=c,
            DISCRETE=c, ACCUMULATE=c, OUT_DTYPE=c, NUM_STAGES=c, GROUP=c),
            dict(HIDDEN=hidden, INTER=inter, DISCRETE=discrete, ACCUMULATE=False,
                 OUT_DTYPE=gl.bfloat16, NUM_STAGES=STAGES, GROUP=GROUP_M),
            num_warps=WARPS.value, gluon=True))
    return cases
