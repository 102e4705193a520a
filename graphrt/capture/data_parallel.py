"""Data-parallel gradient averaging that a CUDA graph can hold: buckets of gradients reduced over
a process group on a side stream while the rest of the backward runs."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..errors import ContractError

DEFAULT_BUCKET_BYTES = 25 << 20
# NVLink SHARP (multicast) stays off on the lent machines; set before a process group is made.
NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}


@dataclass(frozen=True)
class Bucket:
    """Indices (into the parameter list) of gradients reduced together, and their element count."""
    params: tuple[int, ...]
    numel: int
    dtype: torch.dtype


def assign_buckets(params, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[Bucket]:
    """Buckets in reverse parameter order (the backward produces the last layers' gradients
    first), one dtype per bucket, each closed once it reaches ``bucket_bytes``."""
    if bucket_bytes <= 0:
        raise ContractError(f"bucket_bytes: expected a positive byte count, got {bucket_bytes}")
    buckets, current, size, dtype = [], [], 0, None

    def close():
        if current:
            buckets.append(Bucket(tuple(current), sum(params[i].numel() for i in current), dtype))

    for i in reversed(range(len(params))):
        p = params[i]
        if current and (p.dtype != dtype or size >= bucket_bytes):
            close()
            current, size = [], 0
        current.append(i)
        size += p.numel() * p.element_size()
        dtype = p.dtype
    close()
    return buckets


class GradientReducer:
    """Averages ``params``' gradients over ``group`` (like DistributedDataParallel: each bucket
    is divided by the world size, then all-reduced by sum). A bucket is launched on the reducer's
    side stream as soon as its last gradient is accumulated, in bucket order on every rank;
    ``finish()`` makes the current stream wait for all of them. Bucket buffers are allocated
    once, so a captured backward holds the reductions as a parallel branch. (CPU parameters, with
    gloo, reduce in line: no streams.)

    >>> reducer = GradientReducer(list(model.parameters()), group)   # doctest: +SKIP
    >>> loss.backward(); reducer.finish(); optimizer.step()
    """

    def __init__(self, params, group=None, bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        import torch.distributed as dist
        if not dist.is_available() or not dist.is_initialized():
            raise ContractError("process_group: torch.distributed is not initialized; call "
                                "torch.distributed.init_process_group (e.g. under torchrun) first")
        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ContractError("model: no parameter requires a gradient")
        device = self.params[0].device
        if any(p.device != device for p in self.params):
            raise ContractError(f"model: data-parallel steps need every parameter on one device, "
                                f"got {sorted({str(p.device) for p in self.params})}")
        self.group = group
        self.world = dist.get_world_size(group)
        self.buckets = assign_buckets(self.params, bucket_bytes)
        self.flat = [torch.empty(b.numel, dtype=b.dtype, device=device) for b in self.buckets]
        self.bucket_of = {}
        for b, bucket in enumerate(self.buckets):
            for i in bucket.params:
                self.bucket_of[id(self.params[i])] = b
        self.stream = torch.cuda.Stream(device=device) if device.type == "cuda" else None
        self._handles = [p.register_post_accumulate_grad_hook(self._on_grad) for p in self.params]
        self.reset()

    def reset(self) -> None:
        """Forget a step's progress (before each backward)."""
        self._ready = [0] * len(self.buckets)
        self._launched = 0

    def _on_grad(self, param: torch.Tensor) -> None:
        b = self.bucket_of[id(param)]
        self._ready[b] += 1
        while (self._launched < len(self.buckets)
               and self._ready[self._launched] == len(self.buckets[self._launched].params)):
            self._launch(self._launched)
            self._launched += 1

    def _launch(self, b: int) -> None:
        import torch.distributed as dist
        grads = [self.params[i].grad for i in self.buckets[b].params]
        flat = self.flat[b]
        views = list(flat.split([g.numel() for g in grads]))
        on_side = contextlib.nullcontext()
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream(flat.device))
            on_side = torch.cuda.stream(self.stream)
        with on_side:
            torch._foreach_copy_(views, [g.reshape(-1) for g in grads])
            flat.div_(self.world)
            dist.all_reduce(flat, group=self.group)
            torch._foreach_copy_(grads, [v.view_as(g) for v, g in zip(views, grads)])
        if self.stream is not None:  # keep the grads' memory from reuse until the side work ends
            for g in grads:
                g.record_stream(self.stream)

    def finish(self) -> None:
        """Make the current stream wait for every bucket's reduction (after ``backward()``)."""
        if self._launched < len(self.buckets):
            missing = [i for b in self.buckets[self._launched:] for i in b.params
                       if self.params[i].grad is None]
            raise ContractError(
                f"model: {len(missing)} parameter(s) got no gradient this step (first: index "
                f"{missing[0] if missing else '?'}); every rank must reduce the same buckets, so "
                f"a data-parallel step needs a gradient for every parameter that requires one")
        if self.stream is not None:
            torch.cuda.current_stream(self.flat[0].device).wait_stream(self.stream)
        self.reset()

    def remove(self) -> None:
        """Unregister the gradient hooks."""
        for h in self._handles:
            h.remove()
        self._handles = []
