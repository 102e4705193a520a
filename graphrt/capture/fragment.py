"""capture(): one CUDA graph from a function of tensors, replayed with fresh inputs."""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Callable

import torch

from ..errors import ArenaExhausted, CaptureError, ContractError, UnsupportedError
from ..runtime import Runtime
from ..runtime import runtime as default_runtime
from ..streams import current_stream, join_open_branches
from ..validate import dtype_name
from . import failure
from .inspect import graph_dot, graph_shape, node_counts, write_picture
from .tree import flatten, unflatten

def _device_of(args) -> torch.device:
    for a in flatten(args)[0]:
        if isinstance(a, torch.Tensor):
            return a.device
    raise ContractError("sample_args: expected at least one tensor to capture with")


def _warm_up(fn, args, warmup: int, reset: Callable[[], None] | None, rt: Runtime,
             stream) -> None:
    """Eager runs on the capture's stream: plans compile and lazy initialization happens outside
    the capture. They run as the user's code runs eagerly (host syncs allowed: code that skips
    its syncs while a stream is capturing, as Hugging Face's mask preparation does, must not be
    rejected here); syncs that would reach the graph are caught in the capture itself."""
    stream.wait_stream(torch.cuda.current_stream(rt.device))
    rng_before = rt.rng.snapshot()
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            if reset is not None:
                reset()
            fn(*args)
    torch.cuda.current_stream(rt.device).wait_stream(stream)
    rt.rng.restore(rng_before)  # warm-ups must not consume the caller's random stream


def _route_stream_to_pool(device: torch.device, stream, pool) -> bool:
    """Send ``stream``'s allocations (from any thread: autograd's backward thread too) to
    ``pool``, holding a reference on the pool until ``_release_pool``; False where this torch
    lacks the hook."""
    begin = getattr(torch._C, "_cuda_beginAllocateCurrentStreamToPool", None)
    if begin is None or getattr(torch._C, "_cuda_releasePool", None) is None:
        return False
    with torch.cuda.stream(stream):
        begin(device.index, pool)
    return True


def _release_pool(device: torch.device, pool) -> None:
    torch._C._cuda_releasePool(device.index, pool)


def _end_allocation_to_pool(device: torch.device, pool) -> None:
    """After a failed capture_end, make sure the caching allocator stops routing this device's
    allocations into the graph pool (no dangling capture state)."""
    end = getattr(torch._C, "_cuda_endAllocateToPool", None)
    if end is not None:
        with contextlib.suppress(Exception):
            end(device.index, pool)


def _capture_graph(fn, args, rt: Runtime, stream, pool, keep_graph: bool = True):
    """Capture ``fn(*args)`` on ``stream`` into a CUDA graph drawing on ``pool`` and an arena
    hold.

    While capturing, host synchronizations raise at the Python line that asks for them (CUDA's
    sync-debug mode), before they can invalidate the capture, so the error names that line."""
    graph = torch.cuda.CUDAGraph(keep_graph=keep_graph)
    stream.wait_stream(torch.cuda.current_stream(rt.device))
    reserved_before = torch.cuda.memory_reserved(rt.device)
    error = None
    outputs = None
    with rt.arena.hold() as hold, torch.cuda.stream(stream):
        graph.capture_begin(pool=pool)
        sync_mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode("error")
        try:
            outputs = fn(*args)
        except BaseException as err:  # noqa: BLE001 - re-raised below with context
            error = err
        finally:
            torch.cuda.set_sync_debug_mode(sync_mode)
        join_open_branches()  # a side stream left unjoined would invalidate the capture
        try:
            graph.capture_end()
        except RuntimeError as end_err:
            _end_allocation_to_pool(rt.device, pool)
            _reset_generator_capture_state(rt.device)
            error = error or end_err
    torch.cuda.current_stream(rt.device).wait_stream(stream)
    if error is not None:
        hold.release()
        with contextlib.suppress(Exception):
            graph.reset()
        del graph
        raise _capture_failure(error)
    graph.instantiate()
    held = torch.cuda.memory_reserved(rt.device) - reserved_before
    return graph, outputs, hold, max(0, held)


def _reset_generator_capture_state(device: torch.device) -> None:
    """A capture that CUDA invalidated ends before torch closes its random generator's capture
    bookkeeping, and every later random op on the device then fails ("Offset increment outside
    graph capture"). A copy of the generator's state (same seed and offset, not capturing) put in
    its place lets eager code and later captures go on where the random stream was."""
    gen = torch.cuda.default_generators[device.index]
    if hasattr(gen, "clone_state") and hasattr(gen, "graphsafe_set_state"):
        with contextlib.suppress(Exception):
            gen.graphsafe_set_state(gen.clone_state())


