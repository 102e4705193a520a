"""Plans and the plan store.

A plan is checked and compiled once per static :class:`~graphrt.contract.Contract`, then executed
any number of times with no allocation, no host sync and no recompile. Lifecycle::

    plan = RmsNormBackward(g, x, w, rstd)      # built from sample tensors and keywords
    plan.check_support()                       # ContractError / UnsupportedError, nothing launched
    plan.compile()                             # kernels built; no tensor work
    nbytes = plan.workspace_bytes()
    plan.execute(g, x, w, rstd, dx=dx, dw=dw, workspace=ws)   # enqueue only
"""
from __future__ import annotations

import collections
import functools
import importlib
import importlib.util
import inspect
import os
import threading
from functools import lru_cache
from typing import Any, ClassVar

import torch
from cachetools import LRUCache

from . import binding
from .contract import Contract
from .errors import ContractError, UnsupportedError
from .validate import device_capability

BACKENDS = ("reference", "triton")


@lru_cache(maxsize=None)
def _triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def triton_available() -> bool:
    return _triton_available()


_import_failures: dict[str, str] = {}   # Hopper kernel module -> why it did not import


def hopper_module(package: str, module: str, capability):
    """The Hopper-only kernel module ``package.module`` (a plan's own package), or None off
    Hopper or when it does not import (Gluon kernels need a CUDA build of Triton, CuTe DSL ones
    nvidia-cutlass-dsl). A module whose dependencies are installed but fail to import (two
    native libraries that clash, a broken install) warns once, with the error: its op runs a
    slower kernel."""
    if capability is None or capability[0] != 9:
        return None
    try:
        return importlib.import_module(f".{module}", package)
    except ImportError as err:
        name = f"{package}.{module}"
        why = f"{type(err).__name__}: {err}"
        _import_failures[name] = why
        if not _not_installed(err):
            from .notices import warn_once
            warn_once(f"import-{name}", f"graphrt: {name} did not import ({why}); its op runs a "
                      f"slower kernel on this Hopper GPU (`graphrt info` says which)")
        return None


def _not_installed(err: ImportError) -> bool:
    """Whether ``err`` says only that a module is absent (an optional dependency, or a Triton
    without Gluon, which ``kernel_utils`` already tells of): nothing to warn about."""
    if not isinstance(err, ModuleNotFoundError) or not err.name:
        return False
    try:
        return importlib.util.find_spec(err.name) is None
    except (ImportError, ValueError):   # its parent package is absent as well
        return True


def import_failure(package: str, module: str) -> str | None:
    """Why ``hopper_module(package, module, ...)`` found no module, if it tried and failed."""
    return _import_failures.get(f"{package}.{module}")


# os.environ.get encodes the name and, for an unset variable, raises and catches a KeyError on
# every call (2.4 us against 0.13 us on a fast CPU); launch paths read the raw mapping, which
# setenv and os.environ[...] = ... update in place
_ENVIRON_RAW = getattr(os.environ, "_data", None)
_RAW_KEYS_ARE_BYTES = isinstance(_ENVIRON_RAW, dict) and os.name != "nt"
_raw_env_get = _ENVIRON_RAW.get if isinstance(_ENVIRON_RAW, dict) else os.environ.get


def env_reader(name: str):
    """A function that returns environment variable ``name`` as ``os.environ.get`` would,
    read fast (for settings read on every call).

    >>> read = env_reader("GRAPHRT_DOCTEST_UNSET"); read() is None
    True
    """
    key = os.fsencode(name) if _RAW_KEYS_ARE_BYTES else name

    def read() -> str | None:
        value = _raw_env_get(key)
        return os.fsdecode(value) if type(value) is bytes else value
    return read


_backend_variable = env_reader("GRAPHRT_BACKEND")


def env_backend() -> str | None:
    """GRAPHRT_BACKEND, read fast (None when unset or empty)."""
    return _backend_variable() or None


