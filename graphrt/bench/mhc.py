"""mHC projection/RMS backward against eager PyTorch and torch.compile."""
from __future__ import annotations

import torch

from ..ops import MhcProjectionBackward
from ..ops.registry import op
from . import report
from .timing import COPY_CEILING_TBPS, device_time_us, n_input_sets, rotating, stream_time_us

CASES = op("mhc_projection_backward").cases
N = N_PAD = 24


def eager_backward(x, w, gp, gr, r):
    p = gp[:, :N]
    dx = (p @ w + gr / (r * x.shape[1]) * x.float()).to(x.dtype)
    return dx, p.t() @ x.float()


def min_bytes(t: int, k: int) -> int:
    """x read and dx written (BF16), weight and grad_proj read, dweight written (FP32)."""
    return 2 * t * k * 2 + 2 * N * k * 4 + t * N_PAD * 4 + 2 * t * 4


def run(progress=print) -> list[dict]:
    torch.backends.cuda.matmul.allow_tf32 = True  # the peers get TF32 products too
    compiled = torch.compile(eager_backward)
    rows = []
    for t, k in CASES:
        progress(f"mhc T={t} K={k} ...")
        sets = []
        for _ in range(n_input_sets(min_bytes(t, k), torch.device("cuda"))):
            sets.append((torch.randn(t, k, dtype=torch.bfloat16, device="cuda"),
                         torch.randn(N, k, device="cuda") / k ** 0.5,
                         torch.randn(t, N_PAD, device="cuda"), torch.randn(t, 1, device="cuda"),
                         torch.rand(t, 1, device="cuda") + 0.5))
        plan = MhcProjectionBackward(*sets[0], allow_tf32=True).compile()
        ws = torch.empty(plan.workspace_bytes(), dtype=torch.uint8, device="cuda")
        dx, dw = torch.empty_like(sets[0][0]), torch.empty_like(sets[0][1])
        impls = {"graphrt": lambda *a: plan.execute(*a, dx=dx, dweight=dw, workspace=ws),
                 "eager": eager_backward, "torch.compile": compiled}
        times = {n: stream_time_us(rotating(f, sets)) for n, f in impls.items()}
        flushed = {n: device_time_us(rotating(f, sets)) for n, f in impls.items()}
        floor_us = min_bytes(t, k) / (COPY_CEILING_TBPS * 1e12) * 1e6
        for name, us in times.items():
            rows.append({"T": t, "K": k, "impl": name, "us": us, "floor_us": floor_us,
                         "of_floor": floor_us / us, "speedup_vs": us / times["graphrt"],
                         "do_bench_us": flushed[name],
                         "do_bench_speedup_vs": flushed[name] / flushed["graphrt"]})
        del sets
        torch.cuda.empty_cache()
    return rows


def main(progress=print) -> list[dict]:
    return report.publish(
        "mhc", run(progress), progress,
        legend="us: back-to-back calls over rotating input sets; of_floor: bandwidth floor (bytes "
               "at 4.25 TB/s) over time; speedup_vs: that implementation's time over graphrt's")
