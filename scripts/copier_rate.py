"""How many bytes a few copying programs move when TMA keeps their tiles in flight: the rate
that decides whether a copy beside the grouped wgrad's product can keep up with it (the ragged
odd counts' padded copy, MXFP8's values pass; docs/perf/wgrad.md, 2026-12-07).

The copy beside the product measured 26-41 GB/s a program with loads into registers
(2026-12-05), a third of the SMs to keep up. Here each program keeps STAGES tiles of 16 KB in
flight through TMA loads into shared memory and TMA stores out of it:
- ``copy``: BF16 tiles [128, 64] stored as they came;
- ``values``: E4M3 codes [128, 64] read into registers, times a power of two, stored as BF16
  (the MXFP8 values pass's work).
Each variant is checked against torch, then timed on N programs (a persistent grid) and on
every SM, beside torch's own copy of the same bytes.

``--beside``: at each wgrad benchmark case, the values pass's bytes (E4M3 codes of A and B in,
BF16 values out) moved by N copying programs while the BF16 K-K product runs on the other SMs
(its persistent grid cut to SMs - N), the two launched on two streams at once; against the
product alone on every SM and on SMs - N, and the copy alone. What a copy beside the product
could reach with nothing waiting on it; the readiness waits such a design needs are not here.

Usage: python3 scripts/copier_rate.py [--beside] [--warps W]   (times: graphrt.bench.timing)
"""
import argparse

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from graphrt.bench.timing import stream_time_us
from graphrt.gluon_api import cta_barrier, tma_load, tma_store
from graphrt.kernel_utils import gluon_descriptor

ROWS, COLS = 32768, 16384                 # 1 GiB of BF16, 0.5 GiB of codes
BOX = [128, 64]
PROGRAMS = [4, 8, 16, 32, 66]
STAGES = [4, 8, 12]


