"""Runtime: one PlanStore, one WorkspaceArena and one StreamTracker per device."""
from __future__ import annotations

import os
import threading
import warnings
import weakref

import torch

from .arena import WorkspaceArena
from .errors import ContractError, UnsupportedError
from . import binding
from .plan import Plan, PlanStore, env_backend
from .result import Result, result_maker
from .rng import RngState
from .streams import StreamTracker, current_stream, resolve_stream

DEFAULT_ARENA_BYTES = {"cuda": 256 << 20, "cpu": 16 << 20}
DEFAULT_PLAN_CACHE_SIZE = 256
BOUND_CALLS = 256
RECENT_PLANS = 4   # per plan class: plans asked to serve calls that have no binding key
COUNTERS = object()   # a bound call's source of the counters its workspace region owns
_GENERATING = threading.Lock()   # one thread makes a bound call's function (and keeps its region)


def _keeps_workspace() -> bool:
    """Whether bound calls keep their workspace region (``_BoundCall``): yes unless
    GRAPHRT_KEEP_WORKSPACE=0, which lends them one around every call instead."""
    return os.environ.get("GRAPHRT_KEEP_WORKSPACE") != "0"


def _call_key(plan_cls, args: tuple, kwargs: dict):
    """(key, the tensor arguments' addresses, the run-time ints, the tensors' positions) of a
    functional call: the key holds what its plan, outputs and launches depend on, addresses and
    run-time ints aside, and ends with the call's ``binding_key``; None when it cannot be bound
    (see graphrt.binding)."""
    bound = binding.binding_key(args, kwargs, plan_cls.run_time_ints)
    if bound is None:
        return None
    return (plan_cls, env_backend(), bound[0]), bound[2], bound[3], bound[1]


