"""The L2 -> SM read ceiling on the device: persistent programs read an L2-resident BF16 buffer
(the proj benchmark's x, 4096 x 1536) tile by tile, many times over, through TMA descriptors or
plain loads. A GEMM whose tiles re-read their operands from L2 moves those bytes no faster; see
docs/perf/proj.md.

Usage: python3 scripts/l2_read_ceiling.py   (times: graphrt.bench.timing.stream_time_us)
"""
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from graphrt.bench.timing import stream_time_us

ROWS, COLS = 4096, 1536
PASSES = 40                                      # reads of the whole buffer per run
TILES = [(128, 64), (64, 64)]
LAUNCHES = [(4, 1, 4), (4, 2, 3), (4, 4, 3)]     # warps, programs per SM, pipeline stages


@triton.jit
def _read(X, OUT, n_rows, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
          STAGES: tl.constexpr, PASSES: tl.constexpr, TMA: tl.constexpr):
    """Sums every tile read (so that no load is dropped); X is a TMA descriptor when ``TMA``."""
    row_tiles = tl.cdiv(n_rows, BT)
    tiles = row_tiles * tl.cdiv(K, BK)
    acc = tl.zeros([BT, BK], tl.float32)
    for t in tl.range(tl.program_id(0), tiles * PASSES, tl.num_programs(0), num_stages=STAGES):
        u = t % tiles
        block = u // row_tiles
        row0 = (u - block * row_tiles) * BT
        if TMA:
            tile = X.load([row0, block * BK])
        else:
            rows = row0 + tl.arange(0, BT)
            tile = tl.load(X + rows[:, None] * K + block * BK + tl.arange(0, BK)[None, :])
        acc += tile.to(tl.float32)
    tl.store(OUT + tl.program_id(0), tl.sum(acc))


def main():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = torch.randn(ROWS, COLS, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(4 * sms, device="cuda")
    read = x.numel() * x.element_size() * PASSES
    for bt, bk in TILES:
        desc = TensorDescriptor.from_tensor(x, [bt, bk])
        for warps, per_sm, stages in LAUNCHES:
            grid = (sms * per_sm,)
            kw = dict(K=COLS, BT=bt, BK=bk, STAGES=stages, PASSES=PASSES, num_warps=warps)
            for name, src, tma in (("TMA", desc, True), ("pointers", x, False)):
                us = stream_time_us(lambda: _read[grid](src, out, ROWS, TMA=tma, **kw), calls=5)
                print(f"{name} tiles {bt} x {bk}, {warps} warps, {per_sm}/SM, {stages} stages: "
                      f"{us:.1f} us, {read / us / 1e6:.2f} TB/s from L2", flush=True)


if __name__ == "__main__":
    main()
