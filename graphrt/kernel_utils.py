"""Triton helpers shared by the ops' kernels."""
from __future__ import annotations

import contextlib
import inspect
import os
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl
from torch.utils._python_dispatch import _disable_current_modes
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from . import binding
from .binding import Address, active_recording, RecordedDescriptor
from .notices import warn_once

# The Tritons that graphrt's Gluon kernels were tested and measured with (graphrt.gluon_api
# spells the builtins they name differently); other versions take the portable kernels.
# GRAPHRT_TRUST_TRITON=1 (read at import) runs them on any Triton, for testing a new release.
TESTED_TRITONS = ((3, 6), (3, 7), (3, 9))
TRITON_TRUSTED = os.environ.get("GRAPHRT_TRUST_TRITON", "0") == "1"
ON_TESTED_TRITON = (TRITON_TRUSTED
                    or tuple(int(v) for v in triton.__version__.split(".")[:2]) in TESTED_TRITONS)
_TESTED_NAMES = [f"{major}.{minor}" for major, minor in TESTED_TRITONS]
TESTED_TRITONS_TEXT = ", ".join(_TESTED_NAMES[:-1]) + " and " + _TESTED_NAMES[-1]


# Programmatic dependent launch (compute capability 9.0 and later): a kernel launched with it may
# start while the kernel before it in the stream drains, and waits in wait_for_prior_kernel before
# it touches memory. GRAPHRT_PDL=0 (read at import) turns it off.
PDL_ENABLED = os.environ.get("GRAPHRT_PDL", "1") != "0"
_pdl_by_device: dict[int, bool] = {}


def use_pdl(t) -> bool:
    """Whether kernels on ``t``'s device launch as programmatic dependent launches: CUDA devices
    of compute capability 9.0 and later (not the Triton interpreter), unless GRAPHRT_PDL=0."""
    index = t.get_device()
    if index < 0 or not PDL_ENABLED:
        return False
    enabled = _pdl_by_device.get(index)
    if enabled is None:
        enabled = _pdl_by_device[index] = torch.cuda.get_device_capability(index)[0] >= 9
    return enabled


# -- the pre-bound launch -----------------------------------------------------------------------
# Triton picks a compiled kernel from the launch options and a specialization of every argument:
# a tensor's dtype and whether its address is a multiple of 16, an int's width and whether it is
# 1 or a multiple of 16. _argument_classes computes a key at least that fine in a few integer
# tests; the kernel Triton compiled for the first launch with a key is then launched directly on
# the next ones, through the same call JITFunction.run makes, without its binder, cache-key
# hashing and per-launch bookkeeping.
_INT32, _INT64 = 1 << 31, 1 << 63


def _argument_classes(args: tuple) -> tuple | None:
    """What Triton specializes on in ``args``, or None for an argument kind it may specialize
    on more finely (tensor descriptors, tuples...), which then always takes Triton's path."""
    classes = []
    for a in args:
        kind = type(a)
        if kind is torch.Tensor or isinstance(a, torch.Tensor):
            classes.append(a.dtype)
            classes.append(not a.data_ptr() & 15)
        elif kind is int:
            classes.append(0 if a == 1 else 1 if not a & 15 else 2)
            classes.append(0 if -_INT32 <= a < _INT32 else 1 if -_INT64 <= a < _INT64 else 2)
        elif kind is float or a is None or kind is bool:
            classes.append(kind)
        else:
            described = _descriptor_classes(a)
            if described is None:
                return None
            classes.append(described)
    return tuple(classes)


def _is_descriptor(a) -> bool:
    """Whether ``a`` is a host tensor descriptor (Triton's or Gluon's) over a tensor."""
    return hasattr(a, "block_shape") and isinstance(getattr(a, "base", None), torch.Tensor)


def _descriptor_classes(a) -> tuple | None:
    """A host tensor descriptor's key (Triton's or Gluon's): its type, dtype, block shape,
    layout, padding and whether its base is 16-byte aligned. Triton specializes on the dtype,
    block shape and layout alone (3.6, 3.7 and 3.9); shape and strides are run-time values, left out
    so that the key stays bounded when a run-time extent changes every call. None for anything
    other than a descriptor."""
    if not _is_descriptor(a):
        return None
    base = a.base
    return (type(a), base.dtype, tuple(a.block_shape), getattr(a, "layout", None),
            getattr(a, "padding", None), not base.data_ptr() & 15)


