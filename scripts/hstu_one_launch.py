"""HSTU backward's GPU time, its dweight/dbias partials summed by a second launch against the
kernel's last programs (``reduction.finish_in_groups``) with 2, the plan's and 16 rows' loads
in flight: CUDA events over 50 replayed ``plan.execute`` calls, best of 5 (device machine).
The one-launch rows run at every width, ``ONE_LAUNCH_MAX_D`` lifted for the measurement.

    python3 scripts/hstu_one_launch.py
"""
import torch
import triton

import graphrt
import graphrt.ops.hstu.kernels as kernels
import graphrt.ops.hstu.plan as hstu_plan
from graphrt.ops import HstuLmsdBackward, hstu_lmsd_forward

CASES = ((65536, 256), (65536, 512), (4096, 512), (65536, 1024), (16384, 4096))
FLAGS = dict(dropout_ratio=0.1, apply_u_silu=True, concat_u=True, concat_x=True)


def events_us(fn, reps: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        start, end = torch.cuda.Event(True), torch.cuda.Event(True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) * 1000 / reps)
    return best


def main() -> None:
    rt = graphrt.runtime()
    hstu_plan.ONE_LAUNCH_MAX_D = 1 << 30
    planned = kernels.finish_unroll
    for n, d in CASES:
        bf16 = dict(dtype=torch.bfloat16, device="cuda")
        x, u = torch.randn(n, d, **bf16), torch.randn(n, d, **bf16)
        w, b = torch.randn(d, **bf16), torch.randn(d, **bf16)
        y, mean, rstd, mask = hstu_lmsd_forward(x, u, w, b, dropout_ratio=0.1, seed=1)
        args = (torch.randn_like(y), x, u, w, b, mean, rstd, mask)
        plan = rt.plan(HstuLmsdBackward, *args, **FLAGS)
        outs = dict(dx=torch.empty_like(x), du=torch.empty_like(u), dweight=torch.empty_like(w),
                    dbias=torch.empty_like(b))
        own = torch.empty(plan.workspace_bytes(), dtype=torch.uint8, device="cuda")
        row = [f"{n} x {d}: two launches "
               f"{events_us(lambda: plan.execute(*args, **outs, workspace=own)):.1f}"]
        for unroll in dict.fromkeys((2, planned(triton.next_power_of_2(d)), 16)):
            kernels.finish_unroll = lambda block_d, unroll=unroll: unroll
            plan._bindings.clear()   # a binding keeps the rows in flight it was recorded with
            with rt.arena.scope():
                lent = rt.arena.take(plan.workspace_bytes(), torch.cuda.current_stream())
                counters = rt.arena.counters(lent, plan.counter_words())
                us = events_us(lambda: plan.execute(*args, **outs, counters=counters,
                                                    workspace=lent))
            row.append(f"one launch, {unroll} rows {us:.1f}")
        kernels.finish_unroll = planned
        torch.cuda.synchronize()
        assert not rt.arena.counter_map().any(), "a counter was left nonzero"
        print(", ".join(row), "us", flush=True)


if __name__ == "__main__":
    main()
