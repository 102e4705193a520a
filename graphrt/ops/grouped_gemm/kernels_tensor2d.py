"""Hopper kernel (Gluon; Triton 3.6 and 3.9) for the BF16 grouped wgrad of tensor2d operands in
any of the contract's layouts: A K-major ([hidden, T] in memory) or M-major (the transpose of a
[T, hidden] activation), B K-major ([intermediate, T] in memory) or N-major ([T,
intermediate]).

The design of the 1x128 FP8 kernel (kernels_gluon.py), whose loader and zeroing it shares:
host-made TMA descriptors over the whole operands, blocks of 64 tokens counted from token 0,
so every box starts 128-byte aligned in K-major operands and on a row in the others. An
expert's blocks are the ones holding its tokens; in a block it shares with a neighbour, the
other tokens are zeroed in shared memory in both operands before the product (tokens past T
come as zeros from TMA), so no neighbour's value, NaN included, reaches its sum. M- and
N-major stages are [tokens, rows] and reach the tensor cores transposed.

A persistent program is warp-specialized: a loader warp streams the blocks into a ring of
stages; two MMA warpgroups (64 output rows each) keep one product in flight into their FP32
sums, which go to the output 16 bytes a store. Up to ``sorted_max_experts`` experts the
programs walk the experts sorted by count, largest first, the programs' order reversed every
round (the ragged kernel's split, kernels_ragged.py); otherwise items p, p + programs, ...,
experts outermost. K-major operands need T a multiple of 8 (TMA's 16-byte row strides;
``fits_tensor2d_kernel``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait

from ...kernel_utils import (CompileCase, CONSTEXPR, gluon_descriptor, gluon_descriptor_type,
                             launch, ON_TESTED_TRITON, register_share, TL_DTYPES,
                             untested_triton_case)
from ...validate import sm_count
from .kernels import experts_vector
from .kernels_gluon import (_box_extents, _expert_ranks, _load_partition, _release,
                            _sorted_rounds, _sorted_tile_work, _stage_ready, _stage_ring,
                            _store_item, _store_layout, _tile_count, _work, BLOCK_M,
                            EVERY_EXPERT)

BLOCK_K = gl.constexpr(64)   # tokens a stage: 128 bytes of BF16, the swizzle's width
GROUP_M = 8
GLUON_API_OK = ON_TESTED_TRITON
LAUNCH_REGS = register_share(4 + 4 + 4)
LOADER_REGS, MMA_REGS = gl.constexpr(24), gl.constexpr(232)


@dataclass(frozen=True)
class Tensor2dTmaConfig:
    """Output columns per tile (128 output rows) and shared-memory stages (a stage holds
    (128 + block_n) x 64 BF16: 48 KB at 256 columns); ``group``: row tiles an expert's tile
    order walks before its next column tile; ``sorted_experts``: the sorted split up
    to ``sorted_max_experts`` experts; ``plan_layouts``: the (A, B) layouts ("k" or "mn", as
    contracts spell them) whose plans run this kernel, for calls of up to
    ``sorted_max_experts`` experts. All four: on the H200 (docs/perf/wgrad.md, 2026-12-03)
    the sorted split took 0.95-0.99x the plan's other kernels' time at E8 7168 x 2048 and E32
    4096 x 1536 (1.02-1.03x only for M-N with odd counts) and 0.86-0.91x for M-N at E8 2048 x
    1024, where every layout then ran in 60.2-60.4 us against 63.5-76.4 before; items in
    order took 0.98-1.10x."""

    block_n: int = 256
    stages: int = 4
    sorted_experts: bool = True
    sorted_max_experts: int = 64
    group: int = GROUP_M
    plan_layouts: frozenset = frozenset({("mn", "mn"), ("k", "mn"), ("k", "k"), ("mn", "k")})

    def sorts(self, experts: int) -> bool:
        """Whether a call of ``experts`` experts takes the sorted split."""
        return self.sorted_experts and experts <= self.sorted_max_experts

    def runs(self, a_layout: str, b_layout: str, experts: int) -> bool:
        """Whether plans of these layouts and ``experts`` experts run this kernel."""
        return (a_layout, b_layout) in self.plan_layouts and self.sorts(experts)


TENSOR2D_TMA_CONFIG = Tensor2dTmaConfig()


@gluon.constexpr_function
def _instr_k(dtype):
    """Tokens one wgmma instruction takes: 32 bytes of the operands' type (16 BF16, 32 FP8;
    FP8 operands serve only scripts/fp8_unscaled.py's bound, not the contract)."""
    return 256 // dtype.primitive_bitwidth


