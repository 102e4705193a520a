"""Data-parallel training step of the capture example's stack: eager DistributedDataParallel
against graph_step with in-graph gradient averaging, one process per GPU.

``graphrt bench ddp`` launches torchrun over the visible GPUs; each rank runs ``run_rank``.
"""
from __future__ import annotations

import copy
import os
import subprocess
import sys

import torch
import torch.distributed as dist

from ..capture import graph_step
from ..capture.data_parallel import NCCL_ENV
from . import report
from ..models import Stack, eager_step_fn, mse
from .timing import wall_ms_per_step

HIDDEN, FFN, LAYERS = 1024, 4096, 4


def _flat_grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1).float() for p in model.parameters()])


def run_rank(tokens: int = 1024, steps: int = 10, hidden: int = HIDDEN, ffn: int = FFN,
             layers: int = LAYERS) -> dict:
    """On every rank of an initialized NCCL group: the captured step against eager DDP (bitwise,
    every step), the ranks' gradients against each other, and step times."""
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)   # the same initial weights on every rank
    base = Stack(hidden, ffn, layers, device=device)
    ddp_model = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(base),
                                                          device_ids=[device.index])
    graph_model, local_model = copy.deepcopy(base), copy.deepcopy(base)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-5, capturable=True)
            for m in (ddp_model, graph_model, local_model)]
    gen = torch.Generator(device=device).manual_seed(1000 + rank)   # each rank its own batches
    batches = [tuple(torch.randn(tokens, hidden, dtype=torch.bfloat16, device=device,
                                 generator=gen) for _ in range(2)) for _ in range(steps)]
    step = graph_step(graph_model, mse, batches[0], opts[1], process_group=dist.group.WORLD)
    local = graph_step(local_model, mse, batches[0], opts[2])      # the same work, no reduction
    eager = eager_step_fn(ddp_model, opts[0])
    mismatched_steps = 0
    for x, y in batches:
        loss = step(x, y).clone()
        eager_loss = eager(x, y)
        same = torch.equal(loss, eager_loss) and all(
            torch.equal(p.grad, q.grad) and torch.equal(p, q)
            for p, q in zip(ddp_model.module.parameters(), graph_model.parameters()))
        mismatched_steps += not same
    flat = _flat_grads(graph_model)
    everyone = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(everyone, flat)
    ranks_equal = all(torch.equal(everyone[0], f) for f in everyone)

    def reductions_alone():
        for buffer in step.reducer.flat:
            dist.all_reduce(buffer)
    comm_ms = wall_ms_per_step(lambda *_: reductions_alone(), batches)
    eager_ms = wall_ms_per_step(eager, batches)
    graph_ms = wall_ms_per_step(step, batches)
    local_ms = wall_ms_per_step(local, batches)
    row = {"world": world, "tokens": tokens, "eager_ddp_ms": eager_ms, "graph_ms": graph_ms,
           "speedup": eager_ms / graph_ms, "graph_no_reduction_ms": local_ms,
           "reductions_alone_ms": comm_ms,
           "hidden_fraction": 1 - (graph_ms - local_ms) / comm_ms if comm_ms > 0 else float("nan"),
           "buckets": len(step.reducer.buckets),
           "max_parallel_kernels": step.fragment.shape()["max_parallel_kernels"],
           "steps_equal_to_ddp": steps - mismatched_steps, "steps": steps,
           "ranks_equal": ranks_equal}
    step.release()
    local.release()
    return row


def rank_main() -> None:
    """Entry point of one torchrun process."""
    os.environ.update(NCCL_ENV)
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    try:
        rows = [run_rank(tokens) for tokens in (1024, 8192)]
        if dist.get_rank() == 0:
            report.publish(
                "ddp", rows,
                legend="eager_ddp_ms / graph_ms: wall time per data-parallel training step "
                       "(forward, loss, backward, gradient averaging, AdamW); hidden_fraction: "
                       "the share of the reductions' own time that the captured step hides "
                       "behind backward compute")
    finally:
        dist.destroy_process_group()


def main(progress=print) -> None:
    """``graphrt bench ddp``: torchrun with one process per visible GPU."""
    gpus = torch.cuda.device_count()
    progress(f"ddp: torchrun over {gpus} GPU(s) ...")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={gpus}", "-m", "graphrt.bench.data_parallel"]
    subprocess.run(cmd, env={**os.environ, **NCCL_ENV}, check=True)


if __name__ == "__main__":
    rank_main()
