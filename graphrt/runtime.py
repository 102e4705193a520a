"""Runtime: one PlanStore, one WorkspaceArena and one StreamTracker per device."""
from __future__ import annotations

import threading
import warnings

import torch

from .arena import WorkspaceArena
from .errors import ContractError, UnsupportedError
from .plan import Plan, PlanStore
from .result import Result
from .rng import RngState
from .streams import StreamTracker, resolve_stream

DEFAULT_ARENA_BYTES = {"cuda": 256 << 20, "cpu": 16 << 20}
DEFAULT_PLAN_CACHE_SIZE = 256


def _as_device(device) -> torch.device:
    if device is None:
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ContractError(f"device: expected a torch.device or a string such as 'cuda:0', got "
                            f"{device!r}") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UnsupportedError(f"device: {device} asked for, but torch sees no CUDA device here "
                               f"(use 'cpu': the reference kernels run there)")
    if device.type not in ("cuda", "cpu"):
        raise UnsupportedError(f"device: graphrt runs on cuda and cpu devices, got {device}")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


class Runtime:
    """Owns the plan store, the workspace arena and the stream tracker of one device.

    >>> rt = graphrt.Runtime("cuda:0", arena_bytes=64 << 20, plan_cache_size=128)  # doctest: +SKIP
    >>> y, rstd = rt.run(RmsNormForward, (x, w), {"eps": 1e-6})                 # doctest: +SKIP
    """

    def __init__(self, device=None, arena_bytes: int | None = None,
                 plan_cache_size: int = DEFAULT_PLAN_CACHE_SIZE):
        self.device = _as_device(device)
        if arena_bytes is None:
            arena_bytes = DEFAULT_ARENA_BYTES.get(self.device.type, 16 << 20)
        self.plans = PlanStore(plan_cache_size)
        self.arena = WorkspaceArena(arena_bytes, self.device)
        self.streams = StreamTracker()
        self._rng: RngState | None = None
        self._graph_pool = None
        self._lazy_lock = threading.Lock()   # threads may make the first call together

    @property
    def rng(self) -> RngState:
        """The device-side (seed, offset) state that graphrt's random ops read."""
        if self._rng is None:
            with self._lazy_lock:
                if self._rng is None:
                    self._rng = RngState(self.device)
        return self._rng

    def graph_pool(self):
        """The memory pool shared by every CUDA graph captured on this runtime.

        PyTorch frees a graph pool when the last graph using it goes, and a stale handle then
        breaks the next capture; an empty anchor graph keeps the pool for the runtime's life."""
        if self.device.type != "cuda":
            raise UnsupportedError(f"graph_pool: CUDA graphs need a CUDA device; this runtime is "
                                   f"on {self.device}")
        with self._lazy_lock:
            if self._graph_pool is None:
                self._make_graph_pool()
        return self._graph_pool

    def _make_graph_pool(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        anchor = torch.cuda.CUDAGraph(keep_graph=True)
        stream = torch.cuda.Stream(device=self.device)
        with warnings.catch_warnings(), torch.cuda.stream(stream):
            warnings.simplefilter("ignore")  # "the captured graph is empty" is the point
            anchor.capture_begin(pool=pool)
            anchor.capture_end()
        self._graph_pool, self._pool_anchor = pool, anchor

    def plan(self, plan_cls: type[Plan], *args, **kwargs) -> Plan:
        """The compiled plan for these arguments, from this runtime's store."""
        return self.plans.get(plan_cls, *args, **kwargs)

    def run(self, plan_cls: type[Plan], args: tuple, kwargs: dict, stream=None) -> Result:
        """What every functional call does: plan from the store, outputs allocated where not
        given, scratch from the arena, execute on ``stream``, outputs as a Result."""
        plan = self.plans.get(plan_cls, *args, **kwargs)
        launch_stream = resolve_stream(stream, self.device)
        allocated = plan.allocate_outputs(*args, **kwargs)
        if allocated and stream is not None and launch_stream is not None:
            # made on the current stream and used on another one
            for t in allocated.values():
                self.streams.keep_alive(t, launch_stream)
        kwargs = {**kwargs, **allocated}
        accepted = plan.execute_keywords
        tensors = {k: v for k, v in kwargs.items() if k in accepted}
        nbytes = plan.workspace_bytes()
        if nbytes:
            with self.arena.scope():
                workspace = self.arena.take(nbytes, launch_stream)
                plan.execute(*args, **tensors, workspace=workspace, stream=launch_stream)
        else:
            plan.execute(*args, **tensors, workspace=None, stream=launch_stream)
        return Result(plan.output_names, [kwargs[n] for n in plan.output_names])

    def stats(self) -> dict:
        return {"device": str(self.device), "plans": self.plans.stats(), "arena": self.arena.stats()}

    def __repr__(self) -> str:
        return f"Runtime({self.device})"


_default_runtimes: dict[torch.device, Runtime] = {}
_default_lock = threading.Lock()


def runtime_for(name: str, t, rt: Runtime | None = None) -> Runtime:
    """``rt``, else the default runtime of tensor argument ``name``'s device; a tensor that is
    not one, or lives on a device graphrt does not run on, is named in the error."""
    if rt is not None:
        return rt
    if not isinstance(t, torch.Tensor):
        raise ContractError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type not in ("cuda", "cpu"):
        raise ContractError(f"{name}: graphrt runs on cuda and cpu tensors, got one on {t.device}"
                            + (" (meta tensors have no data)" if t.device.type == "meta" else ""))
    return runtime(t.device)


def runtime(device=None) -> Runtime:
    """The default Runtime of ``device`` (None: the current CUDA device, else the CPU)."""
    rt = _default_runtimes.get(device)  # a tensor's device (with its index) needs no resolving
    if rt is not None:
        return rt
    device = _as_device(device)
    rt = _default_runtimes.get(device)
    if rt is None:
        with _default_lock:
            rt = _default_runtimes.get(device)
            if rt is None:
                rt = _default_runtimes[device] = Runtime(device)
    return rt