def _direct_launch_supported() -> bool:
    """Whether this Triton launches compiled kernels the way the pre-bound launch does: checked
    in its source, so that another release's change turns it off rather than misfiring."""
    try:
        from triton.runtime.jit import JITFunction
        source = inspect.getsource(JITFunction.run)
        from triton import knobs  # noqa: F401
    except Exception:  # pragma: no cover - other Triton layouts
        return False
    return ("kernel.run(grid_0, grid_1, grid_2, stream, kernel.function, kernel.packed_metadata, "
            "launch_metadata," in " ".join(source.split())
            and "*bound_args.values())" in source)


# Triton's compiled kernel launches through ``CudaLauncher.__call__``, Python that allocates the
# kernel's scratch buffers and passes them with its fixed fields to a C launch. For a kernel
# that needs no scratch, ``DirectRun`` calls that C launch itself (less host time a launch:
# docs/perf/capture.md). The layouts of the call it knows (Triton 3.6's arguments spread, 3.7's
# and 3.9's packed in a tuple) are checked in Triton's source; any other takes ``compiled.run``.
_PACKED_CALL = ("self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, "
                "self.launch_pdl, kernel_metadata, launch_metadata, launch_enter_hook, "
                "launch_exit_hook, global_scratch, profile_scratch, self.arg_annotations, "
                "self.kernel_signature, {args})")
# (packed, the C launch's call in the launcher's source, a line it must also hold)
_C_LAUNCH_CALLS = (
    (False, "self.launch(gridX, gridY, gridZ, stream, function, self.launch_cooperative_grid, "
            "self.launch_pdl, global_scratch, profile_scratch, *args)", ""),   # 3.6
    (True, _PACKED_CALL.format(args="args"), ""),   # 3.7
    # 3.9: kernel_args is args unless GSan adds its own (direct_run takes no GSan launcher)
    (True, _PACKED_CALL.format(args="kernel_args"), "kernel_args = args "),
)
_c_launch_layouts: dict = {}


def c_launch_layout(kind: type) -> bool | None:
    """How ``kind.__call__`` (a Triton launcher class) calls its C launch: False for the
    arguments spread after the scratch buffers, True for them packed last, None when it is
    not known."""
    if kind in _c_launch_layouts:
        return _c_launch_layouts[kind]
    try:
        source = " ".join(inspect.getsource(kind.__call__).split())
    except (TypeError, OSError, AttributeError):
        source = ""
    layout = next((packed for packed, call, also in _C_LAUNCH_CALLS
                   if call in source and also in source), None)
    _c_launch_layouts[kind] = layout
    return layout


class DirectRun:
    """``compiled.run`` of a kernel with no scratch buffers, calling Triton's C launch itself.
    ``form`` gives, for one grid, stream and kernel, (function, leading arguments, packed):
    the launch is then ``function(*leading, *args)``, or ``function(*leading, args)`` when
    packed, with nothing else computed per call."""

    __slots__ = ("c_launch", "cooperative", "pdl", "annotations", "signature", "packed")

    def __init__(self, launcher, packed: bool):
        self.c_launch, self.packed = launcher.launch, packed
        self.cooperative, self.pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
        self.annotations = getattr(launcher, "arg_annotations", None)
        self.signature = getattr(launcher, "kernel_signature", None)

    def form(self, grid: tuple, stream: int, function, metadata) -> tuple:
        if self.packed:
            return self.c_launch, (*grid, stream, function, self.cooperative, self.pdl, metadata,
                                   None, None, None, None, None, self.annotations,
                                   self.signature), True
        return self.c_launch, (*grid, stream, function, self.cooperative, self.pdl, None, None,
                               metadata, None, None, None), False

    def __call__(self, grid_0, grid_1, grid_2, stream, function, metadata, launch_metadata,
                 enter_hook, exit_hook, *args):
        """The call ``compiled.run`` takes (launch hooks are never set on this path)."""
        c_launch, leading, packed = self.form((grid_0, grid_1, grid_2), stream, function,
                                              metadata)
        if packed:
            c_launch(*leading, args)
        else:
            c_launch(*leading, *args)