@gluon.jit
def _item_sum(a_bufs, b_bufs, ready, empty, zeroed, OUT, OUT_PTRS, expert, m0, n0, begin, end,
              i, z, HIDDEN: gl.constexpr, INTER: gl.constexpr, DISCRETE: gl.constexpr,
              ACCUMULATE: gl.constexpr, OUT_DTYPE: gl.constexpr, A_K_MAJOR: gl.constexpr,
              B_K_MAJOR: gl.constexpr, ROW0: gl.constexpr):
    """One work item of one warpgroup: the sum over the expert's blocks (the i-th filled
    onwards) with one product in flight, and its store; (stages used, zeroings) so far."""
    BN: gl.constexpr = _box_extents(b_bufs.shape, B_K_MAJOR)[1]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, _instr_k(a_bufs.dtype)])
    acc = gl.zeros([64, BN], gl.float32, layout)
    first = begin // BLOCK_K
    last = (end + BLOCK_K - 1) // BLOCK_K
    for block in range(first, last):
        s, z = _stage_ready(a_bufs, b_bufs, ready, zeroed, i, z, block, begin, end, ROW0,
                            A_K_MAJOR, B_K_MAJOR)
        if A_K_MAJOR:
            a = a_bufs.index(s).slice(ROW0, 64, dim=0)
        else:
            a = a_bufs.index(s).slice(ROW0, 64, dim=1).permute((1, 0))
        if B_K_MAJOR:
            b = b_bufs.index(s).permute((1, 0))
        else:
            b = b_bufs.index(s)
        acc = warpgroup_mma(a, b, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        if block > first:
            _release(empty, i - 1)
        i += 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    if last > first:
        _release(empty, i - 1)
    out_layout: gl.constexpr = _store_layout(BN)
    acc = gl.convert_layout(acc, out_layout)
    m = m0 + ROW0 + gl.arange(0, 64, layout=gl.SliceLayout(1, out_layout))
    n = n0 + gl.arange(0, BN, layout=gl.SliceLayout(0, out_layout))
    _store_item(acc, OUT, OUT_PTRS, expert, m, n, end > begin, HIDDEN, INTER, DISCRETE,
                ACCUMULATE, OUT_DTYPE)
    return i, z


@gluon.jit
def _mma_partition(a_bufs, b_bufs, ready, empty, zeroed, OFFSETS, OUT, OUT_PTRS, ERRORS, experts,
                   tokens_sum, HIDDEN: gl.constexpr, INTER: gl.constexpr, DISCRETE: gl.constexpr,
                   ACCUMULATE: gl.constexpr, OUT_DTYPE: gl.constexpr, GROUP: gl.constexpr,
                   A_K_MAJOR: gl.constexpr, B_K_MAJOR: gl.constexpr, SORTED: gl.constexpr,
                   EXPERTS_POW2: gl.constexpr, ROW0: gl.constexpr):
    """One warpgroup: output rows ROW0 .. ROW0 + 63 of each tile, the items in the loader's
    order (``_load_partition``)."""
    BN: gl.constexpr = _box_extents(b_bufs.shape, B_K_MAJOR)[1]
    tiles: gl.constexpr = _tile_count(HIDDEN, INTER, BN)
    i = 0
    z = 0
    if SORTED:
        ranks, idx, taken = _expert_ranks(OFFSETS, experts, tokens_sum, EXPERTS_POW2, 4, 8,
                                          EVERY_EXPERT)
        for round_ in range(0, _sorted_rounds(taken, tiles)):
            live, expert, m0, n0, begin, end = _sorted_tile_work(
                round_, ranks, idx, taken, OFFSETS, ERRORS, experts, tokens_sum, ROW0 == 0,
                HIDDEN, INTER, BN, GROUP)
            if live:
                i, z = _item_sum(a_bufs, b_bufs, ready, empty, zeroed, OUT, OUT_PTRS, expert,
                                 m0, n0, begin, end, i, z, HIDDEN, INTER, DISCRETE, ACCUMULATE,
                                 OUT_DTYPE, A_K_MAJOR, B_K_MAJOR, ROW0)
    else:
        for work in range(gl.program_id(0), experts * tiles, gl.num_programs(0)):
            expert, m0, n0, begin, end = _work(work, OFFSETS, ERRORS, experts, tokens_sum,
                                               ROW0 == 0, HIDDEN, INTER, BN, GROUP)
            i, z = _item_sum(a_bufs, b_bufs, ready, empty, zeroed, OUT, OUT_PTRS, expert, m0,
                             n0, begin, end, i, z, HIDDEN, INTER, DISCRETE, ACCUMULATE,
                             OUT_DTYPE, A_K_MAJOR, B_K_MAJOR, ROW0)


@gluon.jit(do_not_specialize=["experts", "tokens_sum"])
def _wgrad_tensor2d_tma_kernel(a_desc, b_desc, OFFSETS, OUT, OUT_PTRS, ERRORS, experts,
                               tokens_sum, HIDDEN: gl.constexpr, INTER: gl.constexpr,
                               DISCRETE: gl.constexpr, ACCUMULATE: gl.constexpr,
                               OUT_DTYPE: gl.constexpr, STAGES: gl.constexpr,
                               GROUP: gl.constexpr, A_K_MAJOR: gl.constexpr,
                               B_K_MAJOR: gl.constexpr, SORTED: gl.constexpr,
                               EXPERTS_POW2: gl.constexpr):
    a_bufs, b_bufs, ready, empty, zeroed = _stage_ring(a_desc, b_desc, STAGES)
    gl.warp_specialize([
        (_mma_partition, (a_bufs, b_bufs, ready, empty, zeroed, OFFSETS, OUT, OUT_PTRS, ERRORS,
                          experts, tokens_sum, HIDDEN, INTER, DISCRETE, ACCUMULATE, OUT_DTYPE,
                          GROUP, A_K_MAJOR, B_K_MAJOR, SORTED, EXPERTS_POW2, 0)),
        (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, OFFSETS, ERRORS,
                           experts, tokens_sum, HIDDEN, INTER, GROUP, A_K_MAJOR, B_K_MAJOR,
                           SORTED, EXPERTS_POW2)),
        (_mma_partition, (a_bufs, b_bufs, ready, empty, zeroed, OFFSETS, OUT, OUT_PTRS, ERRORS,
                          experts, tokens_sum, HIDDEN, INTER, DISCRETE, ACCUMULATE, OUT_DTYPE,
                          GROUP, A_K_MAJOR, B_K_MAJOR, SORTED, EXPERTS_POW2, 64)),
    ], [1, 4], [LOADER_REGS, MMA_REGS])