def select_backend(device: torch.device, requested: str | None = None) -> str:
    """The backend for a call: ``requested``, else GRAPHRT_BACKEND, else the device's default."""
    choice = requested or env_backend()
    if choice is not None and choice not in BACKENDS:
        raise UnsupportedError(f"backend: expected one of {BACKENDS}, got {choice!r}")
    if device.type != "cuda":
        if choice == "triton" and os.environ.get("TRITON_INTERPRET") != "1":
            raise UnsupportedError(f"backend: 'triton' needs a CUDA device (or TRITON_INTERPRET=1), "
                                   f"got tensors on {device}")
        return choice or "reference"
    if choice is None:
        return "triton" if _triton_available() else "reference"
    return choice


_facts_cache: dict = {}


def tensor_facts(t: torch.Tensor, requested: str | None = None, name: str = "x"):
    """(device, backend, compute capability, device type) for a call on ``t``'s device; cached
    per device and backend choice, since plan-store hits must stay within a few microseconds
    (``get_device()`` is an int, cheaper than building a torch.device, and ``device.type`` builds
    a new string on every read)."""
    index = t.get_device()
    if index < 0:
        index = "cpu" if t.is_cpu else t.device.type
    key = (index, requested, _backend_variable())
    facts = _facts_cache.get(key)
    if facts is None:
        device = t.device
        if device.type not in ("cuda", "cpu"):
            raise ContractError(f"{name}: graphrt runs on cuda and cpu tensors, got one on "
                                f"{device}" + (" (meta tensors have no data)"
                                               if device.type == "meta" else ""))
        facts = _facts_cache[key] = (device, select_backend(device, requested),
                                     device_capability(device), device.type)
    return facts