class ScratchRun(DirectRun):
    """``compiled.run`` of a kernel with global scratch alone (TMA descriptors made on the
    device), calling Triton's C launch itself as ``DirectRun`` does, with the scratch passed
    in its place, from the caching allocator on the kernel's device and stream, and the
    caller's ``triton.set_allocator`` never touched. (Through Triton's own path, two context
    managers and its Python launcher cost more host time than the launch:
    docs/perf/capture.md.)

    A form (one grid and stream: a binding's replayed launch) allocates its scratch once and
    passes it again on later calls on that stream, which run in order after the earlier ones
    (a kernel of this kind launched as a programmatic dependent launch must wait for the one
    before it before it writes its scratch, as the ragged TMA kernel does). Under CUDA-graph
    capture each call takes fresh scratch, the graph's own memory, since a graph may be
    replayed on any stream."""

    __slots__ = ("device", "per_program", "on_cuda")

    def __init__(self, launcher, packed: bool, device):
        super().__init__(launcher, packed)
        self.device = device
        self.per_program = launcher.global_scratch_size * launcher.num_ctas
        self.on_cuda = torch.device(device).type == "cuda"

    def form(self, grid: tuple, stream: int, function, metadata) -> tuple:
        """``DirectRun.form``'s, the function passing the scratch itself."""
        c_launch, leading, packed = super().form(grid, stream, function, metadata)
        slot = 11 if packed else 7   # the global scratch's place in either C launch's call
        before, after = leading[:slot], leading[slot + 1:]
        nbytes, device = grid[0] * grid[1] * grid[2] * self.per_program, self.device
        capturing = (torch._C._cuda_isCurrentStreamCapturing if self.on_cuda
                     else lambda: False)
        kept = []   # the scratch of this form's calls outside capture

        def with_scratch(*args):
            if capturing():
                c_launch(*before, _scratch(nbytes, device), *after, *args)
                return
            if not kept:
                kept.append(_scratch(nbytes, device))
            c_launch(*before, kept[0], *after, *args)
        return with_scratch, (), packed


def _scratch(nbytes: int, device) -> torch.Tensor:
    """A kernel's global scratch from the caching allocator on ``device``, allocated outside
    any torch dispatch mode (a binding's recording takes a tensor operation in ``execute`` for
    one it could not replay; this scratch is allocated again on every call, replays
    included)."""
    if torch._C._len_torch_dispatch_stack():
        with _disable_current_modes():
            return torch.empty(nbytes, dtype=torch.uint8, device=device)
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def _scratch_allocator(device):
    """Triton's allocator, for the calls inside the block: ``_scratch`` on ``device``."""
    return _allocator_set_to(lambda size, alignment, stream: _scratch(size, device))


@contextlib.contextmanager
def _allocator_set_to(allocate):
    from triton.runtime import _allocation
    token = _allocation._allocator.set(allocate)
    try:
        yield
    finally:
        _allocation._allocator.reset(token)


def direct_run(compiled, device=None):
    """A ``DirectRun`` for this compiled kernel; a ``ScratchRun`` on ``device`` for one with
    global scratch alone; its own ``run`` where the C launch cannot be called directly
    (profile scratch, a sanitizer build, an unknown launcher)."""
    run = compiled.run
    packed = c_launch_layout(type(run))
    if getattr(run, "profile_scratch_size", 1) or getattr(run, "gsan_enabled", False):
        return run
    if packed is None:
        return run
    if getattr(run, "global_scratch_size", 1):
        return ScratchRun(run, packed, device) if device is not None else run
    return DirectRun(run, packed)


