"""CuTe DSL kernel for projection GEMM + RoPE + dual-direction MXFP8 (Hopper, sm_90a).

What Triton 3.6 cannot express and this kernel needs: TMA multicast. A CTA owns 128 tokens x one
head (192 features); two CTAs along the tokens form a cluster and each loads half of the head's
W slice, multicast to both. One N = 192 wgmma per 16-wide K step reads x from shared memory once.

Warpgroups: a producer (one warp issues the TMA loads), two MMA warpgroups (64 tokens each, the
FP32 accumulator in registers) and one epilogue warpgroup. The kernel is persistent. After a
tile's K loop the MMA warpgroups write the FP32 tile to shared memory (rows padded to 200 words,
so an 8-byte store takes the minimum two wavefronts) and start the next tile while the epilogue
warpgroup applies RoPE and quantizes from shared memory, under the next tile's products. The
epilogue first rotates the rope features in place (into output order), then reads the staged
tile once: a lane holds 8 token rows x 4 features of a 32-feature block and quantizes both
directions from the same registers.

Needs nvidia-cutlass-dsl (a default dependency on Linux x86-64); the plan uses it when it imports and
falls back to the Triton/Gluon kernels otherwise. Index math on outputs is 64-bit.
"""
from __future__ import annotations

from functools import lru_cache

import cuda.bindings.driver as cuda_driver
import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90_utils
import torch
from cutlass.cute.nvgpu import cpasync, warpgroup
from cutlass.cute.runtime import make_ptr
from cutlass.tensor_utils import LayoutEnum

from ...cute_launch import INT32, launch, launcher_for, POINTER
from ...kernel_utils import PDL_ENABLED
from ...streams import current_stream
from ...validate import sm_count

BLOCK_M = 128          # tokens per CTA
HALF_M = 64            # tokens per MMA warpgroup
BLOCK_K = 64
CLUSTER_M = 2          # CTAs along the tokens sharing one W slice
THREADS = 512          # producer, two MMA warpgroups, epilogue
NOPE, ROPE = 128, 64
HEAD_DIM = NOPE + ROPE
PITCH = HEAD_DIM + 8   # words per staged row: rows start 8 banks apart (see the docstring)

# Named barriers (0 is the CTA-wide one), between the MMA warpgroups and the epilogue. Both sides
# sync rather than one arriving: it times the same on the H200 and compute-sanitizer's racecheck
# then sees the order (it does not follow an arrive to a sync).
_BAR_FULL = 1          # the FP32 tile is staged
_BAR_EMPTY = 2         # the epilogue has read it
_HANDOFF_THREADS = 384


def _fmax(a, b):
    """max(a, b) that returns NaN when either is NaN (a block's NaN must reach its scale)."""
    return cute.arch.inline_ptx("max.NaN.f32 {$w0}, {$r0}, {$r1};",
                                write_only_types=[cutlass.Float32], read_only_args=[a, b])


