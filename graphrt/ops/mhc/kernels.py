"""Triton kernels for the mHC projection/RMS backward.

One pass over x, split stream-K style: the work is the list of (column block, row tile) pairs,
column block major, and each of a fixed number of resident programs takes one contiguous,
equal share of it. A program walks its share one column block at a time: per row tile it writes
dx = P @ W + grad_r / (r K) * x and accumulates x^T @ P, and at the end of each column block it
stores that block's dweight segment. Segment slots are numbered program + column block, which
is unique and needs programs + column blocks slots whatever the row count. A second kernel sums,
per column block, the segments of the programs that covered it, in program order (no atomics:
bitwise reproducible for a given row count). Row counts are run-time values.

The products run on BF16 tensor cores with FP32 operands split in two (v = hi + lo, both BF16):
x is exact in BF16, P @ W takes hi*hi + hi*lo + lo*hi, and x^T @ P takes x*hi + x*lo, so every
product keeps about 16 mantissa bits, more than TF32's 11. BF16 operands can be read transposed
from shared memory, which lets x feed both products without a transpose through registers.
"""
from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ...kernel_utils import allow_dependent_launch, mma, wait_for_prior_kernel


@dataclass(frozen=True)
class MhcConfig:
    block_t: int
    block_k: int
    programs: int     # resident programs sharing the work; fixes the dweight summation order
    num_warps: int
    num_stages: int
    max_registers: int | None = None


def mhc_config(sm_count: int) -> MhcConfig:
    """64 x 128 tiles, 4 warps, 3 stages (89 KB of shared memory: 2 programs per SM). Swept on an
    H200 (scripts/sweep_mhc.py; NOTES.md has the figures)."""
    return MhcConfig(block_t=64, block_k=128, programs=2 * sm_count, num_warps=4, num_stages=3)


def segment_slots(cfg: MhcConfig, k: int) -> int:
    """dweight segments the workspace holds: one per program and column block it touches."""
    return cfg.programs + triton.cdiv(k, cfg.block_k) - 1


def n_block(n: int) -> int:
    """Projection columns padded to a power of two of at least 16 (the matrix-unit minimum)."""
    return max(16, triton.next_power_of_2(n))


