"""Sweep mHC backward tile configs and row-group counts on the GPU: each checked against the FP64
reference (and for bitwise repeatability) before it is timed.

Usage: python3 scripts/sweep_mhc.py [T K ...]   (default: the registry's mHC cases)
SWEEP_MHC="rows,columns,warps,stages,groups;..." replaces the configs (groups 0: the model's).
"""
import os
import sys

import torch
import triton

from graphrt.bench.timing import rotating, stream_time_us
from graphrt.ops.mhc import mhc_projection_backward_reference
from graphrt.ops.mhc.kernels import (MAX_GROUPS, PROGRAMS_PER_SM, TILE, MhcConfig,
                                     launch_backward, row_groups)
from graphrt.ops.registry import op
from graphrt.validate import sm_count

N = 24
# (rows, columns, warps, stages, register cap)
TILES = [(64, 64, 4, 3, None), (64, 64, 4, 4, None), (64, 64, 4, 2, 128), (64, 128, 8, 3, None),
         (64, 128, 4, 3, None), (128, 64, 8, 3, None), (128, 128, 8, 3, None)]
GROUPS = [3, 6, 8]


def sweep(t: int, k: int, sms: int) -> None:
    sets = [(torch.randn(t, k, dtype=torch.bfloat16, device="cuda"),
             torch.randn(N, k, device="cuda") / k ** 0.5, torch.randn(t, N, device="cuda"),
             torch.randn(t, 1, device="cuda"), torch.rand(t, 1, device="cuda") + 0.5)
            for _ in range(2)]
    ref_dx, ref_dw = (r.double() for r in mhc_projection_backward_reference(*sets[0]))
    dx, dw = torch.empty_like(sets[0][0]), torch.empty_like(sets[0][1])
    floor = (2 * t * k * 2) / 4.25e12 * 1e6
    slots = PROGRAMS_PER_SM * sms
    default = row_groups(triton.cdiv(k, TILE.block_k), triton.cdiv(t, TILE.block_t), slots)
    print(f"T={t} K={k}: the model's row groups {default}", flush=True)
    configs = [(bt, bk, warps, stages, regs, groups) for bt, bk, warps, stages, regs in TILES
               for groups in sorted(set(GROUPS + [default]))]
    if os.environ.get("SWEEP_MHC"):
        configs = [(bt, bk, warps, stages, None, groups or default)
                   for bt, bk, warps, stages, groups in
                   (map(int, c.split(",")) for c in os.environ["SWEEP_MHC"].split(";"))]
    for bt, bk, warps, stages, max_regs, groups in configs:
        cfg = MhcConfig(bt, bk, warps, stages, max_regs)
        part = torch.empty(max(groups, MAX_GROUPS) * N * k, device="cuda")
        run = lambda *a: launch_backward(cfg, slots, *a, dx, dw, part, t, groups=groups)
        try:
            dx.fill_(float("nan")), dw.fill_(float("nan"))
            run(*sets[0])
            first = (dx.clone(), dw.clone())
            run(*sets[0])
            ok_rep = torch.equal(first[0], dx) and torch.equal(first[1], dw)
            err = max(((dx.double() - ref_dx).norm() / ref_dx.norm()).item(),
                      ((dw.double() - ref_dw).norm() / ref_dw.norm()).item())
            us = stream_time_us(rotating(run, sets))
            print(f"  bt={bt} bk={bk} warps={warps} stages={stages} regs<={max_regs} groups={groups}: "
                  f"{us:.1f} us ({floor / us:.2f} of floor) rel_err={err:.1e} "
                  f"repeat_bitwise={ok_rep}", flush=True)
        except Exception as e:  # out of resources and the like
            print(f"  bt={bt} bk={bk} warps={warps} stages={stages} groups={groups}: failed "
                  f"{type(e).__name__}: {e}"[:200], flush=True)
    del sets
    torch.cuda.empty_cache()


def main():
    args = [int(a) for a in sys.argv[1:]] or [d for case in op("mhc_projection_backward").cases
                                              for d in case]
    sms = sm_count(torch.device("cuda"))
    for t, k in zip(args[::2], args[1::2]):
        sweep(t, k, sms)


if __name__ == "__main__":
    main()