class Plan:
    """Base of every op's plan. Subclasses set ``op``, ``output_names`` and implement
    ``check_support``, ``_compile``, ``workspace_bytes`` and ``execute``; the op's
    :class:`~graphrt.opspec.OpSpec` (``spec``) gives ``contract_for``, the constructor's
    arguments and ``allocate_outputs``."""

    op: ClassVar[str] = "plan"
    output_names: ClassVar[tuple[str, ...]] = ()
    execute_keywords: ClassVar[frozenset] = frozenset({"workspace", "stream"})
    # True where every kernel the Triton backend's ``execute`` runs goes through
    # ``kernel_utils.launch``: its launches are then recorded per binding and replayed
    # (see graphrt.binding)
    records_launches: ClassVar[bool] = False
    # True where ``serve_recent`` may serve a functional call (plans whose calls have no
    # binding key: lists of tensors); the runtime then keeps the plan for later calls
    serves_recent_calls: ClassVar[bool] = False
    spec: ClassVar[Any] = None   # set by the op's OpSpec
    # execute's tensor arguments, besides the outputs and the workspace, that it writes (or
    # whose contents say where it writes): bound calls check them for overlap as outputs
    also_written: ClassVar[tuple[str, ...]] = ()
    # keywords whose int values may change between calls that replay one binding (a dropout
    # seed): name -> (the kernel parameters that take the value, the function from the value to
    # theirs). Those parameters must be do_not_specialize, and nothing else execute does may
    # depend on the value but its range (signed 64-bit)
    run_time_ints: ClassVar[dict] = {}

    def counter_words(self) -> int:
        """Zeroed int32 counters that ``execute`` takes as ``counters`` to save a launch (see
        ``WorkspaceArena.counters``; the functional call passes its arena's), 0 for none."""
        return 0

    def serve_recent(self, args: tuple, kwargs: dict):
        """A functional call (``args``, ``kwargs``: what the runtime passes) of a kind this
        plan served recently on the current CUDA stream, served again without the plan store
        or the checks: its ``Result``; None, having launched nothing, for any other call."""
        return None

    @staticmethod
    def bindable() -> bool:
        """Whether this call may replay a binding: always, unless the plan's execute reads a
        setting per call that a replay would skip."""
        return True

    def __init_subclass__(cls, **kwargs):
        """Every subclass's ``execute`` first checks that the plan was compiled, and its
        ``workspace_bytes`` that it was checked: used too early they say so instead of failing
        on attributes that compile sets."""
        super().__init_subclass__(**kwargs)
        if "execute" in cls.__dict__:
            execute = cls.__dict__["execute"]
            # the keywords execute takes (tensors, workspace, stream); the functional call's
            # configuration keywords (eps, output_mode...) belong to the contract, not to it
            cls.execute_keywords = frozenset(
                name for name, p in inspect.signature(execute).parameters.items()
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name != "self")
            cls.execute = _after_compile(execute)
        if "workspace_bytes" in cls.__dict__:
            cls.workspace_bytes = _after_check(cls.__dict__["workspace_bytes"])

    def __init__(self, *args, **kwargs):
        """A plan for a call with these arguments (the op's functional arguments, outputs
        optional, and ``backend``); nothing is checked or compiled yet."""
        self._start(type(self).contract_for(*args, **kwargs))

    def _start(self, contract: Contract) -> None:
        self.contract = contract
        self.backend = contract.backend
        self._checked = False
        self._compiled = False
        self.compile_count = 0
        self._bindings: binding.Bindings | None = None

    # -- the key ------------------------------------------------------------------------------
    @classmethod
    def contract_for(cls, *args, **kwargs) -> Contract:  # pragma: no cover - abstract
        """The static key of a call with these arguments; cheap, and never touches tensor data."""
        raise NotImplementedError

    @classmethod
    def from_contract(cls, contract: Contract) -> "Plan":
        """A plan rebuilt from its key alone: every plan derives all its state from the contract."""
        plan = cls.__new__(cls)
        plan._start(contract)
        return plan

    # -- lifecycle ----------------------------------------------------------------------------
    def check_support(self) -> "Plan":
        self._check_support()
        self._checked = True
        return self

    def _check_support(self) -> None:
        pass

    def compile(self) -> "Plan":
        if not self._checked:
            self.check_support()
        if not self._compiled:
            self._compile()
            if self.records_launches and self.backend == "triton":
                self._bindings = binding.Bindings()
            self._compiled = True
            self.compile_count += 1
        return self

    def _compile(self) -> None:
        pass

    @property
    def compiled(self) -> bool:
        return self._compiled

    def _require_compiled(self) -> None:
        if not self._compiled:
            raise RuntimeError(f"{type(self).__name__}: call compile() before execute()")

    def workspace_bytes(self) -> int:
        return 0

    def execute(self, *args, workspace=None, stream=None) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def allocate_outputs(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """The outputs a call with these arguments leaves out, allocated (as the spec says)."""
        return self.spec.allocate(self.spec.values(args, kwargs))

    def describe(self) -> dict[str, Any]:
        return {"op": self.op, "backend": self.backend, "contract": repr(self.contract),
                "workspace_bytes": self.workspace_bytes() if self._checked else None,
                "compiled": self._compiled}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.contract!r})"


def write_reference(outputs, values) -> None:
    """The reference backend's results copied into the call's outputs (None: not asked for):
    what every plan's ``execute`` does on that backend after its checks."""
    for out, value in zip(outputs, values):
        if out is not None:
            out.copy_(value)


def _after_compile(execute):
    """``execute`` behind the compile check and, for plans that opt in, the binding replay."""
    positional = tuple(name for name, p in inspect.signature(execute).parameters.items()
                       if p.kind is p.POSITIONAL_OR_KEYWORD and name != "self")

    @functools.wraps(execute)
    def checked(self, *args, **kwargs):
        if not self._compiled:
            raise RuntimeError(f"{type(self).__name__}: call compile() first (execute needs the "
                               f"compiled kernels)")
        bindings = self._bindings
        if bindings is None or binding.active_recording() is not None \
                or binding.launch_hooks_active() or not self.bindable():
            return execute(self, *args, **kwargs)
        recent = bindings.recent
        if recent is not None:
            hit = recent.matcher.match(args, kwargs)
            if hit is not None:
                bindings.hits += 1
                recent.replay(*hit)
                return None
        run_time = self.run_time_ints
        bound = binding.binding_key(args, kwargs, run_time)
        if bound is None:
            return execute(self, *args, **kwargs)
        key, positions, addresses, ints = bound
        found = bindings.lookup(key)
        if found is not None:
            if found is recent:   # its matcher refused a call of its own key
                found.rematch(args, kwargs, key, positions)
            found.replay(addresses, ints)
            return None
        bindings.record(key, positions, addresses, execute, self, args, kwargs, positional,
                        (*self.output_names, *self.also_written, "workspace"), run_time, ints)
        return None
    return checked


