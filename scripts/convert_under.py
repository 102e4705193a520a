"""Can the MXFP8 values pass run under the BF16 product, in the product's own programs? A
feasibility probe for issue 27's MXFP8 goal (docs/perf/wgrad.md, 2026-12-07).

The plan first writes every E4M3 code's BF16 value (the values pass, about 0.25 of the
product's time at the small case), then runs the BF16 K-K tensor2d kernel over them. A pass
beside the product on a few SMs is bounded at 1.14 / 1.18 / 1.33x the product
(scripts/copier_rate.py --beside): the product loses those SMs. Here the pass runs inside
every program of the product instead, in a fourth partition of CONV_WARPS warps: TMA brings
chunks of [rows, 32] codes (CHUNKS: 64, 128 or 256 rows) into a ring of shared memory, and
the warps turn them into values (each row's 32 tokens times its E8M0 scale, the scales loaded
two chunks ahead) stored 16 bytes at a time.

The kernel composes the package's own loader and MMA partitions (kernels_tensor2d,
kernels_gluon) with that converter, at the register splits of REG_SPLITS. Nothing connects the
two: the converter converts a buffer of the case's size that the product does not read, so
what this measures is a bound:
- the product's cost of sharing its SMs (the registers it gives up, issue slots, shared and
  DRAM bandwidth), with and without conversions to do;
- whether the converters finish the whole pass within the product's time;
- the converters' rate alone (a last row with every expert empty).
A design that used it would add per-block counters: the converters release each block of 64
tokens, the loader acquires it before its TMA loads. Measured on 2026-12-07 (H100): the
converters move 4.5-6.5 GB/s an SM beside the product and 8-10 alone, short of the small
case's need, so that design was not built.

Usage: python3 scripts/convert_under.py   (times: graphrt.bench.timing.stream_time_us)
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from graphrt.bench.timing import stream_time_us
from graphrt.device_checks import error_flags
from graphrt.gluon_api import cta_barrier
from graphrt.kernel_utils import gluon_descriptor, LAUNCH_OPTIONS
from graphrt.ops.grouped_gemm import kernels_tensor2d as t2d
from graphrt.ops.grouped_gemm.kernels import experts_vector
from graphrt.ops.grouped_gemm.kernels_gluon import _load_partition, _stage_ring

from copier_rate import fill_ring, load_tile   # run from scripts/, beside it

CONV_WARPS = gl.constexpr(2)
# (rows x tokens of codes a chunk, one E8M0 scale a row; chunks in flight): 24 KB of codes
CHUNKS = (([64, 32], 12), ([128, 32], 6), ([256, 32], 3))
# registers (setmaxnreg) of the loader's warpgroup (the loader and the converter) and of the
# second MMA warpgroup; the first takes the rest (504 - both). Compiled for sm_90a under 3.6,
# the composed kernel spills 16 / 64 / 240 bytes at these splits, the package kernel 8.
REG_SPLITS = ((48, 224), (80, 208))


@gluon.jit
def _chunk_scales(SCALES, t, live, tiles_t, tokens_sum, CR: gl.constexpr, CT: gl.constexpr,
                  layout: gl.constexpr):
    """The E8M0 scales of chunk t's rows (one a row: its 32 tokens), zeros where not live."""
    rows = (t // tiles_t) * CR + gl.arange(0, CR, layout=gl.SliceLayout(1, layout))
    return gl.load(SCALES + rows.to(gl.int64) * (tokens_sum // 32) + (t % tiles_t) * CT // 32,
                   mask=live & (rows >= 0), other=0)


@gluon.jit
def _convert_partition(codes_desc, codes, bars, SCALES, VALUES, chunks, tiles_t, tokens_sum,
                       values_stride):
    """Chunks p, p + programs, ... of codes [rows, T] written to VALUES [rows, values_stride]
    as BF16 values: code * 2^(scale - 127), one E8M0 scale per row and 32 tokens. The codes
    come by TMA CONV_STAGES chunks ahead, the scales by loads two chunks ahead."""
    CR: gl.constexpr = codes_desc.block_type.shape[0]
    CT: gl.constexpr = codes_desc.block_type.shape[1]
    S: gl.constexpr = codes.shape[0]
    layout: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [gl.num_warps(), 1], [1, 0])
    stride = values_stride // 8 * 8
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    mine = (chunks - pid + programs - 1) // programs
    fill_ring(codes_desc, codes, bars, mine, tiles_t)
    scale = _chunk_scales(SCALES, pid, mine > 0, tiles_t, tokens_sum, CR, CT, layout)
    scale_next = _chunk_scales(SCALES, pid + programs, mine > 1, tiles_t, tokens_sum, CR, CT,
                               layout)
    for j in range(mine):
        s = j % S
        mbarrier.wait(bars.index(s), (j // S) & 1)
        c = codes.index(s).load(layout)
        cta_barrier()                      # every converter thread has read the stage
        if j + S < mine:
            load_tile(codes_desc, codes, bars, s, pid + (j + S) * programs, tiles_t)
        scale_later = _chunk_scales(SCALES, pid + (j + 2) * programs, j + 2 < mine, tiles_t,
                                    tokens_sum, CR, CT, layout)
        t = pid + j * programs
        rows = (t // tiles_t) * CR + gl.arange(0, CR, layout=gl.SliceLayout(1, layout))
        toks = (t % tiles_t) * CT + gl.arange(0, CT, layout=gl.SliceLayout(0, layout))
        factor = gl.exp2(scale.to(gl.float32) - 127.0)
        v = (c.to(gl.float32) * factor[:, None]).to(gl.bfloat16)
        gl.store(VALUES + rows.to(gl.int64)[:, None] * stride + toks[None, :], v)
        scale = scale_next
        scale_next = scale_later


@gluon.jit(do_not_specialize=["experts", "tokens_sum", "chunks", "tiles_t", "values_stride"])
def _product_with_converter(a_desc, b_desc, OFFSETS, OUT, OUT_PTRS, ERRORS, experts, tokens_sum,
                            codes_desc, SCALES, VALUES, chunks, tiles_t, values_stride,
                            HIDDEN: gl.constexpr, INTER: gl.constexpr,
                            OUT_DTYPE: gl.constexpr, STAGES: gl.constexpr,
                            GROUP: gl.constexpr, EXPERTS_POW2: gl.constexpr,
                            CONV_STAGES: gl.constexpr,
                            SHARE_REGS: gl.constexpr, MMA_REGS: gl.constexpr):
    """The tensor2d kernel's BF16 K-K product (dense BF16 output, sorted split) with the
    converter partition beside its loader."""
    a_bufs, b_bufs, ready, empty, zeroed = _stage_ring(a_desc, b_desc, STAGES)
    codes = gl.allocate_shared_memory(codes_desc.dtype,
                                      [CONV_STAGES] + codes_desc.block_type.shape,
                                      codes_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [CONV_STAGES, 1], mbarrier.MBarrierLayout())
    for q in gl.static_range(CONV_STAGES):
        mbarrier.init(bars.index(q), count=1)
    gl.warp_specialize([
        (t2d._mma_partition, (a_bufs, b_bufs, ready, empty, zeroed, OFFSETS, OUT, OUT_PTRS,
                              ERRORS, experts, tokens_sum, HIDDEN, INTER, False, False,
                              OUT_DTYPE, GROUP, True, True, True, EXPERTS_POW2, 0)),
        (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, OFFSETS, ERRORS,
                           experts, tokens_sum, HIDDEN, INTER, GROUP, True, True, True,
                           EXPERTS_POW2)),
        (t2d._mma_partition, (a_bufs, b_bufs, ready, empty, zeroed, OFFSETS, OUT, OUT_PTRS,
                              ERRORS, experts, tokens_sum, HIDDEN, INTER, False, False,
                              OUT_DTYPE, GROUP, True, True, True, EXPERTS_POW2, 64)),
        (_convert_partition, (codes_desc, codes, bars, SCALES, VALUES, chunks, tiles_t,
                              tokens_sum, values_stride)),
    ], [1, 4, CONV_WARPS], [SHARE_REGS, MMA_REGS, SHARE_REGS])


def _case(experts, hidden, inter, tokens, gen):
    from graphrt.bench.wgrad import offsets_of, random_counts
    counts = random_counts(experts, tokens, gen)
    offsets = offsets_of(counts)
    a = torch.randn(hidden, tokens, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(inter, tokens, device="cuda", dtype=torch.bfloat16).t()
    rows = hidden + inter
    codes = torch.randn(rows, tokens, device="cuda").to(torch.float8_e4m3fn)
    scales = torch.randint(120, 135, (rows, tokens // 32), device="cuda", dtype=torch.uint8)
    values = torch.empty(rows, tokens, device="cuda", dtype=torch.bfloat16)
    return offsets, a, b, codes, scales, values


def main():
    from graphrt.ops.registry import op
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device {torch.cuda.get_device_name(0)}, {sms} SMs; converter {CONV_WARPS.value} "
          f"warps", flush=True)
    gen = torch.Generator().manual_seed(0)
    for experts, hidden, inter, tokens in op("grouped_gemm_wgrad").cases:
        offsets, a, b, codes, scales, values = _case(experts, hidden, inter, tokens, gen)
        out = torch.empty(experts, hidden, inter, device="cuda", dtype=torch.bfloat16)
        errors = error_flags(a.device)
        cfg = t2d.TENSOR2D_TMA_CONFIG
        a_box, b_box = t2d._boxes(True, True, cfg.block_n)
        a_desc, b_desc = gluon_descriptor(a, a_box), gluon_descriptor(b.t(), b_box)
        programs = min(t2d._tile_count(hidden, inter, cfg.block_n) * experts, sms)

        no_tokens = torch.zeros_like(offsets)

        def composed(whole, chunk=CHUNKS[0][0], stages=CHUNKS[0][1], share=48, mma=224,
                     routing=offsets):
            codes_desc = gluon_descriptor(codes, chunk)
            tiles_t = tokens // chunk[1]
            chunks = (codes.shape[0] // chunk[0]) * tiles_t if whole else 0
            return lambda: _product_with_converter[(programs,)](
                a_desc, b_desc, routing, out, routing, errors, experts, tokens, codes_desc,
                scales, values, chunks, tiles_t, values.stride(0), HIDDEN=hidden, INTER=inter,
                OUT_DTYPE=gl.bfloat16, STAGES=cfg.stages, GROUP=cfg.group,
                EXPERTS_POW2=experts_vector(experts), CONV_STAGES=stages,
                SHARE_REGS=share, MMA_REGS=mma, num_warps=4, maxnreg=t2d.LAUNCH_REGS,
                **LAUNCH_OPTIONS)

        def plan_kernel():
            t2d.launch_wgrad_tensor2d_tma(a, b, offsets, out, None, torch.bfloat16, errors,
                                          hidden=hidden, inter=inter, accumulate=False)

        # correctness first: the product against the package kernel's, the values against torch
        plan_kernel()
        expected = out.clone()
        expected_values = (codes.float() * torch.exp2(
            scales.float().repeat_interleave(32, dim=1) - 127.0)).to(torch.bfloat16)
        runs = {"package kernel": plan_kernel}
        for share, mma in REG_SPLITS:
            runs[f"converter idle, registers {share} / {mma}"] = composed(
                False, share=share, mma=mma)
            for chunk, stages in CHUNKS:
                runs[f"whole pass, chunks {chunk[0]}x{chunk[1]} x{stages}, registers {share} / "
                     f"{mma}"] = composed(True, chunk, stages, share, mma)
            chunk, stages = CHUNKS[1]
            runs[f"whole pass, no product (every expert empty), chunks {chunk[0]}x{chunk[1]}, "
                 f"registers {share} / {mma}"] = composed(True, chunk, stages, share, mma,
                                                          no_tokens)
        for name, fn in runs.items():
            out.fill_(float("nan"))
            values.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            same = torch.equal(out, expected) if "no product" not in name else None
            converted = torch.equal(values, expected_values) if "whole" in name else None
            print(f"  {name}: product equal {same}, values equal {converted}", flush=True)
        moved = codes.numel() * 3
        print(f"E{experts} {hidden}x{inter} T{tokens}: values pass {moved / 1e6:.0f} MB",
              flush=True)
        base = None
        for name, fn in runs.items():
            us = stream_time_us(fn, calls=5, repeats=5)
            base = base or us
            rate = f", {moved / us / 1e3 / programs:.1f} GB/s an SM" if "whole" in name else ""
            print(f"  {name:<56} {us:9.1f} us ({us / base:.3f}{rate})", flush=True)


if __name__ == "__main__":
    main()
