"""Triton helpers shared by the ops' kernels."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .notices import warn_once

# The Triton that graphrt's uses of its internals (the direct launch below) and of experimental
# Gluon were written and measured with; other versions take the public paths.
ON_TESTED_TRITON = tuple(int(v) for v in triton.__version__.split(".")[:2]) == (3, 6)

try:  # the internals the direct launch below relies on, as Triton 3.6 has them
    from triton import knobs as _knobs
    from triton.runtime.jit import JITFunction as _JITFunction, compute_cache_key as _cache_key
    _DIRECT_LAUNCH = ON_TESTED_TRITON
except ImportError:  # pragma: no cover - other Triton versions
    _DIRECT_LAUNCH = False


# Programmatic dependent launch (compute capability 9.0 and later): a kernel launched with it may
# start while the kernel before it in the stream drains, and waits in wait_for_prior_kernel before
# it touches memory. GRAPHRT_PDL=0 (read at import) turns it off.
PDL_ENABLED = os.environ.get("GRAPHRT_PDL", "1") != "0"
_pdl_by_device: dict[int, bool] = {}


def use_pdl(t) -> bool:
    """Whether kernels on ``t``'s device launch as programmatic dependent launches: CUDA devices
    of compute capability 9.0 and later (not the Triton interpreter), unless GRAPHRT_PDL=0."""
    index = t.get_device()
    if index < 0 or not PDL_ENABLED:
        return False
    enabled = _pdl_by_device.get(index)
    if enabled is None:
        enabled = _pdl_by_device[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return enabled


def launch(kernel, grid: tuple, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)`` with a third less host time (21 -> 14 us a launch on the
    H200 host). Triton's own binder and cache key still pick the compiled kernel, so every
    specialization stays as Triton makes it; the launcher is then called directly, without
    ``JITFunction.run``'s per-call hook, knob and global-variable bookkeeping. The first launch of
    a specialization (it compiles), launch hooks (profilers), the interpreter and Triton versions
    other than 3.6 take ``kernel[grid]``.

    >>> launch(_uniform_kernel, (blocks,), out, rng.state, n, BLOCK=1024)   # doctest: +SKIP
    """
    runtime = _knobs.runtime if _DIRECT_LAUNCH else None
    if runtime is None and not ON_TESTED_TRITON and type(kernel).__name__ == "JITFunction":
        warn_once("direct-launch", f"graphrt: Triton {triton.__version__} is not the Triton 3.6 "
                  f"its direct kernel launch was written for, so launches take Triton's own "
                  f"path (about 7 us more host time each on an H200 host)")
    if (runtime is None or type(kernel) is not _JITFunction or kernel.pre_run_hooks
            or runtime.launch_enter_hook.calls or runtime.launch_exit_hook.calls):
        return kernel[grid](*args, **kwargs)
    driver = triton.runtime.driver.active
    device = driver.get_current_device()
    kernel_cache, key_cache, _, _, binder = kernel.device_caches[device]
    options = dict(kwargs)  # the two options JITFunction.run adds, as it sets them
    options["debug"] = kwargs.get("debug", kernel.debug) or runtime.debug
    options["instrumentation_mode"] = _knobs.compilation.instrumentation_mode
    bound, specialization, options = binder(*args, **options)
    compiled = kernel_cache.get(_cache_key(key_cache, specialization, options))
    if compiled is None or hasattr(compiled, "result"):  # not compiled yet, or compiling
        return kernel[grid](*args, **kwargs)
    compiled.run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
                 driver.get_current_stream(device), compiled.function, compiled.packed_metadata,
                 None, None, None, *bound.values())
    return compiled


def persistent_grid(tiles: int, max_programs: int) -> int:
    """Programs for a persistent loop over ``tiles`` interleaved tiles: as few as still take
    the same number of steps as ``max_programs`` would, so no step at the end runs only a few
    programs (16384 rows over 528 programs: 512 programs of 32 rows, not 16 programs finishing a
    32nd row alone).

    >>> persistent_grid(16384, 528), persistent_grid(100, 528)
    (512, 100)
    """
    if tiles <= max_programs:
        return max(tiles, 1)
    steps = -(-tiles // max_programs)
    return -(-tiles // steps)


@triton.jit
def row_offsets(rows, stride):
    """Element offsets of ``rows`` as a [rows, 1] column. Row strides are run-time values (never
    specialized); the contracts make them multiples of 16 bytes, and saying so on the offsets
    lets the compiler use 16-byte vector loads, stores and async copies."""
    return tl.multiple_of(rows * stride, 8)[:, None]


@triton.jit
def mma(a, b, DOT_FP32: tl.constexpr):
    """a @ b with FP32 accumulation; ``DOT_FP32`` for the Triton interpreter, which has no BF16
    matrix product (operands are then converted to FP32 first)."""
    if DOT_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def allow_dependent_launch(ENABLED: tl.constexpr):
    """Lets the next kernel in the stream, launched as a programmatic dependent launch, start
    (it waits in ``wait_for_prior_kernel`` until this grid's writes are visible). Off in the
    Triton interpreter, which has no inline assembly."""
    if ENABLED:
        gdc_launch_dependents()


@triton.jit
def wait_for_prior_kernel(ENABLED: tl.constexpr):
    """Blocks until the previous kernel in the stream has finished and its writes are visible:
    the other half of ``allow_dependent_launch``."""
    if ENABLED:
        gdc_wait()


@triton.jit
def sigmoid(v, HARDWARE: tl.constexpr):
    """1 / (1 + exp(-v)) in FP32 from the hardware's 2^x and reciprocal (MUFU.EX2, MUFU.RCP:
    2 and 1 ulp, subnormals flushed), four instructions instead of tl.sigmoid's range fix-ups.
    ``HARDWARE`` false (the Triton interpreter, which has no inline assembly) uses tl.sigmoid."""
    if HARDWARE:
        e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f",
                                      [v * -1.4426950408889634], dtype=tl.float32, is_pure=True,
                                      pack=1)
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [1.0 + e],
                                         dtype=tl.float32, is_pure=True, pack=1)
    return tl.sigmoid(v)