class _Launcher:
    """The pre-bound launches of this process: compiled kernels by (kernel, device, options,
    argument classes), with the constexpr and default arguments that follow the positional
    ones."""

    def __init__(self):
        self.supported: bool | None = None
        self.bound: dict = {}
        self.plain_run_types: dict = {}
        self.current_device = self.current_stream = None

    def _enable(self) -> bool:
        self.supported = _direct_launch_supported()
        if self.supported:
            from triton import knobs
            from triton.runtime.jit import JITFunction
            self.jit_type, self.runtime_knobs = JITFunction, knobs.runtime
        else:
            warn_once("direct-launch", f"graphrt: Triton {triton.__version__} launches kernels in "
                      f"a way graphrt's pre-bound launch does not know, so launches take "
                      f"Triton's own path (about 7 us more host time each on an H200 host)")
        return self.supported

    def _plain_run(self, kind: type) -> bool:
        """Whether kernels of this class launch through JITFunction.run unchanged (Triton's
        JIT functions, and Gluon's, which only compile differently)."""
        plain = self.plain_run_types.get(kind)
        if plain is None:
            plain = self.plain_run_types[kind] = (issubclass(kind, self.jit_type)
                                                  and kind.run is self.jit_type.run)
        return plain

    def hooks_active(self) -> bool:
        knobs = self.runtime_knobs
        return _hook_set(knobs.launch_enter_hook) or _hook_set(knobs.launch_exit_hook)

    def __call__(self, kernel, grid: tuple, args: tuple, kwargs: dict):
        if self.supported is None:
            self._enable()
        recording = active_recording()
        if (not self.supported or not self._plain_run(type(kernel)) or kernel.pre_run_hooks
                or self.hooks_active() or type(grid) is not tuple):
            return _unrecorded(recording, kernel[grid](*args, **kwargs))
        classes = _argument_classes(args)
        if classes is None:
            return _unrecorded(recording, kernel[grid](*args, **kwargs))
        if self.current_stream is None:
            driver = triton.runtime.driver.active
            self.current_device = driver.get_current_device
            self.current_stream = driver.get_current_stream
        device = self.current_device()
        key = (kernel, device, classes, *kwargs.items())
        entry = self.bound.get(key)
        grid = (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)
        if entry is None:
            compiled = kernel[grid](*args, **kwargs)
            tail = _trailing_arguments(kernel, len(args), kwargs)
            if tail is None or hasattr(compiled, "result"):  # an async compile's future
                return _unrecorded(recording, compiled)
            run = direct_run(compiled, device)
            entry = self.bound[key] = (compiled, tail, run)
            stream = self.current_stream(device)
        else:
            compiled, tail, run = entry
            stream = self.current_stream(device)
            run(*grid, stream, compiled.function, compiled.packed_metadata, None, None, None,
                *args, *tail)
        if recording is not None:
            recording.launches.append((
                run, grid, compiled.function, compiled.packed_metadata, stream,
                (*map(_recorded_argument, args), *tail), kernel.arg_names))
        return compiled


def _recorded_argument(a):
    """A launch argument as a recording keeps it: tensors and descriptors by address."""
    if isinstance(a, torch.Tensor):
        return Address(a.data_ptr())
    if _is_descriptor(a):
        if hasattr(a, "__dict__"):
            return RecordedDescriptor(a)
        mark_unrecorded_launch()   # a descriptor class this binding cannot rebuild
    return a


def mark_unrecorded_launch() -> None:
    """For launches that do not go through ``launch`` (another DSL's kernels): a recording
    in progress cannot replay them, so it is left incomplete and the call stays unbound."""
    _unrecorded(active_recording(), None)


def _unrecorded(recording, compiled):
    """A launch a recording cannot replay: the recording is incomplete."""
    if recording is not None:
        recording.complete = False
    return compiled


def _hook_set(hook) -> bool:
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else True


def _trailing_arguments(kernel, n_positional: int, kwargs: dict) -> tuple | None:
    """The values of the kernel's parameters after the first ``n_positional``, in order, from
    ``kwargs`` or the parameters' defaults; None where one has neither."""
    tail = []
    for param in kernel.params[n_positional:]:
        if param.name in kwargs:
            tail.append(kwargs[param.name])
        elif param.default is not inspect.Parameter.empty:
            tail.append(param.default)
        else:
            return None
    return tuple(tail)


_launcher = _Launcher()


def _launch_hooks_active() -> bool:
    return bool(_launcher.supported) and _launcher.hooks_active()


binding.launch_hooks_active = _launch_hooks_active


# Compile options every launch asks for. FP fusion (a multiply and an add as one FMA) is how the
# kernels were tested and measured: Tritons 3.6 to 3.9 fuse by default, and asking gives the same
# PTX for every compile case, but 3.9 warns that its default turns fusion off from 3.10 on.
LAUNCH_OPTIONS = {"enable_fp_fusion": True}


def launch(kernel, grid: tuple, *args, **kwargs):
    """``kernel[grid](*args, **kwargs)`` with less host time: after the first launch of a
    specialization (Triton's own path: it compiles, and picks the kernel), the same compiled
    kernel is launched directly for arguments Triton would specialize the same way. Launch
    hooks (profilers), the interpreter, arguments other than tensors and scalars, and Triton
    releases that launch differently take ``kernel[grid]`` every time. ``LAUNCH_OPTIONS``
    apply unless ``kwargs`` say otherwise.

    >>> launch(_uniform_kernel, (blocks,), out, rng.state, n, BLOCK=1024)   # doctest: +SKIP
    """
    return _launcher(kernel, grid, args, {**LAUNCH_OPTIONS, **kwargs})