class _BoundCall:
    """A functional call of a kind served before: its plan and the binding its execute
    replays. The binding takes its addresses from a pool: the call's own tensor arguments (in
    the call key's order), then the outputs it allocates, then the workspace; ``slots`` says
    which pool entry each of the binding's addresses is. ``allocations`` are the (shape,
    strides, dtype, device) of the outputs the call allocates and ``low_bits`` their address
    bits when the binding was recorded (a fresh output at other ones takes the full path); the
    key fixes them, the workspace size and the output names, so they are found without the spec
    or the plan. ``given``: the caller passed some outputs, which may overlap the inputs, so the
    binding's overlap check runs (allocated ones cannot overlap anything). Its workspace is a
    region the call keeps from its first call on (``WorkspaceArena.keep``; given back when the
    call is dropped), lent around each call's launches instead where the arena keeps none, a
    capture is under way, the arena took the region back for a take that needed the room, or
    GRAPHRT_KEEP_WORKSPACE=0."""

    __slots__ = ("plan", "binding", "slots", "low_bits", "version", "allocations", "given",
                 "nbytes", "results", "make_result", "check_bindable", "backend", "matcher",
                 "stream", "n_inputs", "_run", "served", "_kept", "_matchers", "__weakref__")

    def __init__(self, plan, found, sources, version, allocated, given, n_inputs: int):
        self.plan, self.binding, self.version, self.given = plan, found, version, given
        made = list(allocated)
        self.allocations = tuple((tuple(t.shape), t.stride(), t.dtype, t.device)
                                 for t in allocated.values())
        self.low_bits = tuple(t.data_ptr() & 255 for t in allocated.values())
        self.n_inputs = n_inputs
        self.slots = tuple(s if type(s) is int else
                           n_inputs + len(made) + 1 if s is COUNTERS else
                           n_inputs + made.index(s) if s is not None else n_inputs + len(made)
                           for s in sources)
        self.nbytes = plan.workspace_bytes()
        # per output: its index among the allocated ones, or -1: the caller passed it
        self.results = tuple((n, made.index(n) if n in allocated else -1)
                             for n in plan.output_names)
        self.make_result = result_maker(plan.output_names)
        self.check_bindable = type(plan).bindable is not Plan.bindable
        self.backend = None   # GRAPHRT_BACKEND as the call's key read it
        self.matcher: binding.CallMatcher | None = None   # calls of its kind, without their key
        self.stream = None   # the current stream its calls run on: the key and matcher fix it
        self._run = None   # the generated function (``_generated``), made at the first call
        self.served = None   # ``serve_as``'s function, made at the first functional call
        self._kept = _NOT_YET   # ``_kept_region``'s, once
        self._matchers: list = []   # [matcher, its served function or None]: ``rematch``'s

    def __call__(self, rt: "Runtime", args: tuple, kwargs: dict, inputs: list,
                 ints: list) -> Result | None:
        """The call's outputs, or None (nothing launched) where it must take the full path: a
        fresh output at other address bits than the recorded ones, or a plan that is not
        bindable now."""
        run = self._run
        if run is None:
            with _GENERATING:
                if self._run is None:
                    self._run = self._generated(
                        rt, "def run(rt, kwargs, inputs, ints):", [],
                        lambda k: f"inputs[{k}]", lambda name: f"kwargs[{name!r}]", "ints")
                run = self._run
        return run(rt, kwargs, inputs, ints)

    def rematch(self, args: tuple, kwargs: dict, key: tuple, positions: list) -> None:
        """Makes ``matcher`` (and ``served``) one that serves calls like this one, which the
        current one refused though its key is this call's (``binding.matcher_for``: a
        module's training calls after an evaluation under no_grad)."""
        with _GENERATING:
            entry = binding.matcher_for(self._matchers, self.matcher, self.served, args,
                                        kwargs, key, positions)
            if entry is not None:
                self.matcher, self.served = entry

    def serve_as(self, rt: "Runtime", names: tuple):
        """``served``, made for a functional call whose values are ``names`` (its inputs, then
        the keywords it passes to ``Runtime.run``, in order): one function of ``rt`` and those
        values that tests them as the matcher does and makes the call, with no argument
        tuple, keyword dict or matcher in between; None where it must take another path (a
        call of another kind, a store that dropped the plan, another GRAPHRT_BACKEND). One
        made for other names (the call was recorded through ``Runtime.run`` with other
        keywords) serves nothing."""
        with _GENERATING:
            if self.served is None:
                matcher = self.matcher
                if (matcher.n_args + len(matcher.names), matcher.names) != (
                        len(names), names[matcher.n_args:]):
                    self.served = _serves_nothing
                else:
                    values = [f"v{i}" for i in range(len(names))]   # no name can clash
                    self.served = self._generated(
                        rt, f"def served(rt, {', '.join(values)}):", values, lambda k: f"i{k}",
                        lambda name: values[names.index(name)], matcher.ints(values.__getitem__))
                for kept in self._matchers:   # kept for when ``rematch`` switches back to it
                    if kept[0] is matcher:
                        kept[1] = self.served
            return self.served

    def _generated(self, rt: "Runtime", header: str, names: tuple, address, given, ints: str):
        """``__call__``'s work (with ``names``: ``served``'s, the matcher's tests first) as
        one function with this call's values written in: the outputs made one by one, their
        address bits tested, the binding's addresses listed in its order, the workspace kept
        (or lent around the launches): no loop over the allocations, an address pool or the
        results. ``address(k)``: the code of the call's k-th tensor's address; ``given(n)``:
        of the output ``n`` the caller passed; ``ints``: of the run-time ints' list."""
        namespace = {"torch": torch, "_make": self.make_result, "_plan": self.plan,
                     "_stream": self.stream, "_env_backend": env_backend,
                     "_launch": self.binding.replay if self.given else self.binding.launch}
        lines = [header]
        if names:
            namespace["_backend"] = self.backend
            lines += [f"    if rt.plans.version != {self.version} or "
                      "_env_backend() != _backend:", "        return None",
                      *self.matcher.tests(names.__getitem__, namespace)]
        if self.check_bindable:
            lines += ["    if not _plan.bindable():", "        return None"]
        for k, (shape, strides, dtype, device) in enumerate(self.allocations):
            namespace[f"_shape{k}"], namespace[f"_dtype{k}"] = shape, dtype
            namespace[f"_strides{k}"], namespace[f"_device{k}"] = strides, device
            lines += [f"    o{k} = torch.empty_strided(_shape{k}, _strides{k}, dtype=_dtype{k}, "
                      f"device=_device{k})", f"    a{k} = o{k}.data_ptr()"]
        if self.allocations:   # nothing launched yet
            low = " or ".join(f"a{k} & 255 != {b}" for k, b in enumerate(self.low_bits))
            lines += [f"    if {low}:", "        return None"]
        made = len(self.allocations)

        def pool(slot: int) -> str:
            if slot < self.n_inputs:
                return address(slot)
            if slot < self.n_inputs + made:
                return f"a{slot - self.n_inputs}"
            return "w" if slot == self.n_inputs + made else "c"
        addresses = f"[{', '.join(pool(slot) for slot in self.slots)}]"
        if self.nbytes:   # arena regions start on 256-byte boundaries, as the recorded one did
            counted = self.n_inputs + made + 1 in self.slots   # the region's zeroed counters
            lent = [f"    w, region = rt.arena.lend({int(self.nbytes)}, _stream)",
                    *(["    c = rt.arena.counter_address(w)"] if counted else []),
                    "    try:", f"        _launch({addresses}, {ints})", "    finally:",
                    "        rt.arena.give_back(region)"]
            kept = self._kept_region(rt, counted)
            if kept is None:
                lines += lent
            else:   # a capture lends: its graph must own the region it replays with
                region, address_w, address_c = kept
                namespace["_holding"] = rt.arena.holding
                namespace["_kept"], namespace["_users"] = region, region.users
                namespace["_w"], namespace["_c"] = address_w, address_c
                # a user while it launches (``WorkspaceArena.keep``): lent where the arena
                # took the region back
                lines += ["    _users.append(None)", "    try:",
                          "        if _kept.reclaimed or _holding():",
                          *("        " + line for line in lent), "        else:",
                          "            w, c = _w, _c", f"            _launch({addresses}, {ints})",
                          "    finally:", "        _users.pop()"]
        else:
            lines.append(f"    _launch({addresses}, {ints})")
        results = ", ".join(f"o{i}" if i >= 0 else given(n) for n, i in self.results)
        lines += ["    rt.plans.count_hit()", f"    return _make(({results},))" if results else
                  "    return _make(())"]
        exec("\n".join(lines), namespace)
        return namespace[header[4:header.index("(")]]

    def _kept_region(self, rt: "Runtime", counted: bool) -> tuple | None:
        """(region, its address, its counters' address or None) that this call keeps, taken
        once for both of its functions; None where calls lend instead."""
        if self._kept is _NOT_YET:
            kept = rt.arena.keep(self.nbytes, self.stream) if _keeps_workspace() else None
            if kept is not None:
                address, region = kept
                weakref.finalize(self, rt.arena.give_back_soon, region)
                kept = (region, address, rt.arena.counter_address(address) if counted else None)
            self._kept = kept
        return self._kept


