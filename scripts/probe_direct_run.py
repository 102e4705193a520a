"""One-off probe: plan.execute host time with Triton's C launch called directly (DirectRun)
and through compiled.run, interleaved rounds, with binding hits per case."""
import statistics

import torch

from graphrt import kernel_utils
from graphrt.bench.host import host_us, op_cases

device = torch.device("cuda", 0)
cases = {k: v for k, v in op_cases(device).items() if k.endswith("plan.execute")}
real = kernel_utils.direct_run


def mode(direct: bool) -> None:
    kernel_utils.direct_run = real if direct else (lambda compiled: compiled.run)
    kernel_utils._launcher.bound.clear()
    for fn in cases.values():
        if fn.plan._bindings is not None:
            fn.plan._bindings.clear()
        fn()
    torch.cuda.synchronize()


times = {(k, d): [] for k in cases for d in (True, False)}
for r in range(6):
    for direct in ((True, False) if r % 2 == 0 else (False, True)):
        mode(direct)
        for name, fn in cases.items():
            b = fn.plan._bindings
            hits = b.hits if b is not None else 0
            times[name, direct].append(host_us(fn))
            after = b.hits if b is not None else 0
            if r == 0:
                print(f"{name} direct={direct}: binding hits {after - hits} of 200, "
                      f"recorded {len(b.recorded) if b is not None else None}")
for name in cases:
    on, off = (statistics.median(times[name, d]) for d in (True, False))
    print(f"{name:45s} direct {on:6.1f} us   compiled.run {off:6.1f} us   "
          f"min {min(times[name, True]):6.1f} / {min(times[name, False]):6.1f}")