def _distinct_static_inputs(args: tuple) -> tuple:
    """``args`` with every tensor that shares memory with an earlier one replaced by a copy:
    each becomes its own static input (two arguments aliasing one buffer would otherwise both
    receive whatever was loaded last)."""
    leaves, spec = flatten(args)
    leaves = list(leaves)
    seen: list[tuple[int, int]] = []
    changed = False
    for i, t in enumerate(leaves):
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        span = (storage.data_ptr(), storage.data_ptr() + storage.nbytes())
        if any(lo < span[1] and span[0] < hi for lo, hi in seen):
            leaves[i] = t.clone()
            changed = True
        else:
            seen.append(span)
    return unflatten(leaves, spec) if changed else args


def _capture_failure(error: BaseException) -> BaseException:
    """The exception to raise for a failed capture: CaptureError naming the user's line for
    what a graph cannot hold, the original error otherwise."""
    if isinstance(error, ArenaExhausted):
        return ArenaExhausted(f"during capture: {error}").with_traceback(error.__traceback__)
    kind = failure.classify(error)
    if kind is None:
        return error
    what = ("the captured function synchronizes with the host" if kind == "sync" else
            "the captured function did something a CUDA graph cannot hold")
    wrapped = CaptureError(f"{what}{failure.where(error)} ({error}). {failure.advice(error)}")
    wrapped.__cause__ = error
    return wrapped


def _release_hold(hold, last_stream: list) -> None:
    hold.release(last_stream[0], from_finalizer=True)


class Fragment:
    """A captured CUDA graph with static inputs and outputs.

    ``fragment(*args)`` copies each tensor arg into its static input (skipped when it is that
    tensor), replays, and returns the static outputs, which the next replay overwrites
    (``clone=True`` returns copies). Fragments of one runtime share a memory pool: replay them in
    the order they were captured (forward, then backward) and each sees what the earlier ones wrote.
    """

    def __init__(self, graph, inputs: tuple, outputs: Any, hold, runtime: Runtime,
                 memory_bytes: int):
        self._graph = graph
        self._inputs = inputs
        self._in_leaves, _ = flatten(inputs)
        self._outputs = outputs
        self._out_leaves, self._out_spec = flatten(outputs)
        self._hold = hold
        self._last_stream = [None]   # where the latest replay ran
        # a fragment nobody holds can never replay: its arena regions go back with it
        self._give_back = weakref.finalize(self, _release_hold, hold, self._last_stream)
        self.runtime = runtime
        self.memory_bytes = memory_bytes
        self.workspace_bytes = hold.nbytes
        self.replays = 0

    # -- use -----------------------------------------------------------------------------------
    @property
    def inputs(self) -> tuple:
        self._require_live()
        return self._inputs

    @property
    def outputs(self) -> Any:
        self._require_live()
        return self._outputs

    def __call__(self, *args, clone: bool = False):
        self._require_live()
        self.load(*args)
        self.replay()
        if clone:
            return unflatten([t.clone() if isinstance(t, torch.Tensor) else t
                              for t in self._out_leaves], self._out_spec)
        return self._outputs

    def load(self, *args) -> None:
        """Copy ``args`` into the static inputs (checked against what was captured)."""
        self._require_live()
        leaves, _ = flatten(args)
        if len(leaves) != len(self._in_leaves):
            raise ContractError(f"args: the fragment was captured with {len(self._in_leaves)} "
                                f"inputs, got {len(leaves)}")
        for i, (new, static) in enumerate(zip(leaves, self._in_leaves)):
            if isinstance(static, torch.Tensor):
                if new is static:
                    continue
                if not isinstance(new, torch.Tensor):
                    raise ContractError(f"args[{i}]: expected a tensor, got {type(new).__name__}")
                if (new.shape != static.shape or new.dtype != static.dtype
                        or new.device != static.device):
                    raise ContractError(
                        f"args[{i}]: the fragment was captured with {tuple(static.shape)} "
                        f"{dtype_name(static.dtype)} on {static.device}, got {tuple(new.shape)} "
                        f"{dtype_name(new.dtype)} on {new.device}")
            elif new != static:
                raise ContractError(f"args[{i}]: the fragment was captured with {static!r}, "
                                    f"got {new!r} (non-tensor arguments are fixed at capture)")
        for new, static in zip(leaves, self._in_leaves):
            if isinstance(static, torch.Tensor) and new is not static:
                static.copy_(new)

    def replay(self) -> None:
        """Replay on the current stream with whatever the static inputs hold."""
        self._require_live()
        self._graph.replay()
        if self.runtime.device.type == "cuda":
            self._last_stream[0] = current_stream(self.runtime.device)
        self.replays += 1

    # -- inspection ----------------------------------------------------------------------------
    def nodes(self) -> dict[str, int]:
        """The graph's nodes by kind: kernel, memcpy, memset, alloc, other (and total)."""
        self._require_live()
        return node_counts(self._graph.raw_cuda_graph())

    def shape(self) -> dict[str, int]:
        """Depth of the graph and the most kernels that can run at once (a parallel branch
        shows as max_parallel_kernels >= 2)."""
        self._require_live()
        return graph_shape(self._graph.raw_cuda_graph())

    def write_picture(self, path) -> list:
        """The captured graph as Graphviz DOT at ``path`` (.dot), and a PNG beside it where
        Graphviz is installed: one box per node by kind, its dependency edges (a parallel branch
        shows as boxes side by side). Returns the paths written."""
        self._require_live()
        return write_picture(graph_dot(self._graph.raw_cuda_graph(), "fragment"), path)

    def release(self) -> None:
        """Free the graph and its arena regions; later use raises CaptureError."""
        if self._graph is None:
            return
        self._graph.reset()
        self._graph = None
        self._give_back()
        self._inputs = self._outputs = None
        self._in_leaves = self._out_leaves = []

    @property
    def released(self) -> bool:
        return self._graph is None

    def _require_live(self) -> None:
        if self._graph is None:
            raise CaptureError("this fragment was released; capture the function again")

    def __repr__(self) -> str:
        state = "released" if self._graph is None else f"{self.replays} replays"
        return f"Fragment({state}, memory={self.memory_bytes}, workspace={self.workspace_bytes})"


