"""How much of a kernel launch's host time is the driver's: the bare 3-argument kernel launched
by Triton's JIT, by Triton's C launch with its arguments ready, by cuLaunchKernelEx through
ctypes, and by cuLaunchKernelEx in a C loop (compiled here with gcc against Triton's cuda.h),
each 200 times behind a GPU sleep (`graphrt.bench.host.host_us`; the C loop times itself), the
minimum over five rounds. Kernel parameters as Triton 3.6 passes them (the arguments, then the
global and profile scratch).

    python scripts/launch_floor.py
"""
import ctypes
import os
import subprocess
import tempfile

import torch
import triton

from graphrt.bench.host import _add_one_kernel, host_us
from graphrt.kernel_utils import direct_run

CALLS = 200
SOURCE = r"""
#include <cuda.h>
#include <dlfcn.h>
#include <time.h>
typedef CUresult (*launch_t)(const CUlaunchConfig*, CUfunction, void**, void**);
static launch_t launch_ex;

int init(void) {
  void* lib = dlopen("libcuda.so.1", RTLD_LAZY);
  launch_ex = lib ? (launch_t)dlsym(lib, "cuLaunchKernelEx") : 0;
  return launch_ex != 0;
}

static CUlaunchConfig config(unsigned long long stream, int warps, int smem,
                             CUlaunchAttribute* attr, int pdl) {
  CUlaunchConfig c = {0};
  c.gridDimX = c.gridDimY = c.gridDimZ = 1;
  c.blockDimX = 32 * warps; c.blockDimY = c.blockDimZ = 1;
  c.sharedMemBytes = smem; c.hStream = (CUstream)stream; c.attrs = attr;
  if (pdl) {
    attr[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr[0].value.programmaticStreamSerializationAllowed = 1;
    c.numAttrs = 1;
  }
  return c;
}

/* us a launch over count launches, or minus the CUDA error */
double launch_many(unsigned long long f, unsigned long long stream, unsigned long long x,
                   int n, int count, int warps, int smem, int pdl) {
  CUdeviceptr ptr = x, global_scratch = 0, profile_scratch = 0;
  void* params[] = {&ptr, &n, &global_scratch, &profile_scratch};
  CUlaunchAttribute attr[1];
  CUlaunchConfig c = config(stream, warps, smem, attr, pdl);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < count; i++) {
    CUresult r = launch_ex(&c, (CUfunction)f, params, 0);
    if (r) return -(double)r;
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / count / 1e3;
}
"""


def _library():
    include = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "include")
    folder = tempfile.mkdtemp()
    with open(f"{folder}/floor.c", "w") as f:
        f.write(SOURCE)
    subprocess.check_call(["gcc", "-O2", "-shared", "-fPIC", f"-I{include}", f"{folder}/floor.c",
                           "-o", f"{folder}/floor.so", "-ldl"])
    lib = ctypes.CDLL(f"{folder}/floor.so")
    assert lib.init(), "no cuLaunchKernelEx in libcuda.so.1"
    lib.launch_many.restype = ctypes.c_double
    lib.launch_many.argtypes = [ctypes.c_ulonglong] * 3 + [ctypes.c_int] * 5
    return lib


def main() -> None:
    lib = _library()
    x = torch.zeros(16, device="cuda")
    compiled = _add_one_kernel[(1,)](x, 16, BLOCK=16)
    torch.cuda.synchronize()
    warps, smem, f = compiled.metadata.num_warps, compiled.metadata.shared, compiled.function
    stream, ptr = torch.cuda.current_stream().cuda_stream, x.data_ptr()
    x.zero_()
    lib.launch_many(f, stream, ptr, 16, 5, warps, smem, 0)
    torch.cuda.synchronize()
    print("five launches from C added 5:", bool((x == 5).all()))
    c_launch, leading, packed = direct_run(compiled).form((1, 1, 1), stream, f,
                                                          compiled.packed_metadata)
    args = (ptr, 16, 16)
    launch_one = lib.launch_many   # called for one launch at a time
    cases = {
        "bare Triton launch": lambda: _add_one_kernel[(1,)](x, 16, BLOCK=16),
        "Triton's C launch": ((lambda: c_launch(*leading, args)) if packed else
                              (lambda: c_launch(*leading, *args))),
        "cuLaunchKernelEx through ctypes": lambda: launch_one(f, stream, ptr, 16, 1, warps,
                                                              smem, 0),
    }
    best: dict = {}
    for _ in range(5):
        for name, fn in cases.items():
            best[name] = min(best.get(name, float("inf")), host_us(fn, CALLS))
        for pdl in (0, 1):
            torch.cuda.synchronize()
            torch.cuda._sleep(int(6e8))
            us = lib.launch_many(f, stream, ptr, 16, CALLS, warps, smem, pdl)
            torch.cuda.synchronize()
            name = f"cuLaunchKernelEx in a C loop, pdl={pdl}"
            best[name] = min(best.get(name, float("inf")), us)
    for name, us in best.items():
        print(f"{name:40s} {us:7.2f} us")


if __name__ == "__main__":
    main()