class PreparedLaunch:
    """``launch(kernel, grid, *args, **kwargs)`` with ``kernel``, ``grid`` and ``kwargs`` fixed,
    for a caller whose positional arguments keep what Triton specializes on from call to call
    (the same tensors' alignment, floats as floats, ints in the same classes): after the first
    launch on a device the compiled kernel is called with no test of the arguments and no
    lookup. Launch hooks, a recording and another device take ``launch``'s path.

    >>> step = PreparedLaunch(_adamw_many_kernel, (blocks,), dict(BLOCK=1024))  # doctest: +SKIP
    >>> step(addresses, ends, sizes, tensors, sizes, lr, ...)                # doctest: +SKIP
    """

    __slots__ = ("kernel", "grid", "kwargs", "_device", "_entry", "_grid3")

    def __init__(self, kernel, grid: tuple, kwargs: dict):
        self.kernel, self.grid = kernel, tuple(grid)
        self.kwargs = {**LAUNCH_OPTIONS, **kwargs}
        self._grid3 = (*self.grid, 1, 1)[:3]
        self._device = self._entry = None

    def __call__(self, *args) -> None:
        entry = self._entry
        if entry is not None and active_recording() is None and not _launcher.hooks_active():
            device = _launcher.current_device()
            if device == self._device:
                compiled, tail, run = entry
                run(*self._grid3, _launcher.current_stream(device), compiled.function,
                    compiled.packed_metadata, None, None, None, *args, *tail)
                return
        _launcher(self.kernel, self.grid, args, self.kwargs)
        if entry is None and _launcher.supported and _launcher.current_device is not None:
            classes = _argument_classes(args)
            device = _launcher.current_device()
            self._entry = _launcher.bound.get((self.kernel, device, classes,
                                               *self.kwargs.items()))
            self._device = device if self._entry is not None else None


def launch_with_scratch(kernel, grid: tuple, *args, **kwargs):
    """``launch`` of a kernel that makes TMA descriptors on the device (``args[0]`` a tensor on
    its device): Triton sizes their global scratch per launch and takes it from an allocator,
    here the caching allocator on the launch's device (see ``ScratchRun``; the first launch,
    which compiles, takes Triton's own path)."""
    with _scratch_allocator(args[0].device):
        return launch(kernel, grid, *args, **kwargs)


def direct_launch_enabled() -> bool:
    """Whether this Triton takes the pre-bound launch (``graphrt info`` reports it)."""
    return _launcher.supported if _launcher.supported is not None else _launcher._enable()


CONSTEXPR = "constexpr"


@dataclass(frozen=True)
class CompileCase:
    """A kernel variant that ``scripts/compile_check.py`` compiles for sm_90a without a GPU:
    the argument types as Triton's ASTSource takes them ('*bf16', 'i32', CONSTEXPR,
    'tensordesc<...>'), the constexpr values, and the launch options. Each kernels module lists
    its own in ``compile_cases()``, beside the kernels; the op registry says which modules."""

    name: str
    kernel: Any
    signature: dict
    constexprs: dict
    num_warps: int = 4
    maxnreg: int | None = None
    gluon: bool = False
    divisible: tuple = ()     # integer arguments specialized as multiples of 16, as at launch
    skip: str | None = None   # why this variant cannot compile with the Triton installed here


def warn_untested_triton(op: str, capability, slower: str) -> None:
    """Warns once per op (SlowerPathWarning) when a Hopper GPU runs ``op``'s portable Triton
    kernels because this Triton is not one its Gluon kernels were tested with; ``slower``: by
    how much, as measured."""
    if capability is not None and capability[0] == 9 and not ON_TESTED_TRITON:
        warn_once(f"{op}-untested-triton",
                  f"graphrt: {op} runs its portable Triton kernels on this Hopper GPU: its "
                  f"Gluon kernels were tested with Triton {TESTED_TRITONS_TEXT}, and this is "
                  f"Triton {triton.__version__} ({slower})")


def untested_triton_case(name: str) -> CompileCase:
    """The CompileCase of a Gluon kernel, skipped on a Triton it was not tested with."""
    return CompileCase(name, None, {}, {},
                       skip=f"tested with Triton {TESTED_TRITONS_TEXT}, this is {triton.__version__}")


