"""Step time of the capture example's stack: eager against graph_step, and host time per replay."""
from __future__ import annotations

import time

import torch

from ..capture import graph_step
from . import report
from .models import eager_step_fn, mse, twin_stacks

TOKENS = (256, 1024, 8192)
HIDDEN, FFN, LAYERS = 1024, 4096, 4


def _per_step_ms(fn, batches, repeats: int = 5) -> float:
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


def _host_us(fn, iters: int = 10) -> float:
    """Host time to enqueue one call. A 100 ms GPU sleep ahead of the calls keeps the host from
    ever waiting on the device (10 steps of the largest case take about 40 ms)."""
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9 * 0.1))
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host = (time.perf_counter() - t0) * 1e6 / iters
    torch.cuda.synchronize()
    return host


def run(progress=print) -> list[dict]:
    rows = []
    for tokens in TOKENS:
        progress(f"capture: {LAYERS}-layer stack, {tokens} tokens ...")
        eager_model, graph_model, eager_opt, graph_opt, batches = twin_stacks(
            tokens, HIDDEN, FFN, LAYERS, 10, lr=1e-5)
        step = graph_step(graph_model, mse, batches[0], graph_opt)
        eager_step = eager_step_fn(eager_model, eager_opt)

        for _ in range(2):
            eager_step(*batches[0])
        eager_ms = _per_step_ms(eager_step, batches)
        graph_ms = _per_step_ms(step, batches)
        x0, y0 = step.fragment.inputs
        rows.append({"tokens": tokens, "eager_ms": eager_ms, "graph_ms": graph_ms,
                     "speedup": eager_ms / graph_ms,
                     "host_us_replay": _host_us(step.fragment.replay),
                     "host_us_call_same_inputs": _host_us(lambda: step(x0, y0)),
                     "host_us_call_copy_inputs": _host_us(lambda: step(*batches[1])),
                     "graph_nodes": step.nodes()["total"],
                     "graph_memory_MB": step.fragment.memory_bytes / 2**20})
        step.release()
        del eager_model, graph_model, eager_opt, graph_opt, batches
        torch.cuda.empty_cache()
    return rows


def main(progress=print) -> list[dict]:
    return report.publish(
        "capture", run(progress), progress,
        legend="eager_ms / graph_ms: wall time per training step (forward, loss, backward, AdamW), "
               "back-to-back steps; host_us_*: host time to enqueue one replay")
