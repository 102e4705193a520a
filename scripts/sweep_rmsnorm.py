"""Sweep RMSNorm kernel tile configs on the GPU; prints the best per shape (device machine)."""
import itertools
import sys

import torch

from graphrt.bench.timing import device_time_us, rotating
from graphrt.ops.rmsnorm.kernels import RowConfig, launch_backward, launch_forward
from graphrt.validate import sm_count

CASES = [(16384, 2048), (16384, 4096), (16384, 5120), (16384, 7168), (4096, 5120)]


def main():
    dev = torch.device("cuda")
    sms = sm_count(dev)
    for T, H in CASES:
        import triton
        bh = triton.next_power_of_2(H)
        sets = []
        for _ in range(2):
            x = torch.randn(T, H, dtype=torch.bfloat16, device=dev)
            g = torch.randn_like(x)
            sets.append((x, g))
        w = torch.randn(H, device=dev)
        rstd = torch.rand(T, device=dev) + 0.5
        y, dx = torch.empty_like(sets[0][0]), torch.empty_like(sets[0][0])
        dw = torch.empty(H, device=dev)
        res = []
        for rows, warps, per_sm in itertools.product((1, 2, 4), (4, 8, 16), (4, 8, 1000)):
            cfg = RowConfig(bh, 1, rows, warps, per_sm)
            t = device_time_us(rotating(lambda x, g: launch_forward(
                cfg, sms, x, None, w, y, rstd, None, T, (H, 0, H, 0), 1e-6), sets), 10, 50)
            res.append((t, f"fwd rows={rows} warps={warps} per_sm={per_sm}"))
        best = sorted(res)[:3]
        print(f"T={T} H={H} forward: " + "; ".join(f"{n} {t:.1f}us {T*H*4/t/1e6:.2f}TB/s" for t, n in best))
        res = []
        for rows, warps, per_sm in itertools.product((1, 2), (4, 8, 16), (1, 2, 3, 4)):
            cfg = RowConfig(bh, 1, rows, warps, per_sm)
            P = sms * per_sm
            part = torch.empty(P, H, device=dev)
            t = device_time_us(rotating(lambda x, g: launch_backward(
                cfg, P, g, x, w, rstd, None, dx, dw, part, T, (H, H, 0, H)), sets), 10, 50)
            res.append((t, f"bwd rows={rows} warps={warps} per_sm={per_sm}"))
        best = sorted(res)[:3]
        print(f"T={T} H={H} backward: " + "; ".join(f"{n} {t:.1f}us {T*H*6/t/1e6:.2f}TB/s" for t, n in best))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
