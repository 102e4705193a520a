"""Timing helpers: device-event medians over rotating input sets larger than L2."""
from __future__ import annotations

import itertools
import time
from typing import Callable, Sequence

import torch

COPY_CEILING_TBPS = 4.25      # measured device-to-device copy on the H200 (shared/BASELINES.md)
BF16_GEMM_CEILING_TFLOPS = 679.0


def n_input_sets(bytes_per_set: int, device: torch.device, at_least: int = 2, at_most: int = 8) -> int:
    """Enough input sets that cycling through them spans about three times the L2 cache."""
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 60 << 20)
    need = -(-3 * l2 // max(1, bytes_per_set))
    return max(at_least, min(at_most, need))


def rotating(fn: Callable, input_sets: Sequence[tuple]) -> Callable[[], object]:
    """A no-argument callable that runs ``fn`` on the next input set each call."""
    cycle = itertools.cycle(input_sets)
    return lambda: fn(*next(cycle))


def device_time_us(fn: Callable[[], object], warmup_ms: float = 50, rep_ms: float = 200) -> float:
    """Median device time of ``fn`` in microseconds (triton.testing.do_bench, L2 flushed).

    do_bench zeroes a 256 MB buffer before every call, so the timed call also writes back the
    dirty lines that the flush leaves in L2 (up to the L2 size); short calls pay most for it."""
    import triton.testing
    return 1000.0 * triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")


def stream_time_us(fn: Callable[[], object], calls: int = 20, repeats: int = 7,
                   lead_ms: float = 5.0) -> float:
    """Median over ``repeats`` batches of the mean device time of ``calls`` back-to-back calls.

    Each batch starts behind a GPU sleep long enough for the host to enqueue every call, so host
    overhead stays out of the figure; with ``fn`` rotating over input sets larger than L2 each call
    reads cold inputs, as in a training step."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    sleep_cycles = int(lead_ms * 1e-3 * 2.0e9)  # about lead_ms at the H200's 1.98 GHz
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(sleep_cycles)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / calls)
    times.sort()
    return times[len(times) // 2]


def host_time_us(fn: Callable[[], object], iters: int = 20000, repeats: int = 5) -> float:
    """Best-of-``repeats`` mean host time of ``fn`` in microseconds."""
    for _ in range(min(iters, 1000)):
        fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best * 1e6


def wall_ms_per_step(fn, batches, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean wall time of back-to-back steps (host and device)."""
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for x, y in batches:
            fn(x, y)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3 / len(batches))
    times.sort()
    return times[len(times) // 2]


def host_enqueue_us(fn, iters: int = 10) -> float:
    """Host time to enqueue one call. A 100 ms GPU sleep ahead of the calls keeps the host from
    ever waiting on the device (ten steps of the capture bench's largest case take about 40 ms)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9 * 0.1))
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host = (time.perf_counter() - t0) * 1e6 / iters
    torch.cuda.synchronize()
    return host


def timed_ms(fn: Callable[[], object]) -> tuple[object, float]:
    """(fn(), its wall time in ms), the GPU drained before and after: one step as a user sees it."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    result = fn()
    torch.cuda.synchronize()
    return result, (time.perf_counter() - t0) * 1e3
