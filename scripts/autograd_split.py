"""Where a Python autograd.Function's host cost goes on the GPU host: each case's forward +
backward, enqueued behind a GPU sleep and as wall time, with autograd's device threads on
(the default) and off (the backward on the calling thread). host_parts.py found one multiply
each way 51 us dearer through a Python Function on the H100 host, against 6-12 us on a CPU.

    python scripts/autograd_split.py
"""
import torch

import graphrt
from graphrt.bench.host import MODULE_SHAPES, host_us

class Scaled(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(w)
        return x * w

    @staticmethod
    def backward(ctx, gy):
        (w,) = ctx.saved_tensors
        return gy * w, None


def main() -> None:
    dev = torch.device("cuda", 0)
    rows, hidden = MODULE_SHAPES[0]
    x = torch.randn(rows, hidden, dtype=torch.bfloat16, device=dev, requires_grad=True)
    g = torch.randn_like(x)
    xs = torch.randn(16, 16, dtype=torch.bfloat16, device=dev, requires_grad=True)   # GPU time ~0
    gs = torch.randn_like(xs)
    w16 = torch.randn(16, dtype=torch.bfloat16, device=dev)
    c_apply = super(torch.autograd.Function, Scaled).apply   # without Function.apply's Python
    mod = graphrt.nn.RMSNorm(hidden, device=dev)
    native = torch.nn.RMSNorm(hidden, eps=1e-6, device=dev, dtype=torch.bfloat16)
    cases = {
        "16x16 x * w, native": lambda: (xs * w16).backward(gs),
        "16x16 x * w, Python Function.apply": lambda: Scaled.apply(xs, w16).backward(gs),
        "16x16 x * w, the C apply alone": lambda: c_apply(xs, w16).backward(gs),
        "16x16 x * w forward only, native": lambda: xs * w16,
        "16x16 x * w forward only, Function.apply": lambda: Scaled.apply(xs, w16),
        "graphrt.nn.RMSNorm": lambda: mod(x).backward(g),
        "torch.nn.RMSNorm": lambda: native(x).backward(g),
    }
    for threads in (True, False):
        with torch.autograd.set_multithreading_enabled(threads):
            for name, fn in cases.items():
                for _ in range(3):
                    fn()
                queued = min(host_us(fn, 100) for _ in range(5))
                wall = min(host_us(fn, 100, sleep=False) for _ in range(5))
                print(f"{'threads on ' if threads else 'threads off'}  {name:<42} behind a sleep "
                      f"{queued:8.1f} us, wall {wall:8.1f} us", flush=True)


if __name__ == "__main__":
    main()