@triton.jit
def _split_bf16(v):
    """v (FP32) as hi + lo, both BF16: about 16 mantissa bits together."""
    hi = v.to(tl.bfloat16)
    return hi, (v - hi.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def _share(program, programs, total):
    """[start, end) of the flat work list that ``program`` owns: equal shares in program order
    (``total`` is 64-bit, and so are the products)."""
    start = (program * total) // programs
    end = ((program + 1) * total) // programs
    return start, end


@triton.jit(do_not_specialize=["n_rows"])
def _mhc_bwd_kernel(X_DESC, DX_DESC, P_DESC, GP, W, GR, R, SEGMENTS, n_rows,
                    K: tl.constexpr, N: tl.constexpr, N_PAD: tl.constexpr, N_BLOCK: tl.constexpr,
                    BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr,
                    P_TMA: tl.constexpr, DOT_FP32: tl.constexpr, PDL: tl.constexpr):
    # x, dx and (when its row stride allows) grad_proj move through TMA: the hardware computes
    # addresses and bounds (rows past T and columns past N read as zero, and are not written)
    pid = tl.program_id(0)
    row_tiles = tl.cdiv(n_rows, BLOCK_T).to(tl.int64)
    start, end = _share(pid, tl.num_programs(0), tl.cdiv(K, BLOCK_K) * row_tiles)
    ns = tl.arange(0, N_BLOCK)
    n_mask = ns < N
    block_first = (start // row_tiles).to(tl.int32)
    block_last = tl.where(end > start, (end - 1) // row_tiles, block_first - 1).to(tl.int32)
    for block in range(block_first, block_last + 1):
        k0 = block * BLOCK_K
        cols = k0 + tl.arange(0, BLOCK_K)
        col_mask = cols < K
        w = tl.load(W + ns[:, None] * K + cols[None, :], mask=n_mask[:, None] & col_mask[None, :],
                    other=0.0)
        w_hi, w_lo = _split_bf16(w)
        acc = tl.zeros([BLOCK_K, N_BLOCK], dtype=tl.float32)  # this block's dweight^T segment
        tile_lo = (tl.maximum(start, block * row_tiles) - block * row_tiles).to(tl.int32)
        tile_hi = (tl.minimum(end, (block + 1) * row_tiles) - block * row_tiles).to(tl.int32)
        for tile in tl.range(tile_lo, tile_hi, num_stages=NUM_STAGES):
            t0 = tile * BLOCK_T
            rows = t0 + tl.arange(0, BLOCK_T)
            row_mask = rows < n_rows
            x = X_DESC.load([t0, k0])
            if P_TMA:
                p = P_DESC.load([t0, 0])
            else:
                p = tl.load(GP + rows.to(tl.int64)[:, None] * N_PAD + ns[None, :],
                            mask=row_mask[:, None] & n_mask[None, :], other=0.0)
            p_hi, p_lo = _split_bf16(p)
            gr = tl.load(GR + rows, mask=row_mask, other=0.0)
            r = tl.load(R + rows, mask=row_mask, other=1.0)
            rms_term = gr / (r * K)
            pw = mma(p_hi, w_hi, DOT_FP32) + mma(p_hi, w_lo, DOT_FP32) + mma(p_lo, w_hi, DOT_FP32)
            dx = pw + rms_term[:, None] * x.to(tl.float32)
            DX_DESC.store([t0, k0], dx.to(tl.bfloat16))
            x_t = tl.trans(x)
            acc += mma(x_t, p_hi, DOT_FP32)
            acc += mma(x_t, p_lo, DOT_FP32)
        segment = SEGMENTS + (pid + block) * (N_BLOCK * BLOCK_K)
        tl.store(segment + ns[None, :] * BLOCK_K + tl.arange(0, BLOCK_K)[:, None], acc)
    allow_dependent_launch(PDL)


@triton.jit
def _owner(item, programs, total):
    """The program whose share holds flat work item ``item`` (the inverse of ``_share``)."""
    return (((item + 1) * programs + total - 1) // total - 1).to(tl.int32)


@triton.jit(do_not_specialize=["n_rows", "programs"])
def _mhc_segments_sum_kernel(SEGMENTS, DW, n_rows, programs, K: tl.constexpr, N: tl.constexpr,
                             N_BLOCK: tl.constexpr, BLOCK_T: tl.constexpr,
                             BLOCK_K: tl.constexpr, AFTER_PRIMARY: tl.constexpr):
    block = tl.program_id(0)
    row_tiles = tl.cdiv(n_rows, BLOCK_T).to(tl.int64)
    total = tl.cdiv(K, BLOCK_K) * row_tiles
    first = _owner(block * row_tiles, programs, total)
    last = _owner((block + 1) * row_tiles - 1, programs, total)
    ns = tl.arange(0, N_BLOCK)
    cs = tl.arange(0, BLOCK_K)
    wait_for_prior_kernel(AFTER_PRIMARY)  # the segments come from the kernel just before
    acc = tl.zeros([N_BLOCK, BLOCK_K], dtype=tl.float32)
    for program in range(first, last + 1):
        start, end = _share(program, programs, total)  # programs with no work wrote nothing
        segment = SEGMENTS + (program + block).to(tl.int64) * (N_BLOCK * BLOCK_K)
        acc += tl.load(segment + ns[:, None] * BLOCK_K + cs[None, :], mask=end > start, other=0.0)
    cols = block * BLOCK_K + cs
    tl.store(DW + ns[:, None] * K + cols[None, :], acc, mask=(ns < N)[:, None] & (cols < K)[None, :])


def p_through_tma(n_pad: int) -> bool:
    """TMA needs grad_proj's row stride to be a multiple of 16 bytes."""
    return n_pad * 4 % 16 == 0


def launch_backward(cfg: MhcConfig, x, weight, grad_proj, grad_r, r, dx, dweight, segments,
                    n_rows: int) -> None:
    """segments: FP32 workspace of segment_slots(cfg, K) * n_block(N) * cfg.block_k elements."""
    if n_rows == 0:
        dweight.zero_()
        return
    n, k = weight.shape
    n_pad, nb = grad_proj.shape[1], n_block(n)
    x_desc = TensorDescriptor.from_tensor(x, [cfg.block_t, cfg.block_k])
    dx_desc = TensorDescriptor.from_tensor(dx, [cfg.block_t, cfg.block_k])
    p_tma = p_through_tma(n_pad)
    p_desc = (TensorDescriptor(grad_proj, [n_rows, n], [n_pad, 1], [cfg.block_t, nb]) if p_tma
              else x_desc)
    on_gpu = x.is_cuda
    _mhc_bwd_kernel[(cfg.programs,)](
        x_desc, dx_desc, p_desc, grad_proj, weight, grad_r, r, segments, n_rows, K=k, N=n,
        N_PAD=n_pad, N_BLOCK=nb, BLOCK_T=cfg.block_t, BLOCK_K=cfg.block_k,
        NUM_STAGES=cfg.num_stages, P_TMA=p_tma, DOT_FP32=not on_gpu, PDL=on_gpu,
        num_warps=cfg.num_warps, maxnreg=cfg.max_registers)
    _mhc_segments_sum_kernel[(triton.cdiv(k, cfg.block_k),)](
        segments, dweight, n_rows, cfg.programs, K=k, N=n, N_BLOCK=nb, BLOCK_T=cfg.block_t,
        BLOCK_K=cfg.block_k, AFTER_PRIMARY=on_gpu, launch_pdl=on_gpu, num_warps=4)