_NOT_YET = object()


def _serves_nothing(rt, *values) -> None:
    return None


class _ThisThread(threading.local):
    """What a runtime keeps per thread: the bound call that last served each plan class on
    it. Threads usually launch on streams of their own, and a call is served only on its
    recorded stream, so one shared recent call would turn away every other thread's calls."""

    def __init__(self):
        self.recent_calls: dict = {}


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
        self._on_cuda = self.device.type == "cuda"
        if arena_bytes is None:
            arena_bytes = DEFAULT_ARENA_BYTES.get(self.device.type, 16 << 20)
        self.plans = PlanStore(plan_cache_size)
        self.arena = WorkspaceArena(arena_bytes, self.device)
        self.streams = StreamTracker()
        self._rng: RngState | None = None
        self._graph_pool = None
        self._bound_calls: dict = {}
        self._thread = _ThisThread()   # per thread: the bound calls that served it last
        # plan class -> (plan, store version, backend) of its latest plans that serve calls
        # without a binding key (``Plan.serve_recent``), newest first
        self._recent_plans: dict = {}
        self._lazy_lock = threading.Lock()   # threads may make the first call together

    @property
    def _recent_calls(self) -> dict:
        """This thread's recent bound calls by plan class (``_ThisThread``)."""
        return self._thread.recent_calls

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
        given, scratch from the arena, execute on ``stream``, outputs as a Result.

        A call on the current stream of a kind seen before (see ``_BoundCall``) skips the
        plan lookup and the checks, but the overlap check of outputs the caller passed; one of
        the kind last served on this thread skips building its key too
        (``binding.CallMatcher``; the functional calls hand it their values directly,
        ``_BoundCall.serve_as``). Calls whose
        arguments have no binding key (lists of tensors) are served likewise by the last few
        plans of their class (``Plan.serve_recent``)."""
        if stream is None and plan_cls.serves_recent_calls and self._on_cuda:
            recent = self._recent_plans.get(plan_cls)
            if recent is not None:
                version, backend = self.plans.version, env_backend()
                for plan, plan_version, plan_backend in recent:
                    if plan_version == version and plan_backend == backend:
                        result = plan.serve_recent(args, kwargs)
                        if result is not None:
                            self.plans.count_hit()
                            return result
        elif stream is None and plan_cls.records_launches and self._on_cuda:
            call = self._thread.recent_calls.get(plan_cls)
            if call is not None and call.version == self.plans.version \
                    and call.backend == env_backend():
                hit = call.matcher.match(args, kwargs)
                if hit is not None:
                    result = call(self, args, kwargs, *hit)
                    if result is not None:
                        return result
            return self._keyed_run(plan_cls, args, kwargs)
        return self._run(plan_cls, args, kwargs, stream, None)

    def _keyed_run(self, plan_cls, args: tuple, kwargs: dict) -> Result:
        """``run`` on the current stream (CUDA, a plan that records launches) past the
        matcher of its class's recent call: the bound call of the call's key, else the full
        path (which binds it)."""
        key = ints = positions = None
        keyed = _call_key(plan_cls, args, kwargs)
        if keyed is not None:
            key, inputs, ints, positions = keyed
            call = self._bound_calls.get(key)
            if call is not None and call.version == self.plans.version:
                result = call(self, args, kwargs, inputs, ints)
                if result is not None:
                    if call is self._thread.recent_calls.get(plan_cls):   # its matcher refused it
                        call.rematch(args, kwargs, key[2], positions)
                    elif call.matcher is not None:
                        self._thread.recent_calls[plan_cls] = call
                    return result
        return self._run(plan_cls, args, kwargs, None, key, ints, positions)

    def _run(self, plan_cls, args, kwargs, stream, call_key, ints=None,
             positions=None) -> Result:
        plan = self.plans.get(plan_cls, *args, **kwargs)
        allocated = plan.allocate_outputs(*args, **kwargs)
        nbytes = plan.workspace_bytes()
        # None (the current stream) goes to execute as None; the arena and keep-alives need
        # the stream itself
        launch_stream = (resolve_stream(stream, self.device)
                         if stream is not None or nbytes else None)
        if allocated and stream is not None and launch_stream is not None:
            # made on the current stream and used on another one
            for t in allocated.values():
                self.streams.keep_alive(t, launch_stream)
        merged = {**kwargs, **allocated}
        accepted = plan.execute_keywords
        tensors = {k: v for k, v in merged.items() if k in accepted}
        # scratch sized per call, which allocate_outputs made like an output (the arena holds
        # what a plan needs whatever the extents)
        workspace = tensors.pop("workspace", None)
        if nbytes:
            with self.arena.scope():
                workspace = self.arena.take(nbytes, launch_stream)
                words = plan.counter_words()
                counters = self.arena.counters(workspace, words) if words else None
                if counters is not None:
                    tensors["counters"] = counters
                plan.execute(*args, **tensors, workspace=workspace, stream=launch_stream)
        else:
            plan.execute(*args, **tensors, workspace=workspace, stream=launch_stream)
        if call_key is not None:
            self._bind_call(call_key, plan, args, kwargs, allocated, tensors, workspace,
                            launch_stream, ints, positions)
        elif stream is None and plan.serves_recent_calls and self._on_cuda:
            recent = self._recent_plans.get(plan_cls, ())
            if not any(kept is plan for kept, _, _ in recent):   # each plan once, newest first
                self._recent_plans[plan_cls] = ((plan, self.plans.version, env_backend()),
                                                *recent[:RECENT_PLANS - 1])
        return Result(plan.output_names, [merged[n] for n in plan.output_names])

    def _bind_call(self, call_key, plan, args, kwargs, allocated, tensors, workspace,
                   stream, ints, positions) -> None:
        """Remember a functional call whose execute was bound, to serve the next calls of its
        kind (same key: inputs' shapes, strides, dtypes, alignment, configuration, stream;
        the run-time ints it passes to execute are its own, in its order). ``positions``: its
        tensor arguments' positions, as ``_call_key`` found them."""
        if plan._bindings is None or any(o.computed and o.name in allocated
                                         for o in plan.spec.outputs):
            return
        values = (*args, *tensors.values(), workspace)
        bound = binding.binding_key(args, {**tensors, "workspace": workspace, "stream": stream},
                                    plan.run_time_ints)
        found = plan._bindings.recorded.get(bound[0]) if bound is not None else None
        if found is None or bound[3] != ints:
            return
        # which of the call's own tensor arguments (in the call key's order) each one is
        own = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor)]
        names = {id(t): n for n, t in allocated.items()}
        sources = []
        for v in values:
            if not isinstance(v, torch.Tensor):
                continue
            if id(v) in names:
                sources.append(names[id(v)])
            elif v is workspace:
                sources.append(None)
            elif v is tensors.get("counters"):
                sources.append(COUNTERS)
            else:
                index = next((i for i, t in enumerate(own) if t is v), None)
                if index is None:
                    return
                sources.append(index)
        if not all(t.is_contiguous() for t in allocated.values()):
            return   # made otherwise than torch.empty would make them
        if len(self._bound_calls) >= BOUND_CALLS:
            self._bound_calls.clear()
        given = any(tensors.get(n) is not None and n not in allocated
                    for n in (*plan.output_names, *plan.also_written))
        call = _BoundCall(plan, found, tuple(sources), self.plans.version, allocated, given,
                          len(own))
        call.backend = call_key[1]
        call.stream = current_stream(self.device) if self._on_cuda else None
        call.matcher = binding.call_matcher(args, kwargs, call_key[2], positions)
        self._bound_calls[call_key] = call
        if call.matcher is not None:
            self._thread.recent_calls[type(plan)] = call

    def stats(self) -> dict:
        return {"device": str(self.device), "plans": self.plans.stats(), "arena": self.arena.stats()}

    def __repr__(self) -> str:
        return f"Runtime({self.device})"


_default_runtimes: dict[torch.device, Runtime] = {}
_default_lock = threading.Lock()
# the default runtimes of CUDA devices by index: a functional call finds its runtime without
# building a torch.device (0.6 us of every call's host time on a fast CPU)
_cuda_runtimes: dict[int, Runtime] = {}


def runtime_for(name: str, t, rt: Runtime | None = None) -> Runtime:
    """``rt``, else the default runtime of tensor argument ``name``'s device; a tensor that is
    not one, or lives on a device graphrt does not run on, is named in the error."""
    if rt is not None:
        return rt
    if not isinstance(t, torch.Tensor):
        raise ContractError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    cuda = t.is_cuda
    if cuda:
        found = _cuda_runtimes.get(t.get_device())
        if found is not None:
            return found
    if t.device.type not in ("cuda", "cpu"):
        raise ContractError(f"{name}: graphrt runs on cuda and cpu tensors, got one on {t.device}"
                            + (" (meta tensors have no data)" if t.device.type == "meta" else ""))
    found = runtime(t.device)
    if cuda:
        _cuda_runtimes[t.get_device()] = found
    return found


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
