"""Step time of the capture example's stack: eager against graph_step, and host time per replay."""
from __future__ import annotations

import torch

from ..capture import graph_step
from . import report
from ..models import eager_step_fn, mse, twin_stacks
from .timing import host_enqueue_us, wall_ms_per_step

TOKENS = (256, 1024, 8192)
HIDDEN, FFN, LAYERS = 1024, 4096, 4


def run(progress=print) -> list[dict]:
    rows = []
    for tokens in TOKENS:
        progress(f"capture: {LAYERS}-layer stack, {tokens} tokens ...")
        eager_model, graph_model, eager_opt, graph_opt, batches = twin_stacks(
            tokens, HIDDEN, FFN, LAYERS, 10, lr=1e-5)
        step = graph_step(graph_model, mse, tuple(t.clone() for t in batches[0]), graph_opt)
        eager_step = eager_step_fn(eager_model, eager_opt)

        for _ in range(2):
            eager_step(*batches[0])
        eager_ms = wall_ms_per_step(eager_step, batches)
        graph_ms = wall_ms_per_step(step, batches)
        x0, y0 = step.fragment.inputs
        x1, y1 = batches[1]
        rows.append({"tokens": tokens, "eager_ms": eager_ms, "graph_ms": graph_ms,
                     "speedup": eager_ms / graph_ms,
                     "host_us_replay": host_enqueue_us(step.fragment.replay),
                     "host_us_call_same_inputs": host_enqueue_us(lambda: step(x0, y0)),
                     "host_us_call_copy_inputs": host_enqueue_us(lambda: step(x1, y1)),
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
