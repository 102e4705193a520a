"""The copy ceiling of a tiled pass over x [T, K] BF16 on the device: x -> y through tiles of
rows x columns, against torch's contiguous copy. Two schedules: tiles spread over a persistent
grid column block by column block (TMA descriptors or plain 16-byte loads and stores), and a
program per column block walking all rows. A kernel that owns column blocks (as the mHC backward
must, to keep its dweight block in registers) moves its bytes no faster than these copies; see
docs/perf/.

Usage: python3 scripts/tiled_copy_ceiling.py   (times: graphrt.bench.timing.stream_time_us)
"""
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from graphrt.bench.timing import stream_time_us
from graphrt.ops.registry import op

CASES = op("mhc_projection_backward").cases          # the mHC benchmark's shapes
TILES = [(64, 128), (64, 64), (32, 256), (16, 512)]
LAUNCHES = [(4, 2, 3), (4, 4, 3), (8, 2, 4)]     # warps, programs per SM, pipeline stages
# program-per-column-block copies: tile rows, tile columns, warps, stages
COLUMN_OWNER = [(64, 64, 2, 3), (64, 64, 4, 3), (32, 64, 1, 4), (64, 32, 2, 3)]


@triton.jit
def _copy_tile(X, Y, rows, cols, n_rows, K: tl.constexpr):
    """x[rows, cols] -> y with plain (16-byte) loads and stores."""
    at = rows.to(tl.int64)[:, None] * K + cols[None, :]
    ok = (rows < n_rows)[:, None]
    tl.store(Y + at, tl.load(X + at, mask=ok), mask=ok)


@triton.jit
def _grid_copy(X, Y, n_rows, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
               STAGES: tl.constexpr, TMA: tl.constexpr):
    """Tiles column block by column block, spread over a persistent grid; X and Y are TMA
    descriptors when ``TMA``, else pointers."""
    row_tiles = tl.cdiv(n_rows, BT)
    for t in tl.range(tl.program_id(0), row_tiles * tl.cdiv(K, BK), tl.num_programs(0),
                      num_stages=STAGES):
        block = t // row_tiles
        row0 = (t - block * row_tiles) * BT
        if TMA:
            Y.store([row0, block * BK], X.load([row0, block * BK]))
        else:
            _copy_tile(X, Y, row0 + tl.arange(0, BT), block * BK + tl.arange(0, BK), n_rows, K)


@triton.jit
def _column_owner_copy(X, Y, n_rows, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                       STAGES: tl.constexpr):
    """A program per column block, walking all rows."""
    cols = tl.program_id(0) * BK + tl.arange(0, BK)
    for r0 in tl.range(0, n_rows, BT, num_stages=STAGES):
        _copy_tile(X, Y, r0 + tl.arange(0, BT), cols, n_rows, K)


def main():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for t, k in CASES:
        x = torch.randn(t, k, dtype=torch.bfloat16, device="cuda")
        y = torch.empty_like(x)
        moved = 2 * x.numel() * x.element_size()

        def report(what, us):
            print(f"{t} x {k} {what}: {us:.1f} us, {moved / us / 1e6:.2f} TB/s", flush=True)

        report("torch copy (contiguous)", stream_time_us(lambda: y.copy_(x)))
        for bt, bk in TILES:
            x_desc, y_desc = (TensorDescriptor.from_tensor(v, [bt, bk]) for v in (x, y))
            for warps, per_sm, stages in LAUNCHES:
                grid = (sms * per_sm,)
                kw = dict(K=k, BT=bt, BK=bk, STAGES=stages, num_warps=warps)
                for name, fn in (
                        ("TMA", lambda: _grid_copy[grid](x_desc, y_desc, t, TMA=True, **kw)),
                        ("pointers", lambda: _grid_copy[grid](x, y, t, TMA=False, **kw))):
                    y.zero_()
                    us = stream_time_us(fn)
                    assert torch.equal(x, y), f"{name} copy {bt} x {bk} is wrong"
                    report(f"{name} tiles {bt} x {bk}, {warps} warps, {per_sm}/SM, "
                           f"{stages} stages", us)
        for bt, bk, warps, stages in COLUMN_OWNER:
            y.zero_()
            us = stream_time_us(lambda: _column_owner_copy[(triton.cdiv(k, bk),)](
                x, y, t, K=k, BT=bt, BK=bk, STAGES=stages, num_warps=warps))
            assert torch.equal(x, y), f"column-owner copy {bt} x {bk} is wrong"
            report(f"a program per {bk} columns, tiles {bt} x {bk}, {warps} warps, "
                   f"{stages} stages", us)


if __name__ == "__main__":
    main()
