"""Sweep mHC backward tile configs on the GPU: each checked against the FP64 reference (and for
bitwise repeatability) before it is timed."""
import torch

from graphrt.bench.timing import rotating, stream_time_us
from graphrt.ops.mhc import mhc_projection_backward_reference
from graphrt.ops.mhc.kernels import MhcConfig, launch_backward
from graphrt.validate import sm_count

T, K, N = 4096, 20480, 24
CONFIGS = [(64, 128, 8, 3), (64, 64, 4, 3), (64, 64, 8, 4), (32, 128, 4, 3), (128, 64, 8, 3),
           (64, 128, 8, 4), (32, 64, 4, 4)]


def main():
    sms = sm_count(torch.device("cuda"))
    sets = [(torch.randn(T, K, dtype=torch.bfloat16, device="cuda"), torch.randn(N, K, device="cuda") / K ** 0.5,
             torch.randn(T, N, device="cuda"), torch.randn(T, 1, device="cuda"),
             torch.rand(T, 1, device="cuda") + 0.5) for _ in range(2)]
    ref_dx, ref_dw = mhc_projection_backward_reference(*sets[0])
    dx, dw = torch.empty_like(sets[0][0]), torch.empty_like(sets[0][1])
    floor = (2 * T * K * 2) / 4.25e12 * 1e6
    for bt, bk, warps, stages in CONFIGS:
        for per_sm in (4, 8):
            groups = max(1, min(32, -(-per_sm * sms // -(-K // bk))))
            cfg = MhcConfig(bt, bk, groups, warps, stages)
            part = torch.empty(groups * N * K, device="cuda")
            try:
                launch_backward(cfg, *sets[0], dx, dw, part, T)
                first = (dx.clone(), dw.clone())
                launch_backward(cfg, *sets[0], dx, dw, part, T)
                ok_rep = torch.equal(first[0], dx) and torch.equal(first[1], dw)
                err = max(((dx.double() - ref_dx.double()).norm() / ref_dx.double().norm()).item(),
                          ((dw.double() - ref_dw.double()).norm() / ref_dw.double().norm()).item())
                t = stream_time_us(rotating(lambda *a: launch_backward(cfg, *a, dx, dw, part, T), sets))
                print(f"bt={bt} bk={bk} warps={warps} stages={stages} groups={groups}: {t:.1f} us "
                      f"({floor / t:.2f} of floor) rel_err={err:.1e} repeat_bitwise={ok_rep}", flush=True)
            except Exception as e:  # out of resources and the like
                print(f"bt={bt} bk={bk} warps={warps} stages={stages}: failed {type(e).__name__}: {e}"[:200])


if __name__ == "__main__":
    main()
