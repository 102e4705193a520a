"""Sweep RMSNorm kernel tile configs on the GPU; prints the best per shape (device machine)."""
import os
import sys

import torch
import triton

from graphrt.bench.timing import rotating, stream_time_us
from graphrt.kernel_utils import persistent_grid
from graphrt.ops.rmsnorm import kernels
from graphrt.ops.rmsnorm.kernels import RowConfig, launch_backward, launch_forward
from graphrt.validate import sm_count

CASES = [(16384, 2048), (16384, 4096), (16384, 5120), (16384, 7168), (4096, 5120)]
if len(sys.argv) > 1:  # e.g. "16384x2048,16384x4096"
    CASES = [tuple(int(v) for v in c.split("x")) for c in sys.argv[1].split(",")]
FORWARD = [(r, w, p, s) for r in (1, 2, 4) for w in (4, 8) for p in (2, 4, 8) for s in (4, 6)]
BACKWARD = [(r, w, p, s) for r in (1, 2) for w in (4, 8) for p in (1, 2, 3, 4) for s in (4, 6, 8)]


def _configs(name: str, default: list) -> list:
    """A config list from the environment ("rows,warps,per_sm,stages;..."; empty: none)."""
    text = os.environ.get(name)
    if text is None:
        return default
    return [tuple(int(v) for v in c.split(",")) for c in text.split(";") if c]


FORWARD, BACKWARD = _configs("SWEEP_FORWARD", FORWARD), _configs("SWEEP_BACKWARD", BACKWARD)
# SWEEP_GRID=full: every persistent program the config allows, not kernel_utils.persistent_grid
FULL_GRID = os.environ.get("SWEEP_GRID") == "full"
if FULL_GRID:
    kernels.persistent_grid = lambda tiles, max_programs: min(tiles, max_programs)


def main():
    dev = torch.device("cuda")
    sms = sm_count(dev)
    for T, H in CASES:
        bh = triton.next_power_of_2(H)
        sets = [(torch.randn(T, H, dtype=torch.bfloat16, device=dev),
                 torch.randn(T, H, dtype=torch.bfloat16, device=dev)) for _ in range(4)]
        w = torch.randn(H, device=dev)
        rstd = torch.rand(T, device=dev) + 0.5
        y, dx = torch.empty_like(sets[0][0]), torch.empty_like(sets[0][0])
        dw = torch.empty(H, device=dev)
        res = []
        for rows, warps, per_sm, stages in FORWARD:
            cfg = RowConfig(bh, 1, rows, warps, per_sm, stages)
            t = stream_time_us(rotating(lambda x, g: launch_forward(
                cfg, sms, x, None, w, y, rstd, None, T, (H, 0, H, 0), 1e-6), sets))
            res.append((t, f"rows={rows} warps={warps} per_sm={per_sm} stages={stages}"))
        best = sorted(res)[:int(os.environ.get("SWEEP_TOP", 3))]
        if best:
            print(f"T={T} H={H} forward: " + "; ".join(f"{n} {t:.1f}us {T*H*4/t/1e6:.2f}TB/s" for t, n in best))
        res = []
        for rows, warps, per_sm, stages in BACKWARD:
            cfg = RowConfig(bh, 1, rows, warps, per_sm, stages)
            P = sms * per_sm if FULL_GRID else persistent_grid(triton.cdiv(T, rows), sms * per_sm)
            part = torch.empty(P, H, device=dev)
            t = stream_time_us(rotating(lambda x, g: launch_backward(
                cfg, P, g, x, w, rstd, None, dx, dw, part, T, (H, H, 0, H)), sets))
            res.append((t, f"rows={rows} warps={warps} per_sm={per_sm} stages={stages}"))
        best = sorted(res)[:int(os.environ.get("SWEEP_TOP", 3))]
        if best:
            print(f"T={T} H={H} backward: " + "; ".join(f"{n} {t:.1f}us {T*H*6/t/1e6:.2f}TB/s" for t, n in best))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
