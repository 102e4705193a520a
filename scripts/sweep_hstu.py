"""Sweep HSTU LMSD kernel configs on the GPU (concat_u, concat_x, SiLU, p = 0.1), each run
checked against the default config's outputs before it is timed (device machine).

Usage: python3 scripts/sweep_hstu.py [fwd,bwd]; SWEEP_HSTU_FORWARD="rows,warps,per_sm,stages[,max
registers];..." replaces the forward configs (rows: rows per tile, or 0 for the default tile's)."""
import itertools
import os
import sys

import torch
import triton

from graphrt.bench.timing import rotating, stream_time_us
from graphrt.ops.hstu.kernels import (HstuConfig, backward_config, forward_config, launch_backward,
                                      launch_forward)
from graphrt.ops.hstu.philox import keep_threshold
from graphrt.ops.registry import HSTU_CASES
from graphrt.validate import sm_count

CASES = HSTU_CASES[:2]
P = 0.1
FLAGS = dict(apply_u_silu=True, concat_u=True, concat_x=True)


def main():
    dev = torch.device("cuda")
    sms = sm_count(dev)
    only = sys.argv[1] if len(sys.argv) > 1 else "fwd,bwd"
    for n, d in CASES:
        bd = triton.next_power_of_2(d)
        sets = []
        for _ in range(3):
            x, u = (torch.randn(n, d, dtype=torch.bfloat16, device=dev) for _ in range(2))
            w, b = (torch.randn(d, dtype=torch.bfloat16, device=dev) for _ in range(2))
            dy = torch.randn(n, 3 * d, dtype=torch.bfloat16, device=dev)
            sets.append((x, u, w, b, dy))
        y = torch.empty(n, 3 * d, dtype=torch.bfloat16, device=dev)
        mean, rstd = torch.empty(n, device=dev), torch.empty(n, device=dev)
        mask = torch.empty(n, d, dtype=torch.int8, device=dev)
        fwd_bytes, bwd_bytes = 11 * n * d, 15 * n * d

        def fwd(cfg, x, u, w, b, dy, p=P):
            launch_forward(cfg, sms, x, u, w, b, y, mean, rstd, mask if p > 0 else None, 1, 0, n,
                           (d, d, 3 * d), 1e-6, FLAGS, keep_threshold(p), 1 / (1 - p))
        fwd(forward_config(d), *sets[0])
        ref_fwd = (y.clone(), mean.clone(), rstd.clone(), mask.clone())
        if "fwd" in only:
            tb = lambda us: fwd_bytes / us / 1e6  # noqa: E731
            us = stream_time_us(rotating(lambda *a: fwd(forward_config(d), *a, p=0.0), sets))
            print(f"N={n} D={d} forward default config, p=0 (no draws, no mask): {us:.1f} us", flush=True)
            configs = [(r * 2048 // bd, w, ps, st, 0) for r, w, ps, st in itertools.product(
                (1, 2), (4, 8), (2, 4), (2, 3))]
            if os.environ.get("SWEEP_HSTU_FORWARD"):   # rows,warps,per_sm,stages[,max registers]
                configs = [tuple(int(v) for v in c.split(",")) + (0,) for c in
                           os.environ["SWEEP_HSTU_FORWARD"].split(";") if c]
                configs = [(c[0] or 2048 // bd,) + c[1:5] for c in configs]
            for r, warps, per_sm, stages, regs in configs:
                cfg = HstuConfig(bd, r, warps, per_sm, stages, regs or None)
                y.fill_(float("nan"))
                fwd(cfg, *sets[0])
                same = all(torch.equal(a, b) for a, b in zip((y, mean, rstd, mask), ref_fwd))
                keep = [((mask.int() >> i) & 1).float().mean().item() for i in range(3)]
                us = stream_time_us(rotating(lambda *a: fwd(cfg, *a), sets))
                print(f"  fwd rows={r} warps={warps} per_sm={per_sm} stages={stages} "
                      f"max_registers={regs or None}: {us:.1f} us "
                      f"{tb(us):.2f} TB/s same={same} "
                      f"keep={keep[0]:.3f},{keep[1]:.3f},{keep[2]:.3f}", flush=True)
        if "bwd" not in only:
            continue
        mean_s, rstd_s, mask_s = ref_fwd[1:]
        dx, du = (torch.empty(n, d, dtype=torch.bfloat16, device=dev) for _ in range(2))
        dw, db = (torch.empty(d, dtype=torch.bfloat16, device=dev) for _ in range(2))

        def bwd(cfg, x, u, w, b, dy):
            programs = sms * cfg.programs_per_sm
            part = torch.empty(2 * programs * d, device=dev)
            launch_backward(cfg, programs, dy, x, u, w, b, mean_s, rstd_s, mask_s, dx, du, dw,
                            db, part, n, (3 * d, d, d, d, d), FLAGS, 1 / (1 - P))
        bwd(backward_config(d), *sets[0])
        ref_bwd = (dx.clone(), du.clone(), dw.float(), db.float())
        for r, warps, per_sm, stages in itertools.product(
                (1024 // bd, 2048 // bd, 4096 // bd), (4, 8), (2, 4), (2, 3)):
            cfg = HstuConfig(bd, r, warps, per_sm, stages)
            dx.fill_(float("nan"))
            bwd(cfg, *sets[0])
            same = torch.equal(dx, ref_bwd[0]) and torch.equal(du, ref_bwd[1])
            err = max(((dw.float() - ref_bwd[2]).norm() / ref_bwd[2].norm()).item(),
                      ((db.float() - ref_bwd[3]).norm() / ref_bwd[3].norm()).item())
            us = stream_time_us(rotating(lambda *a: bwd(cfg, *a), sets))
            print(f"  bwd rows={r} warps={warps} per_sm={per_sm} stages={stages}: {us:.1f} us "
                  f"{bwd_bytes / us / 1e6:.2f} TB/s dx_du_same={same} dw_db_err={err:.1e}",
                  flush=True)


if __name__ == "__main__":
    main()