def register_share(warps: int) -> int:
    """Registers a thread of a warp-specialized kernel launched with ``warps`` warps may use
    at launch: their even share of the SM's 64K-register file, a multiple of 8 (setmaxnreg
    then moves registers between partitions)."""
    return 65536 // (32 * warps) // 8 * 8


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints on the host. ``triton.cdiv`` is a constexpr function on recent
    Triton, 2-3 us a host call: more than a launch-path budget allows, once per tensor."""
    return -(-a // b)


TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}

# -- Gluon host descriptors (the Hopper kernels written in Gluon; imported on first use) --------
_GLUON_TYPES = {torch.bfloat16: ("bfloat16", "bf16"),
                torch.float8_e4m3fn: ("float8e4nv", "fp8e4nv")}


def _gluon_layout(block: list, dtype: torch.dtype):
    from triton.experimental.gluon import language as gl
    return gl.NVMMASharedLayout.get_default_for(block, getattr(gl, _GLUON_TYPES[dtype][0]))


def gluon_descriptor(t: torch.Tensor, block: list):
    """A Gluon host TMA descriptor over ``t`` for ``block``-shaped copies, in the default
    swizzled shared-memory layout of ``t``'s dtype (BF16 or E4M3)."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    return TensorDescriptor.from_tensor(t, block, _gluon_layout(block, t.dtype))


def gluon_descriptor_type(block: list, dtype: torch.dtype) -> str:
    """The type of ``gluon_descriptor``'s result for ``block`` and ``dtype``, as a
    CompileCase signature spells it."""
    name = _GLUON_TYPES[dtype][1]
    return f"tensordesc<{name}[{block[0]},{block[1]}],{_gluon_layout(block, dtype)!r}>"


def next_power_of_2(n: int) -> int:
    """The least power of two >= n (0 for 0, as ``triton.next_power_of_2``) on the host, without
    Triton's constexpr-function call (see ``cdiv``)."""
    return 1 << (n - 1).bit_length() if n > 1 else n


def persistent_grid(tiles: int, max_programs: int) -> int:
    """Programs for a persistent loop over ``tiles`` interleaved tiles: as few as still take
    the same number of steps as ``max_programs`` would, so no step at the end runs only a few
    programs (16384 rows over 528 programs: 512 programs of 32 rows, not 16 programs finishing a
    32nd row alone).

    >>> persistent_grid(16384, 528), persistent_grid(100, 528)
    (512, 100)
    """
    if tiles <= max_programs:
        return max(tiles, 1)
    steps = -(-tiles // max_programs)
    return -(-tiles // steps)


@triton.jit
def row_offsets(rows, stride):
    """Element offsets of ``rows`` as a [rows, 1] column. Row strides are run-time values (never
    specialized); the contracts make them multiples of 16 bytes, and saying so on the offsets
    lets the compiler use 16-byte vector loads, stores and async copies."""
    return tl.multiple_of(rows * stride, 8)[:, None]


@triton.jit
def pow2(e):
    """2^e as FP32 for integer e in [-127, 127] (2^-127 is the one subnormal); NaN for 128, the
    E8M0 NaN scale decoded."""
    bits = tl.where(e <= -127, 0x400000, (e + 127) << 23)
    return tl.where(e >= 128, 0x7FC00000, bits).to(tl.float32, bitcast=True)


@triton.jit
def mma(a, b, DOT_FP32: tl.constexpr):
    """a @ b with FP32 accumulation; ``DOT_FP32`` for the Triton interpreter, which has no BF16
    matrix product (operands are then converted to FP32 first)."""
    if DOT_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def allow_dependent_launch(ENABLED: tl.constexpr):
    """Lets the next kernel in the stream, launched as a programmatic dependent launch, start
    (it waits in ``wait_for_prior_kernel`` until this grid's writes are visible). Off in the
    Triton interpreter, which has no inline assembly."""
    if ENABLED:
        gdc_launch_dependents()


@triton.jit
def wait_for_prior_kernel(ENABLED: tl.constexpr):
    """Blocks until the previous kernel in the stream has finished and its writes are visible:
    the other half of ``allow_dependent_launch``."""
    if ENABLED:
        gdc_wait()


@triton.jit
def sigmoid(v, HARDWARE: tl.constexpr):
    """1 / (1 + exp(-v)) in FP32 from the hardware's 2^x and reciprocal (MUFU.EX2, MUFU.RCP:
    2 and 1 ulp, subnormals flushed), four instructions instead of tl.sigmoid's range fix-ups.
    ``HARDWARE`` false (the Triton interpreter, which has no inline assembly) uses tl.sigmoid."""
    if HARDWARE:
        e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=f,f",
                                      [v * -1.4426950408889634], dtype=tl.float32, is_pure=True,
                                      pack=1)
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [1.0 + e],
                                         dtype=tl.float32, is_pure=True, pack=1)
    return tl.sigmoid(v)