@gluon.jit
def load_tile(desc, bufs, bars, slot, t, tiles_c):
    """Tile t of desc's tensor (tiles_c tiles a row of tiles) by TMA into bufs[slot]."""
    BR: gl.constexpr = desc.block_type.shape[0]
    BC: gl.constexpr = desc.block_type.shape[1]
    mbarrier.expect(bars.index(slot), BR * BC * desc.dtype.primitive_bitwidth // 8)
    tma_load(desc, [(t // tiles_c) * BR, (t % tiles_c) * BC], bars.index(slot), bufs.index(slot))


@gluon.jit
def fill_ring(desc, bufs, bars, mine, tiles_c):
    """This program's first tiles (pid, pid + programs, ...; at most ``mine``) loading into
    the ring, whose barriers are made."""
    S: gl.constexpr = bufs.shape[0]
    for q in gl.static_range(S):
        if q < mine:
            load_tile(desc, bufs, bars, q, gl.program_id(0) + q * gl.num_programs(0), tiles_c)


@gluon.jit
def start_ring(desc, bufs, total, tiles_c):
    """The ring's barriers made, this program's tiles among ``total`` counted (pid, pid +
    programs, ...), and its first tiles loading: (barriers, tiles)."""
    S: gl.constexpr = bufs.shape[0]
    bars = gl.allocate_shared_memory(gl.int64, [S, 1], mbarrier.MBarrierLayout())
    for q in gl.static_range(S):
        mbarrier.init(bars.index(q), count=1)
    programs = gl.num_programs(0)
    mine = (total - gl.program_id(0) + programs - 1) // programs
    fill_ring(desc, bufs, bars, mine, tiles_c)
    return bars, mine


@gluon.jit
def _tma_copy(src, dst, tiles_c, total, STAGES: gl.constexpr):
    """Tiles pid, pid + N, ... of src copied to dst, STAGES loads in flight and two stores."""
    BR: gl.constexpr = src.block_type.shape[0]
    BC: gl.constexpr = src.block_type.shape[1]
    bufs = gl.allocate_shared_memory(src.dtype, [STAGES, BR, BC], src.layout)
    bars, mine = start_ring(src, bufs, total, tiles_c)
    pid = gl.program_id(0)
    npro = gl.num_programs(0)
    for j in range(mine):
        s = j % STAGES
        mbarrier.wait(bars.index(s), (j // STAGES) & 1)
        t = pid + j * npro
        tma_store(dst, [(t // tiles_c) * BR, (t % tiles_c) * BC], bufs.index(s))
        tma.store_wait(1)                  # the store of tile j - 1 has read its stage
        refill = j - 1 + STAGES
        if (j > 0) & (refill < mine):
            load_tile(src, bufs, bars, (j - 1) % STAGES, pid + refill * npro, tiles_c)
    tma.store_wait(0)


@gluon.jit
def _tma_values(src, dst, scale, tiles_c, total, STAGES: gl.constexpr):
    """E4M3 tiles of src times ``scale`` stored to dst as BF16: STAGES code tiles in flight,
    two value tiles being stored."""
    BR: gl.constexpr = src.block_type.shape[0]
    BC: gl.constexpr = src.block_type.shape[1]
    reg: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    codes = gl.allocate_shared_memory(src.dtype, [STAGES, BR, BC], src.layout)
    vals = gl.allocate_shared_memory(dst.dtype, [2, BR, BC], dst.layout)
    bars, mine = start_ring(src, codes, total, tiles_c)
    pid = gl.program_id(0)
    npro = gl.num_programs(0)
    for j in range(mine):
        s = j % STAGES
        mbarrier.wait(bars.index(s), (j // STAGES) & 1)
        v = (codes.index(s).load(reg).to(gl.float32) * scale).to(gl.bfloat16)
        tma.store_wait(1)                  # the store of tile j - 2 has read its buffer
        cta_barrier()
        vals.index(j % 2).store(v)
        fence_async_shared()
        cta_barrier()                      # every thread's values written, its codes read
        t = pid + j * npro
        tma_store(dst, [(t // tiles_c) * BR, (t % tiles_c) * BC], vals.index(j % 2))
        if j + STAGES < mine:
            load_tile(src, codes, bars, s, pid + (j + STAGES) * npro, tiles_c)
    tma.store_wait(0)


def _run(kind, src, dst, programs, stages, warps=4):
    src_d, dst_d = gluon_descriptor(src, BOX), gluon_descriptor(dst, BOX)
    tiles_c = src.shape[1] // BOX[1]
    total = (src.shape[0] // BOX[0]) * tiles_c
    if kind == "copy":
        return lambda: _tma_copy[(programs,)](src_d, dst_d, tiles_c, total, STAGES=stages,
                                              num_warps=warps)
    return lambda: _tma_values[(programs,)](src_d, dst_d, 4.0, tiles_c, total, STAGES=stages,
                                            num_warps=warps)


def _events_us(fns_by_stream, repeats=7):
    """Median time from one start to the end of every stream's calls, all queued behind a
    GPU sleep on the current stream."""
    main_stream = torch.cuda.current_stream()
    times = []
    for _ in range(repeats + 2):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(3e6))
        start.record()
        for stream, fn in fns_by_stream:
            stream.wait_stream(main_stream)
            with torch.cuda.stream(stream):
                fn()
        for stream, _ in fns_by_stream:
            main_stream.wait_stream(stream)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    times = sorted(times[2:])
    return times[len(times) // 2]


def beside(warps):
    from graphrt.bench.wgrad import offsets_of, random_counts
    from graphrt.device_checks import error_flags
    from graphrt.ops.grouped_gemm import kernels_tensor2d as t2d
    from graphrt.ops.registry import op
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    full_sm_count = t2d.sm_count
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    gen = torch.Generator().manual_seed(0)
    for experts, hidden, inter, tokens in op("grouped_gemm_wgrad").cases:
        counts = random_counts(experts, tokens, gen)
        offsets = offsets_of(counts)
        a = torch.randn(hidden, tokens, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(inter, tokens, device="cuda", dtype=torch.bfloat16).t()
        out = torch.empty(experts, hidden, inter, device="cuda", dtype=torch.bfloat16)
        errors = error_flags(a.device)
        codes = torch.randn(hidden + inter, tokens, device="cuda").to(torch.float8_e4m3fn)
        values = torch.empty(hidden + inter, tokens, device="cuda", dtype=torch.bfloat16)
        moved = codes.numel() * 3

        def product(programs):
            t2d.sm_count = lambda device, n=programs: n
            try:
                t2d.launch_wgrad_tensor2d_tma(a, b, offsets, out, None, torch.bfloat16, errors,
                                              hidden=hidden, inter=inter, accumulate=False)
            finally:
                t2d.sm_count = full_sm_count
        full = _events_us([(s2, lambda: product(sms))])
        print(f"E{experts} {hidden}x{inter} T{tokens}: product on {sms} SMs {full:.1f} us, "
              f"values pass {moved / 1e6:.0f} MB", flush=True)
        for n in (8, 12, 16, 20, 24, 32):
            copier = _run("values", codes, values, n, 8, warps)
            alone = _events_us([(s1, copier)])
            less = _events_us([(s2, lambda n=n: product(sms - n))])
            both = _events_us([(s1, copier), (s2, lambda n=n: product(sms - n))])
            print(f"  N={n:2d}: copy alone {alone:8.1f} us ({moved / alone / 1e3 / n:5.1f} GB/s "
                  f"a program), product on {sms - n} {less:8.1f} us ({less / full:.3f}), both "
                  f"{both:8.1f} us ({both / full:.3f} of the product on every SM)", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--beside", action="store_true")
    parser.add_argument("--warps", type=int, default=4)
    args = parser.parse_args()
    if args.beside:
        beside(args.warps)
        return
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"device {torch.cuda.get_device_name(0)}, {sms} SMs, "
          f"{ROWS} x {COLS}, box {BOX}, {args.warps} warps", flush=True)
    bf16 = torch.randn(ROWS, COLS, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(bf16)
    codes = torch.randn(ROWS, COLS, device="cuda").to(torch.float8_e4m3fn)
    expected = {"copy": bf16, "values": (codes.float() * 4.0).to(torch.bfloat16)}
    sources = {"copy": bf16, "values": codes}
    for kind in ("copy", "values"):
        src = sources[kind]
        moved = src.numel() * src.element_size() + out.numel() * out.element_size()
        us = stream_time_us(lambda: out.copy_(expected[kind]), calls=3, repeats=5)
        print(f"{kind}: torch copy_ of the output's bytes both ways {us:.1f} us, "
              f"{2 * out.numel() * 2 / us / 1e6:.2f} TB/s", flush=True)
        for stages in STAGES:
            for programs in PROGRAMS + [sms]:
                out.fill_(float("nan"))
                fn = _run(kind, src, out, programs, stages, args.warps)
                fn()
                torch.cuda.synchronize()
                ok = torch.equal(out, expected[kind])
                us = stream_time_us(fn, calls=2, repeats=3)
                rate = moved / us / 1e3          # GB/s
                print(f"{kind} stages={stages:2d} programs={programs:3d}: {us:9.1f} us, "
                      f"{rate / 1e3:.2f} TB/s, {rate / programs:6.1f} GB/s a program, "
                      f"equal={ok}", flush=True)


if __name__ == "__main__":
    main()
