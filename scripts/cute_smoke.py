"""CuTe DSL on the device: import, compile and run a one-line kernel, and list the TMA multicast
copies (what Triton 3.6 lacks for the projection GEMM, issue 7). scripts/cute_bundle.sh says how
the DSL gets there.

Usage (device): python3 scripts/cute_smoke.py
"""
import time

import torch
import cutlass
import cutlass.cute as cute
from cutlass.cute.nvgpu import cpasync
from cutlass.cute.runtime import from_dlpack


@cute.kernel
def _add_one(a: cute.Tensor):
    thread, _, _ = cute.arch.thread_idx()
    block, _, _ = cute.arch.block_idx()
    a[block * 128 + thread] = a[block * 128 + thread] + 1.0


@cute.jit
def _launch(a: cute.Tensor):
    _add_one(a).launch(grid=(a.shape[0] // 128, 1, 1), block=(128, 1, 1))


def main():
    x = torch.randn(4096, device="cuda")
    expected = x + 1
    start = time.perf_counter()
    compiled = cute.compile(_launch, from_dlpack(x))
    print(f"CuTe DSL {cutlass.__version__}: compiled in {time.perf_counter() - start:.1f} s")
    compiled(from_dlpack(x))
    torch.cuda.synchronize()
    print("kernel result correct:", torch.equal(x, expected))
    print("TMA multicast copies:", [n for n in dir(cpasync) if n.endswith("MulticastOp")])


if __name__ == "__main__":
    main()