def _boxes(a_k_major: bool, b_k_major: bool, block_n: int) -> tuple[list, list]:
    """The descriptors' box shapes: [rows, tokens] for K-major operands, [tokens, rows] for
    the others."""
    a_box = [BLOCK_M.value, BLOCK_K.value] if a_k_major else [BLOCK_K.value, BLOCK_M.value]
    b_box = [block_n, BLOCK_K.value] if b_k_major else [BLOCK_K.value, block_n]
    return a_box, b_box


def fits_tensor2d_kernel(a, b, capability) -> bool:
    """Whether this kernel takes these BF16 tensor2d operands (a (hidden, T), b (T,
    intermediate), each with one unit-stride axis): a Hopper GPU, a tested Triton, T > 0,
    16-byte aligned bases and row strides (for K-major operands T a multiple of 8; for the others
    hidden and intermediate)."""
    if not (GLUON_API_OK and capability is not None and capability[0] == 9
            and a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16 and a.shape[1] > 0
            and a.data_ptr() % 16 == 0 and b.data_ptr() % 16 == 0):
        return False
    a_row = a.stride(0) if a.stride(1) == 1 else a.stride(1)
    b_row = b.stride(1) if b.stride(0) == 1 else b.stride(0)
    return (min(a.stride()) == 1 and min(b.stride()) == 1
            and a_row % 8 == 0 and b_row % 8 == 0)


