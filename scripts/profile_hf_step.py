"""Where a Hugging Face Llama training step (graphrt.bench.hf's model, AdamW) spends its GPU
time: the kernels of a few eager and torch.compile'd steps under torch.profiler, summed by
kind (GEMM, attention, optimizer, cross-entropy, norms, elementwise), per step, against the
step's wall time. Needs transformers and a GPU.

Usage: python3 scripts/profile_hf_step.py [BATCHxSEQ ...]
"""
from __future__ import annotations

import collections
import re
import sys
import time

import torch

from graphrt.bench.hf import CONFIG, _model
from graphrt.models import eager_step_fn, lm_loss

KINDS = (("gemm", r"gemm|cutlass|sm90_xmma|nvjet|cublas|_mm_|matmul"),
         ("attention", r"flash|fmha|attention|sdpa|efficient"),
         ("optimizer", r"adam|multi_tensor|foreach|_amp_"),
         ("cross-entropy", r"softmax|nll|cross_entropy|log_softmax"),
         ("norm", r"rms|norm"),
         ("copy/cast", r"copy|cast|to_copy|convert"),
         ("other", r"."))


def kind_of(name: str) -> str:
    low = name.lower()
    return next(kind for kind, pattern in KINDS if re.search(pattern, low))


def profile(variant: str, batch: int, seq: int, steps: int = 5) -> None:
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, capturable=True)
    forward = torch.compile(model) if variant == "compile" else model
    step = eager_step_fn(forward, opt, lm_loss)
    data = tuple(torch.randint(0, CONFIG["vocab_size"], (batch, seq), device="cuda") for _ in range(2))
    for _ in range(4):
        step(*data)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step(*data)
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3 / steps
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step(*data)
        torch.cuda.synchronize()
    per_kind = collections.Counter()
    per_kernel = collections.Counter()
    launches = 0
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            us = event.device_time / steps
            per_kind[kind_of(event.name)] += us
            per_kernel[event.name[:90]] += us
            launches += 1
    total = sum(per_kind.values())
    print(f"\n== {variant} {batch}x{seq}: wall {wall_ms:.2f} ms per step, kernels {total / 1e3:.2f} ms, "
          f"{launches / steps:.0f} kernels per step")
    for kind, us in per_kind.most_common():
        print(f"   {kind:>14}: {us / 1e3:7.3f} ms  {100 * us / total:5.1f}%")
    for name, us in per_kernel.most_common(25):
        print(f"   {us:9.1f} us  {name}")


def main():
    sizes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[1:]] or [(1, 512), (2, 2048)]
    for batch, seq in sizes:
        for variant in ("eager", "compile"):
            profile(variant, batch, seq)


if __name__ == "__main__":
    main()