def _abs_max(values):
    """max |v| over a list of FP32 values, as a tree."""
    level = [cute.arch.inline_ptx("abs.f32 {$w0}, {$r0};", write_only_types=[cutlass.Float32],
                                  read_only_args=[v]) for v in values]
    while len(level) > 1:
        nxt = [_fmax(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def _e8m0(amax):
    """(E8M0 code e + 127, FP32 factor 2^-e) of a block maximum, e = ceil(log2(max(amax, 1e-30)
    / 448)), in [-127, 120] for a finite amax. With amax = m * 2^E and 448 = 1.75 * 2^8, e is
    E - 8 plus one when m > 1.75, which adding 0x1FFFFF to the bits carries into the exponent
    field. A NaN or infinite amax gives the OCP MX NaN scale, code 255, and a NaN factor, so
    that the block's codes are all E4M3's NaN."""
    return cute.arch.inline_ptx(
        "{ .reg .b32 b, t; .reg .pred p;"
        " max.NaN.f32 b, {$r0}, 0f0DA24260;"
        " setp.ge.u32 p, b, 0x7F800000;"
        " add.u32 t, b, 0x1FFFFF; shr.u32 t, t, 23; sub.u32 {$w0}, t, 8;"
        " @p mov.u32 {$w0}, 255;"
        " sub.u32 t, 254, {$w0}; shl.b32 t, t, 23; @p mov.b32 t, 0x7FFFFFFF;"
        " mov.b32 {$w1}, t; }",
        write_only_types=[cutlass.Int32, cutlass.Float32], read_only_args=[amax])


def _e4m3x4(v0, v1, v2, v3):
    """Four E4M3 codes in a 32-bit word, v0 in the low byte."""
    return cute.arch.inline_ptx(
        "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, {$r1}, {$r0};"
        " cvt.rn.satfinite.e4m3x2.f32 hi, {$r3}, {$r2}; mov.b32 {$w0}, {lo, hi}; }",
        write_only_types=[cutlass.Uint32], read_only_args=[v0, v1, v2, v3])


def _lds4(addr):
    return cute.arch.inline_ptx(
        "ld.shared.v4.f32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];",
        write_only_types=[cutlass.Float32] * 4, read_only_args=[addr])


def _sts2(addr, a, b):
    cute.arch.inline_ptx("st.shared.v2.f32 [{$r0}], {{$r1}, {$r2}};", read_only_args=[addr, a, b])


def _ldg_u32x2(addr):
    """Two 32-bit words (an L2-resident read), converted only where they are used so the load
    goes out early."""
    return cute.arch.inline_ptx(
        "ld.global.nc.v2.b32 {{$w0}, {$w1}}, [{$r0}];",
        write_only_types=[cutlass.Uint32] * 2, read_only_args=[addr])


def _bf16x4(w0, w1):
    """The four BF16 values packed in two words, as FP32."""
    return cute.arch.inline_ptx(
        "{ .reg .b32 a, b, c, d; shl.b32 a, {$r0}, 16; and.b32 b, {$r0}, 0xFFFF0000;"
        " shl.b32 c, {$r1}, 16; and.b32 d, {$r1}, 0xFFFF0000; mov.b32 {$w0}, a;"
        " mov.b32 {$w1}, b; mov.b32 {$w2}, c; mov.b32 {$w3}, d; }",
        write_only_types=[cutlass.Float32] * 4, read_only_args=[w0, w1])


def _sts4(addr, a, b, c, d):
    cute.arch.inline_ptx("st.shared.v4.f32 [{$r0}], {{$r1}, {$r2}, {$r3}, {$r4}};",
                         read_only_args=[addr, a, b, c, d])


def _stg_word(addr, w, pred):
    cute.arch.inline_ptx("st.global.b32 [{$r0}], {$r1};", read_only_args=[addr, w],
                         predicate=pred)


def _select_int(pred, a, b):
    return cute.arch.inline_ptx("selp.b32 {$w0}, {$r0}, {$r1}, {$r2};",
                                write_only_types=[cutlass.Int32],
                                read_only_args=[a, b, pred])


def _stg1(addr, b, pred):
    cute.arch.inline_ptx("st.global.b8 [{$r0}], {$r1};",
                         read_only_args=[addr, b.to(cutlass.Uint16)], predicate=pred)


def _trig_words(cos, sin, t, tokens, seg):
    """cos and sin of a lane's 4 rope pairs (j = 4 seg .. 4 seg + 3) in both halves, token t
    (clamped), as the 8 raw words of 4 loads."""
    t_ld = cutlass.Int64(cutlass.min(t, tokens - 1)) * (ROPE * 2)
    return [w for half in (0, ROPE // 2) for table in (cos, sin)
            for w in _ldg_u32x2(table.iterator.toint() + t_ld + (half + 4 * seg) * 2)]


def _rotate_rope(staged, first_row, seg, step0, trig):
    """RoPE in place for 4 row steps (rows first_row + 4 step): the lane reads its pairs
    (x1_j, x2_j) at rope words 2j, 2j + 1 (j = 4 seg .. 4 seg + 3) and writes out[j] =
    x1_j cos_j - x2_j sin_j to word j and out[32 + j] = x2_j cos_(32+j) + x1_j sin_(32+j) to
    word 32 + j: output order. All loads of the 4 steps go out first, and a warp sync puts every
    lane's reads before any lane's writes (lanes write words that other lanes read)."""
    addrs = [staged + ((first_row + 4 * (step0 + g)) * PITCH + NOPE) * 4 for g in range(4)]
    pes = [list(_lds4(a + 32 * seg)) + list(_lds4(a + 32 * seg + 16)) for a in addrs]
    cute.arch.sync_warp()              # every lane's reads before any lane's writes
    for a, pe, words in zip(addrs, pes, trig):
        c, s_ = _bf16x4(words[0], words[1]), _bf16x4(words[2], words[3])
        first = [pe[2 * i] * c[i] - pe[2 * i + 1] * s_[i] for i in range(4)]
        c, s_ = _bf16x4(words[4], words[5]), _bf16x4(words[6], words[7])
        second = [pe[2 * i + 1] * c[i] + pe[2 * i] * s_[i] for i in range(4)]
        _sts4(a + 16 * seg, *first)
        _sts4(a + (ROPE // 2) * 4 + 16 * seg, *second)


class ProjRopeKernel:
    """Y = x @ W^T for one 192-feature head per CTA, then RoPE and both MXFP8 directions."""

    def __init__(self, stages: int = 3):
        self.stages = stages

    @cute.jit
    def __call__(self, x_ptr: cute.Pointer, w_ptr: cute.Pointer, cos_ptr: cute.Pointer,
                 sin_ptr: cute.Pointer, row_ptr: cute.Pointer, row_s_ptr: cute.Pointer,
                 col_ptr: cute.Pointer, col_s_ptr: cute.Pointer, tokens: cutlass.Int32,
                 k: cutlass.Int32, heads: cutlass.Int32, num_clusters: cutlass.Int32, stream):
        """Operands as pointers and extents (cheaper per call than tensors from DLPack): x
        [tokens, k], w [heads * 192, k], cos and sin [tokens, 64], row and col codes
        [tokens, heads * 192], row scales [tokens, heads * 6], col scales
        [tokens / 32, heads * 192], all row-major."""
        n_total = heads * HEAD_DIM

        def rows(ptr, n_rows, n_cols):
            return cute.make_tensor(ptr, cute.make_layout((n_rows, n_cols), stride=(n_cols, 1)))

        x, w = rows(x_ptr, tokens, k), rows(w_ptr, n_total, k)
        cos, sin = rows(cos_ptr, tokens, ROPE), rows(sin_ptr, tokens, ROPE)
        row, col = rows(row_ptr, tokens, n_total), rows(col_ptr, tokens, n_total)
        row_s = rows(row_s_ptr, tokens, n_total // 32)
        col_s = rows(col_s_ptr, tokens // 32, n_total)
        ab = x.element_type
        tile = (BLOCK_M, HEAD_DIM, BLOCK_K)
        tiled_mma = sm90_utils.make_trivial_tiled_mma(
            ab, ab, LayoutEnum.from_tensor(x).sm90_mma_major_mode(),
            LayoutEnum.from_tensor(w).sm90_mma_major_mode(), cutlass.Float32, (2, 1, 1),
            tiler_mn=(HALF_M, HEAD_DIM))
        a_layout = sm90_utils.make_smem_layout_a(LayoutEnum.from_tensor(x), tile, ab, self.stages)
        b_layout = sm90_utils.make_smem_layout_b(LayoutEnum.from_tensor(w), tile, ab, self.stages)
        tma_a, ga = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), x, cute.slice_(a_layout, (None, None, 0)),
            (BLOCK_M, BLOCK_K))
        tma_b, gb = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SMulticastOp(), w, cute.slice_(b_layout, (None, None, 0)),
            (HEAD_DIM, BLOCK_K), num_multicast=CLUSTER_M)

        @cute.struct
        class Storage:
            barriers: cute.struct.MemRange[cutlass.Int64, self.stages * 2]
            staged: cute.struct.Align[cute.struct.MemRange[cutlass.Float32, BLOCK_M * PITCH], 16]
            sa: cute.struct.Align[cute.struct.MemRange[ab, cute.cosize(a_layout)], 1024]
            sb: cute.struct.Align[cute.struct.MemRange[ab, cute.cosize(b_layout)], 1024]

        self.storage = Storage
        self.kernel(tiled_mma, tma_a, ga, tma_b, gb, cos, sin, row, row_s, col, col_s,
                    a_layout, b_layout).launch(
            grid=(CLUSTER_M * num_clusters, 1, 1), block=(THREADS, 1, 1),
            cluster=(CLUSTER_M, 1, 1), stream=stream, use_pdl=PDL_ENABLED)

    @cute.kernel
    def kernel(self, mma: cute.TiledMma, tma_a: cute.CopyAtom, ga: cute.Tensor,
               tma_b: cute.CopyAtom, gb: cute.Tensor, cos: cute.Tensor, sin: cute.Tensor,
               row: cute.Tensor, row_s: cute.Tensor, col: cute.Tensor, col_s: cute.Tensor,
               a_layout: cute.ComposedLayout, b_layout: cute.ComposedLayout):
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        gdim, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        rank = cute.arch.make_warp_uniform(cute.arch.block_idx_in_cluster())
        cluster = bidx // CLUSTER_M
        num_clusters = gdim // CLUSTER_M
        if warp == 0:
            cpasync.prefetch_descriptor(tma_a)
            cpasync.prefetch_descriptor(tma_b)

        st = utils.SmemAllocator().allocate(self.storage)
        sa = st.sa.get_tensor(a_layout.outer, swizzle=a_layout.inner)
        sb = st.sb.get_tensor(b_layout.outer, swizzle=b_layout.inner)
        staged = st.staged.data_ptr().toint()          # shared-memory byte address
        pipe = pipeline.PipelineTmaAsync.create(
            barrier_storage=st.barriers.data_ptr(), num_stages=self.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, CLUSTER_M * 8),
            tx_count=(BLOCK_M + HEAD_DIM) * BLOCK_K * 2,
            cta_layout_vmnk=cute.make_layout((1, CLUSTER_M, 1, 1)), defer_sync=True)
        pipeline.pipeline_init_arrive(cluster_shape_mn=(CLUSTER_M, 1), is_relaxed=True)

        tokens = ga.shape[0]
        k_tiles = cute.ceil_div(ga.shape[1], BLOCK_K)
        m_pairs = cute.ceil_div(tokens, BLOCK_M * CLUSTER_M)
        heads = gb.shape[0] // HEAD_DIM
        cluster_tiles = m_pairs * heads

        tAsA, tAgA = cpasync.tma_partition(
            tma_a, 0, cute.make_layout(1), cute.group_modes(sa, 0, 2),
            cute.group_modes(cute.local_tile(ga, (BLOCK_M, BLOCK_K), (None, None)), 0, 2))
        tBsB, tBgB = cpasync.tma_partition(
            tma_b, rank, cute.make_layout(CLUSTER_M), cute.group_modes(sb, 0, 2),
            cute.group_modes(cute.local_tile(gb, (HEAD_DIM, BLOCK_K), (None, None)), 0, 2))
        pipeline.pipeline_init_wait(cluster_shape_mn=(CLUSTER_M, 1))
        # Launched as a programmatic dependent launch, the set-up above overlaps the previous
        # kernel's drain; no global memory is touched before it has finished.
        cute.arch.griddepcontrol_wait()

        if warp < 4:
            cute.arch.warpgroup_reg_dealloc(40)
            if warp == 0:
                state = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer,
                                                     self.stages)
                for ct in cutlass.range(cluster, cluster_tiles, num_clusters, unroll=1):
                    head = ct // m_pairs
                    m_tile = (ct % m_pairs) * CLUSTER_M + rank
                    for kt in cutlass.range(k_tiles, unroll=1):
                        pipe.producer_acquire(state)
                        bar = pipe.producer_get_barrier(state)
                        cute.copy(tma_a, tAgA[(None, m_tile, kt)], tAsA[(None, state.index)],
                                  tma_bar_ptr=bar)
                        cute.copy(tma_b, tBgB[(None, head, kt)], tBsB[(None, state.index)],
                                  tma_bar_ptr=bar, mcast_mask=cutlass.Int16((1 << CLUSTER_M) - 1))
                        state.advance()
                pipe.producer_tail(state)
        elif warp < 12:
            cute.arch.warpgroup_reg_alloc(160)
            mtid = tidx - 128
            thr = mma.get_slice(mtid)
            tCrA = mma.make_fragment_A(thr.partition_A(sa))
            tCrB = mma.make_fragment_B(thr.partition_B(sb))
            acc = cute.make_rmem_tensor(
                thr.partition_C(cute.make_identity_tensor((BLOCK_M, HEAD_DIM))).shape,
                cutlass.Float32)
            k_blocks = cute.size(tCrA, mode=[2])
            # This thread's accumulator rows (r, r + 8) and column pair 2 * (lane % 4).
            lane = mtid % 32
            r = (mtid // 32) * 16 + lane // 4
            my_staged = staged + (r * PITCH + 2 * (lane % 4)) * 4
            read = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, self.stages)
            release = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer,
                                                   self.stages)
            for ct in cutlass.range(cluster, cluster_tiles, num_clusters, unroll=1):
                mma.set(warpgroup.Field.ACCUMULATE, False)
                for kt in cutlass.range(k_tiles, unroll=1):
                    pipe.consumer_wait(read)
                    warpgroup.fence()
                    for kb in cutlass.range_constexpr(k_blocks):
                        cute.gemm(mma, acc, tCrA[(None, None, kb, read.index)],
                                  tCrB[(None, None, kb, read.index)], acc)
                        mma.set(warpgroup.Field.ACCUMULATE, True)
                    warpgroup.commit_group()
                    if kt > 0:
                        warpgroup.wait_group(1)
                        pipe.consumer_release(release)
                        release.advance()
                    read.advance()
                warpgroup.wait_group(0)
                pipe.consumer_release(release)
                release.advance()
                if ct != cluster:
                    cute.arch.barrier(barrier_id=_BAR_EMPTY, number_of_threads=_HANDOFF_THREADS)
                for j in cutlass.range_constexpr(HEAD_DIM // 8):
                    for h in cutlass.range_constexpr(2):
                        _sts2(my_staged + (8 * h * PITCH + 8 * j) * 4, acc[j * 4 + 2 * h],
                              acc[j * 4 + 2 * h + 1])
                cute.arch.barrier(barrier_id=_BAR_FULL, number_of_threads=_HANDOFF_THREADS)
        else:
            cute.arch.warpgroup_reg_alloc(152)
            etid = tidx - 384
            n_total = heads * HEAD_DIM
            lane = etid % 32
            seg = lane % 8                               # this lane's 4 rope pairs: j = 4 seg ..
            first_row = 32 * (etid // 32) + lane // 8     # this lane's rows in the rope pre-pass
            for ct in cutlass.range(cluster, cluster_tiles, num_clusters, unroll=1):
                head = ct // m_pairs
                m_tile = (ct % m_pairs) * CLUSTER_M + rank
                t_first = m_tile * BLOCK_M + first_row
                # cos/sin of the first 4 row steps go out before the wait for the tile.
                trig_a = [_trig_words(cos, sin, t_first + 4 * g, tokens, seg)
                          for g in range(4)]
                cute.arch.barrier(barrier_id=_BAR_FULL, number_of_threads=_HANDOFF_THREADS)
                trig_b = [_trig_words(cos, sin, t_first + 4 * g, tokens, seg)
                          for g in range(4, 8)]
                _rotate_rope(staged, first_row, seg, 0, trig_a)
                _rotate_rope(staged, first_row, seg, 4, trig_b)
                cute.arch.sync_warp()                # the quantizer reads what its warp rotated
                self.quantize(etid, m_tile, head, tokens, n_total, staged, row, row_s, col, col_s)
                if ct + num_clusters < cluster_tiles:
                    cute.arch.barrier(barrier_id=_BAR_EMPTY, number_of_threads=_HANDOFF_THREADS)

    @cute.jit
    def quantize(self, etid, m_tile, head, tokens, n_total, staged, row, row_s, col, col_s):
        """Both directions from one read of the staged tile. Warp w takes token rows 32 w ..
        32 w + 31 (one column-wise block); lane (tg, fg) holds rows 8 tg .. 8 tg + 7 x features
        4 fg .. 4 fg + 3 of each 32-feature block. A column's maximum takes two shuffles
        across tg, a row's three across fg, and every code store is a 4-byte word of one row."""
        lane = etid % 32
        tg = lane // 8
        fg = lane % 8
        r0 = 32 * (etid // 32) + 8 * tg
        t0 = m_tile * BLOCK_M + r0
        t_block = m_tile * (BLOCK_M // 32) + etid // 32
        # Lane fg keeps the row-wise scale codes of block fg, one per row, for the end.
        k0 = cutlass.Int32(0)
        k1 = cutlass.Int32(0)
        k2 = cutlass.Int32(0)
        k3 = cutlass.Int32(0)
        k4 = cutlass.Int32(0)
        k5 = cutlass.Int32(0)
        k6 = cutlass.Int32(0)
        k7 = cutlass.Int32(0)
        for fb in cutlass.range(HEAD_DIM // 32, unroll=1):
            v = [list(_lds4(staged + ((r0 + k) * PITCH + 32 * fb + 4 * fg) * 4))
                 for k in range(8)]
            # Each step runs over all twelve maxima before the next starts (the helpers are
            # asm, which keeps program order), so their shuffles are in flight together.
            mc = [_abs_max([v[k][i] for k in range(8)]) for i in range(4)]
            mr = [_abs_max(v[k]) for k in range(8)]
            for offset_c, offset_r in ((8, 1), (16, 2)):
                oc = [cute.arch.shuffle_sync_bfly(m, offset=offset_c) for m in mc]
                orr = [cute.arch.shuffle_sync_bfly(m, offset=offset_r) for m in mr]
                mc = [_fmax(a, b) for a, b in zip(mc, oc)]
                mr = [_fmax(a, b) for a, b in zip(mr, orr)]
            orr = [cute.arch.shuffle_sync_bfly(m, offset=4) for m in mr]
            mr = [_fmax(a, b) for a, b in zip(mr, orr)]
            cs = [_e8m0(m) for m in mc]
            rs = [_e8m0(m) for m in mr]
            _stg_word(col_s.iterator.toint() + cutlass.Int64(t_block) * n_total
                      + head * HEAD_DIM + 32 * fb + 4 * fg,
                      cs[0][0] | (cs[1][0] << 8) | (cs[2][0] << 16) | (cs[3][0] << 24),
                      (tg == 0) & (t_block < tokens // 32))
            mine = fg == fb
            codes = [k0, k1, k2, k3, k4, k5, k6, k7]
            for k in cutlass.range_constexpr(8):
                at = cutlass.Int64(t0 + k) * n_total + head * HEAD_DIM + 32 * fb + 4 * fg
                vk, (code, factor) = v[k], rs[k]
                _stg_word(row.iterator.toint() + at,
                          _e4m3x4(vk[0] * factor, vk[1] * factor, vk[2] * factor,
                                  vk[3] * factor), t0 + k < tokens)
                _stg_word(col.iterator.toint() + at,
                          _e4m3x4(vk[0] * cs[0][1], vk[1] * cs[1][1], vk[2] * cs[2][1],
                                  vk[3] * cs[3][1]), t0 + k < tokens)
                codes[k] = _select_int(mine, code, codes[k])
            k0, k1, k2, k3, k4, k5, k6, k7 = codes
        codes = [k0, k1, k2, k3, k4, k5, k6, k7]
        for k in cutlass.range_constexpr(8):
            _stg1(row_s.iterator.toint() + cutlass.Int64(t0 + k) * (n_total // 32) + head * 6
                  + fg, codes[k], (t0 + k < tokens) & (fg < HEAD_DIM // 32))


# -- launch ----------------------------------------------------------------------------------------
STAGES = 3


def fits_cute_kernel(k: int, nope: int, rope: int, w_out_in: bool) -> bool:
    """DeepSeek's head (128 + 64), W stored [N, K] (both operands K-major for the TMA), and rows
    of x and W whose byte pitch the TMA accepts (a multiple of 16)."""
    return w_out_in and nope == NOPE and rope == ROPE and k % 8 == 0


# Byte alignment the kernel's accesses need of x, w (TMA), cos, sin (8-byte loads), row codes
# (4-byte stores), row scales (bytes), col codes and col scales (4-byte stores); the plan's
# contract gives 16 for every operand.
ALIGNMENT = (16, 16, 8, 8, 4, 1, 4, 4)


# Each pointer argument's (cutlass dtype, alignment in bytes), in order
POINTER_TYPES = tuple(zip((cutlass.BFloat16,) * 4 + (cutlass.Uint8,) * 4, ALIGNMENT))


# The compiled function's arguments: eight pointers, four extents, the stream
ARGUMENT_KINDS = (POINTER,) * 8 + (INT32,) * 4 + (POINTER,)


def compile_kernel(stream: int):
    """The kernel compiled for every shape (all extents are run-time values), about 1-2 s;
    ``stream``: a stream handle of the device (on a machine without a GPU, any value, with
    CUTE_DSL_ARCH=sm_90a set)."""
    # Compiling needs the operands' types and alignments, not memory: null pointers stand in.
    args = [make_ptr(dtype, 0, cute.AddressSpace.gmem, assumed_align=align)
            for dtype, align in POINTER_TYPES]
    return cute.compile(ProjRopeKernel(STAGES), *args, cutlass.Int32(32), cutlass.Int32(64),
                        cutlass.Int32(1), cutlass.Int32(1), cuda_driver.CUstream(stream))


@lru_cache(maxsize=None)
def compiled(device_index: int):
    """``compile_kernel`` once per process and device."""
    return compile_kernel(torch.cuda.current_stream(torch.device("cuda", device_index)).cuda_stream)


@lru_cache(maxsize=None)
def launcher(device_index: int):
    """The compiled kernel's launch on that device (graphrt.cute_launch)."""
    return launcher_for(compiled(device_index), device_index, ARGUMENT_KINDS, POINTER_TYPES)


def clusters(device, tokens: int, heads: int) -> int:
    """The persistent grid's clusters: one per (two 128-token tiles, head), at most one per
    two SMs."""
    return min(sm_count(device) // CLUSTER_M, -(-tokens // (BLOCK_M * CLUSTER_M)) * heads)


def launch_cute(x, w, cos, sin, row, row_s, col, col_s, *, tokens: int, heads: int) -> None:
    """The kernel on the current stream. Outputs as uint8 views: row and col [tokens, heads, 192],
    row_s [tokens, heads, 6], col_s [tokens / 32, heads, 192]; every operand aligned as
    ``ALIGNMENT`` says."""
    if tokens == 0:
        return
    launch(launcher(x.device.index), current_stream(x.device).cuda_stream,
           (x, w, cos, sin, row, row_s, col, col_s),
           (tokens, x.shape[1], heads, clusters(x.device, tokens, heads)))