def check_capturable(device: torch.device) -> None:
    if device.type != "cuda" or not torch.cuda.is_available():
        raise UnsupportedError(f"sample_args: CUDA graphs need tensors on a CUDA device, got "
                               f"{device}; run the function eagerly instead")


def capture(fn: Callable, *sample_args, warmup: int = 3, runtime: Runtime | None = None,
            reset: Callable[[], None] | None = None,
            after_warmup: Callable[[], None] | None = None, pool=None) -> Fragment:
    """Capture ``fn(*sample_args)`` as one CUDA graph; ``sample_args`` become the static inputs.

    Warm-up runs (``warmup`` of them, eager, on the capture's stream) compile plans and finish
    lazy initialization first; ``reset`` runs before each of them and before the capture,
    ``after_warmup`` once after them (to undo their side effects). Whatever ``torch.cuda.graph``
    can capture is captured: code that behaves differently while a stream is capturing is judged
    by what it does under capture. A failed capture raises :class:`CaptureError` naming the line
    that did what a graph cannot hold, and leaves the runtime usable. Workspaces that plans take
    from the runtime's arena during the capture stay reserved for the fragment's lifetime, so
    replays see stable addresses.

    A tensor passed twice (or sharing memory with another argument) becomes a static input of
    its own, filled with a copy. The graph's memory comes from the pool its runtime's fragments
    share (replay them in capture order), or from ``pool`` (a ``torch.cuda.graph_pool_handle()``
    of the fragment's own): then the warm-ups allocate from it too, and the capture reuses their
    memory.

    >>> frag = graphrt.capture.capture(step, x, w)           # doctest: +SKIP
    >>> y = frag(new_x, w)                                   # copies new_x in, replays
    """
    device = _device_of(sample_args)
    check_capturable(device)
    if int(warmup) < 1:
        raise ContractError(f"warmup: expected at least 1 warm-up run, got {warmup}")
    rt = runtime or default_runtime(device)
    sample_args = _distinct_static_inputs(sample_args)
    own_pool = pool is not None
    pool = pool if own_pool else rt.graph_pool()
    stream = torch.cuda.Stream(device=rt.device)
    # a fragment of its own pool warms up inside it, so the capture reuses the warm-ups' memory;
    # in the shared pool, a warm-up's tensors that outlive it could sit in memory that earlier
    # fragments' replays overwrite
    routed = own_pool and _route_stream_to_pool(rt.device, stream, pool)
    try:
        try:
            _warm_up(fn, sample_args, int(warmup), reset, rt, stream)
        finally:
            if routed:
                _end_allocation_to_pool(rt.device, pool)
        if after_warmup is not None:
            after_warmup()
        if reset is not None:
            reset()
        graph, outputs, hold, held = _capture_graph(fn, sample_args, rt, stream, pool)
    finally:
        if routed:   # the graph holds the pool from here on
            _release_pool(rt.device, pool)
    return Fragment(graph, sample_args, outputs, hold, rt, held)
