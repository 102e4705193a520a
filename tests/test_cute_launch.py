"""graphrt.cute_launch on the CPU: the packed launch against a stand-in host entry that reads
the array as the DSL's compiled entry does, and the installed DSL's own packing of the
projection kernel's arguments (compiled for sm_90a without a GPU)."""
import ctypes
import threading
import time

import pytest
import torch

from graphrt import binding
from graphrt.cute_launch import INT32, launch, PackedLaunch, packs_as_expected, POINTER

KINDS = (POINTER,) * 3 + (INT32,) * 2 + (POINTER,)   # three addresses, two ints, the stream
KERNEL_SLOTS = (0x5000, 0x6000)
_ENTRY = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))


def _stand_in_entry(calls: list, error: int = 0, pause: float = 0.0):
    """A host entry that reads each argument through its pointer, the result slot after them,
    then the kernel slots; it records what it read and writes ``error`` as the result."""
    def entry(packed):
        if pause:
            time.sleep(pause)   # another thread's launch may run meanwhile
        pointers = [ctypes.c_void_p.from_address(packed[i]).value for i in (0, 1, 2)]
        ints = [ctypes.c_int32.from_address(packed[i]).value for i in (3, 4)]
        stream = ctypes.c_void_p.from_address(packed[5]).value
        ctypes.c_int32.from_address(packed[6]).value = error
        calls.append((pointers, ints, stream, [packed[7], packed[8]],
                      threading.current_thread().name))
        return 0
    return _ENTRY(entry)


def test_packed_launch_passes_each_value_where_the_entry_reads_it():
    calls = []
    entry = _stand_in_entry(calls)
    launcher = PackedLaunch(entry, KINDS, tuple(ctypes.c_void_p(p) for p in KERNEL_SLOTS), True)
    launcher(0x77, 0x1000, 0x2000, 0x3000, 5, -7)
    launcher(0x78, 0x1100, 0x2100, 0x3100, 6, 1 << 30)
    assert [c[:4] for c in calls] == [
        ([0x1000, 0x2000, 0x3000], [5, -7], 0x77, list(KERNEL_SLOTS)),
        ([0x1100, 0x2100, 0x3100], [6, 1 << 30], 0x78, list(KERNEL_SLOTS))]


def test_packed_launch_raises_the_entrys_cuda_error_and_then_launches_again():
    calls = []
    failing = PackedLaunch(_stand_in_entry(calls, error=700), KINDS, KERNEL_SLOTS, True)
    with pytest.raises(RuntimeError, match="CUDA error 700"):
        failing(1, 16, 32, 48, 1, 2)
    working = PackedLaunch(_stand_in_entry(calls), KINDS, KERNEL_SLOTS, True)
    working(1, 16, 32, 48, 1, 2)
    assert len(calls) == 2


def test_threads_launch_their_own_values():
    """Each thread's values reach its own launch, though the entry of another thread's launch
    runs between its writes and its call (storage shared by threads would mix them)."""
    calls = []
    launcher = PackedLaunch(_stand_in_entry(calls, pause=0.001), KINDS, KERNEL_SLOTS, True)

    def worker(i):
        for j in range(20):
            launcher(i, 16 * i, 16 * (j + 1), 16 * (i + j), i, j)
    threads = [threading.Thread(target=worker, args=(i,), name=str(i)) for i in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 80
    for pointers, ints, stream, _, thread in calls:
        i, j = ints
        assert (i, stream) == (int(thread), int(thread))
        assert pointers == [16 * i, 16 * (j + 1), 16 * (i + j)]


def test_launch_records_addresses_for_a_binding():
    calls = []
    launcher = PackedLaunch(_stand_in_entry(calls), KINDS, KERNEL_SLOTS, True)
    tensors = (torch.zeros(4), torch.zeros(8), torch.zeros(2))
    with binding.recording_into(binding.Recording()) as recording:
        launch(launcher, 0x99, tensors, (3, 4))
    (run, grid, function, metadata, stream, arguments), = recording.launches
    assert run is launcher and stream == 0x99 and recording.complete
    assert [type(a) for a in arguments] == [binding.Address] * 3 + [int, int]
    assert list(arguments) == [t.data_ptr() for t in tensors] + [3, 4]
    assert run.form(grid, stream, function, metadata) == (launcher, (0x99,), False)
    assert calls[0][0] == [t.data_ptr() for t in tensors]


def test_the_installed_dsl_packs_the_projection_kernels_arguments_as_expected(monkeypatch):
    """What decides that the projection takes the packed launch: the DSL's own marshalling of
    the kernel's 13 arguments, compiled here for Hopper."""
    monkeypatch.setenv("CUTE_DSL_ARCH", "sm_90a")
    kernels = pytest.importorskip("graphrt.ops.proj_rope.kernels_cute",
                                  reason="nvidia-cutlass-dsl is not installed")
    function = kernels.compile_kernel(0)
    kinds, pointers = kernels.ARGUMENT_KINDS, kernels.POINTER_TYPES
    assert packs_as_expected(function.execution_args, kinds, pointers)
    # argument kinds other than the compiled signature's are refused
    assert not packs_as_expected(function.execution_args, (INT32,) + kinds[1:], pointers[1:])
    assert not packs_as_expected(function.execution_args, kinds[:8] + (INT32,) + kinds[8:],
                                 pointers)
    assert not packs_as_expected(function.execution_args, kinds[:-1] + (INT32,), pointers)

    class ValuesPacked:   # a marshalling that passes the values themselves
        signature = function.execution_args.signature

        @staticmethod
        def generate_execution_args(args, kwargs):
            packed, adapted = function.execution_args.generate_execution_args(args, kwargs)
            return [ctypes.c_int64.from_address(getattr(e, "value", e)).value
                    for e in packed], adapted
    assert not packs_as_expected(ValuesPacked, kinds, pointers)

    class OrderChanged:   # pointers to the values, two of them in each other's place
        signature = function.execution_args.signature

        @staticmethod
        def generate_execution_args(args, kwargs):
            packed, adapted = function.execution_args.generate_execution_args(args, kwargs)
            return [packed[1], packed[0], *packed[2:]], adapted
    assert not packs_as_expected(OrderChanged, kinds, pointers)