def _after_check(workspace_bytes):
    @functools.wraps(workspace_bytes)
    def checked(self):
        if not self._checked:
            raise RuntimeError(f"{type(self).__name__}: call compile() (or check_support()) "
                               f"first; the workspace size is known after the checks")
        return workspace_bytes(self)
    return checked


class _CountingLRU(LRUCache):
    def __init__(self, maxsize: int):
        super().__init__(maxsize)
        self.evictions = 0
        self.version = 0   # changes whenever a plan leaves the store
        # A hit reads the entry and moves its key to the recent end straight through the cache's
        # dict and order (C calls); LRUCache.get does the same through three Python frames and
        # twice the hashing. Another cachetools layout falls back to get(), which also refreshes.
        data = getattr(self, "_Cache__data", None)
        order = getattr(self, "_LRUCache__order", None)
        if type(data) is dict and isinstance(order, collections.OrderedDict):
            self.peek, self.refresh = data.get, order.move_to_end
        else:  # pragma: no cover - depends on the installed cachetools
            self.peek, self.refresh = self.get, _refreshed_by_get

    def popitem(self):
        item = super().popitem()
        self.evictions += 1
        self.version += 1
        return item


def _refreshed_by_get(key) -> None:
    pass


class PlanStore:
    """A thread-safe LRU of compiled plans keyed by Contract.

    >>> store = PlanStore(maxsize=64)
    >>> plan = store.get(RmsNormForward, x, w, eps=1e-6)        # doctest: +SKIP
    >>> store.stats()                                            # doctest: +SKIP
    {'size': 1, 'maxsize': 64, 'hits': 0, 'misses': 1, 'compiles': 1, 'evictions': 0}
    """

    def __init__(self, maxsize: int = 256):
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise ContractError(f"plan_cache_size: expected an int of at least 1, got {maxsize!r}")
        self._cache = _CountingLRU(int(maxsize))
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        self._compiles = 0

    def get(self, plan_cls: type[Plan], *args, **kwargs) -> Plan:
        """The compiled plan for these arguments' contract; builds and compiles it on a miss."""
        key = plan_cls.contract_for(*args, **kwargs)
        with self._lock:
            plan = self._cache.peek(key)
            if plan is not None:
                self._cache.refresh(key)
                self._hits += 1
                return plan
            self._misses += 1
            plan = plan_cls.from_contract(key)
            plan.check_support()
            plan.compile()
            self._compiles += 1
            self._cache[key] = plan
            return plan

    def lookup(self, key: Contract) -> Plan | None:
        with self._lock:
            plan = self._cache.peek(key)
            if plan is not None:
                self._cache.refresh(key)
            return plan

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"size": len(self._cache), "maxsize": int(self._cache.maxsize),
                    "hits": self._hits, "misses": self._misses, "compiles": self._compiles,
                    "evictions": self._cache.evictions}

    @property
    def version(self) -> int:
        """Changes whenever a plan leaves the store (evicted or cleared): what holds on to a
        plan outside the store (the runtime's bound calls) checks it."""
        return self._cache.version

    def count_hit(self) -> None:
        """A hit served outside ``get`` (a bound call), counted like one."""
        self._hits += 1

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()
            self._cache.version += 1

    def __len__(self) -> int:
        return len(self._cache)

    def __contains__(self, key: Contract) -> bool:
        return key in self._cache