def launch_wgrad_tensor2d_tma(a, b, offsets, out, out_ptrs, out_dtype, errors, *, hidden: int,
                              inter: int, accumulate: bool,
                              config: Tensor2dTmaConfig = TENSOR2D_TMA_CONFIG) -> None:
    """The BF16 wgrad of tensor2d operands through this kernel: arguments as
    kernels.launch_wgrad's, on operands ``fits_tensor2d_kernel`` accepts; each operand's
    layout read from its strides."""
    experts = offsets.numel()
    if experts == 0:
        return
    a_k_major, b_k_major = a.stride(1) == 1, b.stride(0) == 1
    a_box, b_box = _boxes(a_k_major, b_k_major, config.block_n)
    a_desc = gluon_descriptor(a if a_k_major else a.t(), a_box)
    b_desc = gluon_descriptor(b.t() if b_k_major else b, b_box)
    tiles = _tile_count(hidden, inter, config.block_n)
    out_arg, ptrs_arg = (a, out_ptrs) if out_ptrs is not None else (out, offsets)
    sort = config.sorts(experts)
    launch(_wgrad_tensor2d_tma_kernel, (min(tiles * experts, sm_count(a.device)),), a_desc,
           b_desc, offsets, out_arg, ptrs_arg, errors, experts, a.shape[1], HIDDEN=hidden,
           INTER=inter, DISCRETE=out_ptrs is not None, ACCUMULATE=accumulate,
           OUT_DTYPE=TL_DTYPES[out_dtype], STAGES=config.stages, GROUP=config.group,
           A_K_MAJOR=a_k_major, B_K_MAJOR=b_k_major, SORTED=sort,
           EXPERTS_POW2=experts_vector(experts) if sort else 2, num_warps=4,
           maxnreg=LAUNCH_REGS)


def compile_cases() -> list[CompileCase]:
    """The variants scripts/compile_check.py compiles: every layout at the first benchmark
    case's sizes, dense output, sorted split; M-N with discrete accumulating output, experts
    in order."""
    from ..registry import op
    _, hidden, inter, _ = op("grouped_gemm_wgrad").cases[0]
    c = CONSTEXPR
    cases = []
    for a_k, b_k, discrete in ((False, False, False), (True, False, False), (True, True, False),
                               (False, True, False), (False, False, True)):
        name = (f"wgrad tensor2d TMA (Gluon) A {'K' if a_k else 'M'}-major, "
                f"B {'K' if b_k else 'N'}-major, discrete={discrete}")
        if not GLUON_API_OK:
            cases.append(untested_triton_case(name))
            continue
        a_box, b_box = _boxes(a_k, b_k, TENSOR2D_TMA_CONFIG.block_n)
        cases.append(CompileCase(name, _wgrad_tensor2d_tma_kernel, dict(
            a_desc=gluon_descriptor_type(a_box, torch.bfloat16),
            b_desc=gluon_descriptor_type(b_box, torch.bfloat16),
            OFFSETS="*i32", OUT="*bf16", OUT_PTRS="*i64", ERRORS="*i32", experts="i32",
            tokens_sum="i32", HIDDEN=c, INTER=c, DISCRETE=c, ACCUMULATE=c, OUT_DTYPE=c,
            STAGES=c, GROUP=c, A_K_MAJOR=c, B_K_MAJOR=c, SORTED=c, EXPERTS_POW2=c),
            dict(HIDDEN=hidden, INTER=inter, DISCRETE=discrete, ACCUMULATE=discrete,
                 OUT_DTYPE=gl.bfloat16, STAGES=TENSOR2D_TMA_CONFIG.stages,
                 GROUP=TENSOR2D_TMA_CONFIG.group,
                 A_K_MAJOR=a_k, B_K_MAJOR=b_k, SORTED=not discrete,
                 EXPERTS_POW2=2 if discrete else 8),
            num_warps=4, maxnreg=LAUNCH_REGS, gluon=True))
    return cases
