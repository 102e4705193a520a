"""Launching a CuTe DSL compiled function with little host time, in a form bindings replay.

A function from ``cute.compile`` launches through a host entry (``capi_func``) that takes one
array: a pointer to each argument's value, then the DSL's own slots (where the CUDA result is
written, the loaded kernels). The DSL's call builds that array in Python, argument by
argument (about 17 us for the projection's 13 arguments on the development machine's CPU).
``PackedLaunch`` keeps the array and the values' storage per thread and only writes the new
values: addresses, 32-bit integers and the stream handle. It is used only where the DSL,
asked to pack sample arguments, gives exactly that array (``packs_as_expected``); otherwise
``DslLaunch`` makes the DSL's own call.

Either is a launch a binding can replay (``form``), and ``launch`` records it into the
recording of the running ``execute``, addresses marked, so that the plan's calls of a kind
are bound as those of plans whose kernels are Triton's.
"""
from __future__ import annotations

import ctypes
import threading
from functools import lru_cache

from .binding import active_recording, Address

POINTER, INT32 = "pointer", "int32"   # kinds of arguments; the stream is a POINTER
_STORAGE = {POINTER: ctypes.c_void_p, INT32: ctypes.c_int32}


class PackedLaunch:
    """``launcher(stream, *values)``: the host entry called with ``values`` (then the stream)
    in this thread's storage, for arguments of ``kinds`` (the stream's last)."""

    def __init__(self, capi_func, kinds: tuple, kernel_pointers: tuple, has_result: bool,
                 owner=None):
        self._capi = capi_func
        self._kinds = kinds
        self._kernel_pointers = tuple(int(getattr(p, "value", p) or 0) for p in kernel_pointers)
        self._has_result = has_result
        self._owner = owner   # kept alive: it owns the loaded kernels (the DSL's executor)
        self._local = threading.local()

    def _storage(self) -> tuple:
        """This thread's storage: one array per run of arguments of a kind, the stream's and
        the result's values, and the packed array of pointers to them all."""
        kinds, runs, slots = self._kinds[:-1], [], []
        start = 0
        while start < len(kinds):
            stop = start
            while stop < len(kinds) and kinds[stop] == kinds[start]:
                stop += 1
            ctype = _STORAGE[kinds[start]]
            array = (ctype * (stop - start))()
            runs.append((array, start, stop))
            slots.extend(ctypes.addressof(array) + i * ctypes.sizeof(ctype)
                         for i in range(stop - start))
            start = stop
        stream, result = ctypes.c_void_p(), ctypes.c_int32()
        slots.append(ctypes.addressof(stream))
        if self._has_result:
            slots.append(ctypes.addressof(result))
        slots.extend(self._kernel_pointers)
        storage = (tuple(runs), stream, result, (ctypes.c_void_p * len(slots))(*slots))
        self._local.storage = storage
        return storage

    def __call__(self, stream: int, *values) -> None:
        storage = getattr(self._local, "storage", None) or self._storage()
        runs, stream_slot, result, packed = storage
        for array, start, stop in runs:
            array[:] = values[start:stop]
        stream_slot.value = stream
        result.value = 0
        self._capi(packed)
        if result.value:
            raise RuntimeError(f"CuTe DSL launch failed: CUDA error {result.value}")

    def form(self, grid, stream: int, function, metadata) -> tuple:
        """A binding's replay calls ``self(stream, *arguments)``."""
        return self, (stream,), False


class DslLaunch:
    """``launcher(stream, *values)`` through the DSL's own call; ``pointers``: each pointer
    argument's (cutlass dtype, alignment in bytes), in order."""

    def __init__(self, executor, kinds: tuple, pointers: tuple):
        self._executor, self._kinds, self._pointers = executor, kinds, pointers

    def __call__(self, stream: int, *values) -> None:
        self._executor(*_dsl_arguments(self._kinds, self._pointers, values), _stream(stream))

    form = PackedLaunch.form


@lru_cache(maxsize=512)
def _pointer(dtype, align: int, address: int):
    """A cute pointer (an immutable description): training loops pass the same buffers again
    and again, and a lookup costs less host time than ``make_ptr``."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_ptr
    return make_ptr(dtype, address, cute.AddressSpace.gmem, assumed_align=align)


def _dsl_arguments(kinds: tuple, pointers: tuple, values) -> list:
    """``values`` (the stream's left out) as the DSL's call takes them: cute pointers of
    ``pointers``' dtypes and alignments, and DSL 32-bit integers."""
    import cutlass
    types = iter(pointers)
    return [_pointer(*next(types), v) if kind == POINTER else cutlass.Int32(v)
            for kind, v in zip(kinds, values)]


@lru_cache(maxsize=64)
def _stream(handle: int):
    import cuda.bindings.driver as cuda_driver
    return cuda_driver.CUstream(handle)


def packs_as_expected(execution_args, kinds: tuple, pointers: tuple) -> bool:
    """Whether the compiled function takes arguments of ``kinds`` (its signature: pointers,
    32-bit integers, the stream last) and the DSL packs them as ``PackedLaunch`` does: one
    pointer per argument, to its value stored as ``kinds`` say."""
    import inspect

    import cutlass
    import cutlass.cute as cute
    declared = {cute.Pointer: POINTER, cutlass.Int32: INT32}
    try:
        parameters = list(execution_args.signature.parameters.values())
    except AttributeError:
        return False
    if len(parameters) != len(kinds) or parameters[-1].annotation is not inspect.Parameter.empty:
        return False
    if any(declared.get(p.annotation) != kind for p, kind in zip(parameters[:-1], kinds)):
        return False
    # addresses above 32 bits and negative integers: a value stored at another width differs
    samples = [(i + 1) << 32 if kind == POINTER else -(i + 1) for i, kind in enumerate(kinds)]
    try:
        args = [*_dsl_arguments(kinds, pointers, samples[:-1]), _stream(samples[-1])]
        packed, _ = execution_args.generate_execution_args(tuple(args), {})
    except Exception:   # another DSL release, another marshalling
        return False
    if len(packed) != len(kinds):
        return False
    for entry, kind, want in zip(packed, kinds, samples):
        address = entry.value if isinstance(entry, ctypes.c_void_p) else entry
        if type(address) is not int or address < 4096 or address == want:
            return False   # not an address, or the value itself: nothing to read through
        if _STORAGE[kind].from_address(address).value != want:
            return False
    return True


def launcher_for(function, device_index: int, kinds: tuple, pointers: tuple):
    """A ``PackedLaunch`` of ``function`` (from ``cute.compile``) on that device where the DSL
    packs as expected, else a ``DslLaunch``."""
    executor = function.to(device_index)
    kernels = getattr(executor, "_kernel_ptrs", None) or ()
    has_result = getattr(executor, "_has_cuda_result", None)
    if (type(has_result) is bool and getattr(executor, "_num_extra_args", None)
            == has_result + len(kernels) and packs_as_expected(function.execution_args, kinds,
                                                                 pointers)):
        return PackedLaunch(executor.capi_func, kinds, tuple(kernels), has_result, executor)
    return DslLaunch(executor, kinds, pointers)


def launch(launcher, stream: int, tensors: tuple, ints: tuple) -> None:
    """``launcher`` on ``stream`` with the tensors' addresses and ``ints``; a recording in
    progress keeps it for replay."""
    addresses = [t.data_ptr() for t in tensors]
    launcher(stream, *addresses, *ints)
    recording = active_recording()
    if recording is not None:
        recording.launches.append((launcher, (), None, None, stream,
                                   (*map(Address, addresses), *ints)))
