"""graph_step: a whole training step (forward, loss, backward, optimizer) as one CUDA graph."""
from __future__ import annotations

from typing import Callable

import torch

from ..errors import ContractError
from ..runtime import Runtime
from .data_parallel import DEFAULT_BUCKET_BYTES, GradientReducer
from .fragment import Fragment, capture


def _host_copy(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


class _TrainingState:
    """Parameters, floating-point buffers and optimizer state, saved before warm-up and put back
    in place after it, so that capturing a step leaves the model exactly as it was. The copies
    are kept in host memory: on the GPU they would add the model and its optimizer state again
    to the capture's peak."""

    def __init__(self, model: torch.nn.Module, optimizer):
        self.params = [p for p in model.parameters()] + [b for b in model.buffers()
                                                          if b.is_floating_point()]
        self.saved = [_host_copy(p) for p in self.params]
        self.optimizer = optimizer
        self.saved_opt = {}
        if optimizer is not None:
            for p, st in optimizer.state.items():
                self.saved_opt[p] = {k: _host_copy(v) if isinstance(v, torch.Tensor) else v
                                     for k, v in st.items()}

    def restore(self) -> None:
        with torch.no_grad():
            for p, s in zip(self.params, self.saved):
                p.copy_(s)
        if self.optimizer is None:
            return
        for p, st in self.optimizer.state.items():
            before = self.saved_opt.get(p, {})
            for k, v in st.items():
                if not isinstance(v, torch.Tensor):
                    if k in before:
                        st[k] = before[k]
                    continue
                if k in before:
                    v.copy_(before[k])
                else:
                    # created by a warm-up step: zero is the fresh state of Adam, AdamW and SGD
                    v.zero_()


def _check_optimizer(optimizer) -> None:
    if optimizer is None:
        return
    for i, group in enumerate(optimizer.param_groups):
        if "capturable" in group and not group["capturable"]:
            raise ContractError(
                f"optimizer: param group {i} has capturable=False; a CUDA graph cannot hold its "
                f"host-side step counter. Build it with capturable=True (e.g. torch.optim.AdamW("
                f"params, lr=..., capturable=True)) or pass optimizer=None and step outside")


class StepGraph:
    """A captured training step. ``step(*batch)`` copies the batch into the static inputs,
    replays forward, loss, backward (and the optimizer step) and returns the static loss;
    gradients are in the parameters' static ``.grad`` buffers, overwritten every step."""

    def __init__(self, fragment: Fragment, model: torch.nn.Module,
                 reducer: GradientReducer | None = None, pool=None):
        self.fragment = fragment
        self.model = model
        self.reducer = reducer
        self.pool = pool

    def step(self, *batch) -> torch.Tensor:
        return self.fragment(*batch)

    __call__ = step

    @property
    def loss(self) -> torch.Tensor:
        return self.fragment.outputs

    def nodes(self) -> dict[str, int]:
        return self.fragment.nodes()

    def write_picture(self, path) -> list:
        """The step's graph as Graphviz DOT (and PNG where Graphviz is installed); see
        ``Fragment.write_picture``."""
        return self.fragment.write_picture(path)

    def memory(self) -> dict[str, int]:
        """Bytes of the step's own graph pool: ``reserved`` (its segments) and ``allocated``
        (what live tensors, the graph's outputs and gradients among them, hold of it)."""
        reserved = allocated = 0
        if self.pool is not None:
            for seg in torch.cuda.memory_snapshot():
                if tuple(seg.get("segment_pool_id", ())) == tuple(self.pool):
                    reserved += seg["total_size"]
                    allocated += seg["allocated_size"]
        return {"reserved": reserved, "allocated": allocated}

    def release(self) -> None:
        self.fragment.release()
        if self.reducer is not None:
            self.reducer.remove()


def graph_step(model: torch.nn.Module, loss_fn: Callable, sample_batch, optimizer=None, *,
               warmup: int = 3, runtime: Runtime | None = None, process_group=None,
               bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> StepGraph:
    """Capture one training step of ``model`` as a CUDA graph.

    ``sample_batch`` is a tuple ``(*inputs, target)``: the step computes
    ``loss = loss_fn(model(*inputs), target)``, ``loss.backward()`` and, with an optimizer (built
    with ``capturable=True``), ``optimizer.step()``. The batch tensors become the static inputs.
    Warm-up runs are undone: parameters and optimizer state are as they were before the call.
    Whatever ``torch.cuda.graph`` can capture is captured (Hugging Face models included: their
    host syncs are skipped while a stream captures). A failed capture raises ``CaptureError``
    naming the line at fault and leaves parameters and optimizer state as they were, gradients
    cleared: an eager step or another capture works afterwards.

    Data parallel (one process per GPU, e.g. under torchrun, NCCL): with ``process_group`` (such
    as ``torch.distributed.group.WORLD``) the gradients are averaged over the group inside the
    graph, in buckets of ``bucket_bytes`` reduced on a side stream as the backward produces them,
    before the optimizer step, as DistributedDataParallel would. Every rank must capture the same
    model with the same batch shapes; initialize the group with ``data_parallel.NCCL_ENV`` set.
    The reduction hooks stay on the parameters (an eager backward would reduce too) until
    ``step.release()``.

    >>> step = graphrt.capture.graph_step(model, F.mse_loss, (x, y), opt)   # doctest: +SKIP
    >>> for x, y in loader:
    ...     loss = step(x, y)                # grads in p.grad, weights updated by opt
    """
    batch = tuple(sample_batch)
    if len(batch) < 2:
        raise ContractError("sample_batch: expected a tuple (*inputs, target)")
    _check_optimizer(optimizer)
    reducer = None if process_group is None else GradientReducer(
        list(model.parameters()), process_group, bucket_bytes)

    def train_step(*b):
        loss = loss_fn(model(*b[:-1]), b[-1])
        loss.backward()
        if reducer is not None:
            reducer.finish()
        if optimizer is not None:
            optimizer.step()
        return loss.detach()

    def clear_grads():
        model.zero_grad(set_to_none=True)
        if reducer is not None:
            reducer.reset()

    state = _TrainingState(model, optimizer)
    # a pool of the step's own: the warm-ups allocate in it and the capture reuses that memory
    pool = torch.cuda.graph_pool_handle() if torch.cuda.is_available() else None
    try:
        frag = capture(train_step, *batch, warmup=warmup, runtime=runtime, reset=clear_grads,
                       after_warmup=state.restore, pool=pool)
    except BaseException:
        # the model and optimizer go back to where they were, with no gradients (a failed
        # capture may have left .grad tensors that no kernel ever wrote)
        clear_grads()
        state.restore()
        if reducer is not None:
            reducer.remove()
        raise
    return StepGraph(frag, model, reducer, pool)
