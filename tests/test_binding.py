"""Bindings: plan.execute replays the launches it recorded for the same arguments, and only then.

CPU tests cover the key and the recording guard; GPU tests replay real plans against the
reference with fresh data in the same buffers, new buffers, new streams, launch hooks, capture,
and rejected calls after a binding."""
import gc

import pytest
import torch

import graphrt
from graphrt import binding
from graphrt.errors import ContractError
from graphrt.ops import (HstuLmsdBackward, HstuLmsdForward, RmsNormBackward, RmsNormForward,
                         hstu_lmsd_forward)
from graphrt.ops.rmsnorm.reference import rmsnorm_backward_reference, rmsnorm_forward_reference

from .helpers import env


def test_cpu_tensors_and_unknown_objects_are_not_bound():
    x = torch.randn(4, 8)
    assert binding.binding_key((x,), {"stream": None}) is None
    assert binding.binding_key((object(),), {}) is None
    assert binding.binding_key((1, 2.0), {}) is None  # no tensor: no device to bind on


def test_keys_stand_for_scalars_strings_and_dtypes_and_tell_them_apart():
    """A dtype option (the grouped wgrad's wgrad_dtype) keys like a flag, so such calls
    can be bound; values of different kinds or values never share a key; other objects leave
    the call unbound."""
    x = torch.empty(8)
    values = [None, 0, 1, False, True, 0.0, -0.0, float("nan"), "dense", "0", torch.bfloat16,
              torch.float32]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "get_device", lambda self: 0)
        patch.setattr(binding, "_current_raw_stream", lambda index: 7)
        keys = [binding.binding_key((x,), {"v": v}) for v in values]
        assert None not in keys
        assert len({k[0] for k in keys}) == len(values)
        nan = float("nan")
        assert binding.binding_key((x,), {"v": nan})[0] == binding.binding_key(
            (x,), {"v": float("nan")})[0]
        assert binding.binding_key((x,), {"v": [1]}) is None
        assert binding.binding_key((x,), {"v": torch.device("cpu")}) is None


def test_a_call_matcher_accepts_exactly_the_calls_of_its_key():
    """A binding's CallMatcher serves a call only when binding_key would give it the recorded
    call's key, with the same addresses and run-time ints; it may send a call of that key on
    to the key (a tensor of another type or requires_grad), never the reverse."""
    run_time = {"seed": (("seed_lo", "seed_hi"), _split_pair)}

    def aligned(*shape, dtype=torch.float32):   # at an address a multiple of 256
        n = torch.Size(shape).numel()
        buffer = torch.empty(n + 256, dtype=dtype)
        skip = -buffer.data_ptr() % 256 // buffer.element_size()
        return buffer[skip:skip + n].view(shape).normal_()

    def call(x=None, w=None, **kw):
        x = aligned(4, 8) if x is None else x
        w = aligned(8) if w is None else w
        return (x, w), {"eps": 1e-6, "p": 0.0, "flag": True, "seed": 3, "y": aligned(4, 8),
                        "workspace": None, "dtype": torch.bfloat16, **kw}

    base = aligned(64)
    variants = {
        "fresh buffers": call(),
        "another seed": call(seed=-(1 << 40)),
        "another shape": call(x=aligned(2, 8)),
        "transposed": call(x=aligned(8, 4).t()),
        "another dtype": call(x=aligned(4, 8, dtype=torch.float64)),
        "off the recorded alignment": call(w=base[1:9]),
        "another eps": call(eps=1e-5),
        "-0.0 for 0.0": call(p=-0.0),
        "bool for int": call(seed=True),
        "int for bool": call(flag=1),
        "a string": call(flag="1"),
        "no output": call(y=None),
        "another dtype flag": call(dtype=torch.float16),
        "an extra keyword": call(stream=None),
        "requires_grad": call(x=aligned(4, 8).detach().requires_grad_()),
    }
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "get_device", lambda self: 0)
        stream = [7]
        patch.setattr(binding, "_current_raw_stream", lambda index: stream[0])
        args, kwargs = call(w=base[:8])
        recorded, positions, _, _ = binding.binding_key(args, kwargs, run_time)
        matcher = binding.call_matcher(args, kwargs, recorded, positions)
        assert matcher is not None
        reordered = dict(reversed(list(kwargs.items())))
        assert matcher.match(args, reordered) is None   # keyword order is in the key too
        served = set()
        for name, (a, k) in variants.items():
            key, _, addresses, ints = binding.binding_key(a, k, run_time)
            hit = matcher.match(a, k)
            if hit is not None:
                served.add(name)
                assert key == recorded and hit == (addresses, ints), name
            else:
                assert key != recorded or name == "requires_grad", name
        assert served == {"fresh buffers", "another seed"}
        stream[0] = 8
        assert matcher.match(*call()) is None
        with_stream = {**kwargs, "stream": 5}
        assert binding.call_matcher(args, with_stream,
                                    *binding.binding_key(args, with_stream, run_time)[:2]) is None


def _split_pair(value):
    return value & 0xFF, value >> 8


def test_run_time_int_keywords_key_alike_and_replay_their_computed_launch_arguments():
    """A plan's run-time int keywords (a dropout seed): calls that differ only in their values
    share a key and a binding, whose replay computes the launch arguments the plan declares
    from the new values; values out of the signed 64-bit range, bools and the other ints stay
    in the key, and a recording whose launch did not pass the declared values is not kept."""
    run_time = {"seed": (("seed_lo", "seed_hi"), _split_pair)}

    x = torch.empty(8)
    key_of = binding.binding_key
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "get_device", lambda self: 0)
        patch.setattr(binding, "_current_raw_stream", lambda index: 7)
        first = key_of((x,), {"seed": 513, "rows": 3}, run_time)
        second = key_of((x,), {"seed": -2, "rows": 3}, run_time)
        assert first[0] == second[0] and (first[3], second[3]) == ([513], [-2])
        assert key_of((x,), {"seed": 513, "rows": 4}, run_time)[0] != first[0]
        for kept in (1 << 63, True):   # keyed by value: the full path checks them
            assert key_of((x,), {"seed": kept, "rows": 3}, run_time)[3] == []
        assert key_of((x,), {"seed": 513, "rows": 3})[3] == []   # a plan without them
    calls = []

    def run(*launch):
        calls.append(launch)
    names = ["x", "seed_lo", "rows", "seed_hi"]

    def execute(plan, x, *, seed, rows, passed=None):
        lo, hi = _split_pair(seed) if passed is None else passed
        binding.active_recording().launches.append(
            (run, (1, 1, 1), "f", "m", 0, (binding.Address(x.data_ptr()), lo, rows, hi), names))
    bindings = binding.Bindings()
    bindings.record("k", [0], [x.data_ptr()], execute, None, (x,), {"seed": 513, "rows": 3},
                    ("x",), (), run_time, [513])
    recorded = bindings.lookup("k")
    assert recorded.launches[0][5] == ((0, 0), binding.RunTimePart(0, 0), 3,
                                       binding.RunTimePart(0, 1))
    recorded.launch([4096], [0x1234])
    assert calls[-1][-4:] == (4096, 0x34, 3, 0x12)
    bindings.record("k2", [0], [x.data_ptr()],
                    lambda plan, x, **kw: execute(plan, x, **kw, passed=(0, 0)), None, (x,),
                    {"seed": 513, "rows": 3}, ("x",), (), run_time, [513])
    assert bindings.lookup("k2") is None   # the launch took other values than declared
    misnamed = {"seed": (("seed_lo", "seed_high"), _split_pair)}
    bindings.record("k3", [0], [x.data_ptr()], execute, None, (x,), {"seed": 513, "rows": 3},
                    ("x",), (), misnamed, [513])
    assert bindings.lookup("k3") is None   # a declared parameter no launch has


def test_run_time_int_parameters_are_not_specialized_on():
    """A binding replays one compiled kernel for every value of a run-time int, so the
    kernel parameters that take them must be do_not_specialize."""
    from graphrt.ops.hstu import kernels
    kernel = kernels._hstu_fwd_kernel
    # a JIT function keeps the list itself; the interpreter's, among its keywords
    unspecialized = getattr(kernel, "do_not_specialize", None) or \
        kernel.kwargs["do_not_specialize"]
    for names, split in HstuLmsdForward.run_time_ints.values():
        assert set(names) <= set(unspecialized) and set(names) <= set(kernel.arg_names)
        for value in (0, 1, -1, 16, 1 << 40, -(1 << 63), (1 << 63) - 1):
            lo, hi = split(value)
            assert all(-(1 << 31) <= v < 1 << 31 for v in (lo, hi))   # one int type
            assert (hi << 32) + (lo & 0xFFFFFFFF) == value


def test_recording_is_incomplete_after_any_tensor_operation_but_a_view():
    x = torch.randn(4, 8)

    def views_only(plan):
        x.view(32)
        x[1:]

    def copies(plan):
        torch.empty_like(x).copy_(x)

    for fn, complete in ((views_only, True), (copies, False)):
        recording = binding.Recording()
        with binding._OnlyLaunches(recording):
            fn(None)
        assert recording.complete is complete


def test_bindings_keep_the_most_recent_few_and_only_calls_that_launched():
    bindings = binding.Bindings(size=2)

    def launches_nothing(plan):
        pass
    bindings.record("a", [], [], launches_nothing, None, (), {}, (), ())
    assert not bindings.recorded   # nothing launched: nothing worth replaying
    for key in "abc":
        bindings.recorded[key] = binding.Binding((), (), (), ())
        while len(bindings.recorded) > bindings.size:
            bindings.recorded.popitem(last=False)
    assert list(bindings.recorded) == ["b", "c"]


def test_a_replay_passes_each_address_as_argument_plus_offset_and_checks_overlap():
    calls = []

    def run(*launch):
        calls.append(launch)
    # tensors 0 (input, 100 bytes) and 1 (output, 50 bytes); the kernel takes tensor 1 + 16,
    # a row count 7 and tensor 0
    replayed = binding.Binding(((run, (3, 1, 1), "f", "m", 5, ((1, 16), 7, (0, 0))),),
                               ((1, 50),), ((0, 100),), ("x", "y"))
    replayed.replay([1000, 2000])
    assert calls == [(3, 1, 1, 5, "f", "m", None, None, None, 2016, 7, 1000)]
    with pytest.raises(ContractError, match="y: memory overlaps x"):
        replayed.replay([1000, 1099])
    assert len(calls) == 1   # nothing launched on a rejected call
    replayed.replay([1000, 2000])   # the addresses last checked: launched without a new check
    with pytest.raises(ContractError, match="y: memory overlaps x"):
        replayed.replay([1000, 1099])   # and a new overlap after them is still caught
    addresses = [1000, 2000]
    replayed.replay(addresses)
    addresses[1] = 1099   # the caller's list changing after the call changes nothing kept
    with pytest.raises(ContractError, match="y: memory overlaps x"):
        replayed.replay(addresses)
    assert len(calls) == 3
    assert binding._locate(1016, [1000, 2000], [100, 50]) == (0, 16)
    assert binding._locate(1016, [1000, 1010], [100, 50]) is None   # inside both


def test_recorded_addresses_become_argument_plus_offset():
    x, y = torch.empty(64), torch.empty(32)

    def execute(plan, x, *, y=None):
        launch = ("run", (2, 1, 1), "f", "m", 0,
                  (binding.Address(y.data_ptr() + 8), 5, binding.Address(x.data_ptr())))
        binding.active_recording().launches.append(launch)
    bindings = binding.Bindings()
    bindings.record("k", [0, 1], [x.data_ptr(), y.data_ptr()], execute, None, (x,), {"y": y},
                    ("x",), ("y",))
    recorded = bindings.lookup("k")
    assert recorded.launches[0][5] == ((1, 8), 5, (0, 0))
    assert recorded.outputs == ((1, 128),) and recorded.inputs == ((0, 256),)
    assert recorded.names == ("x", "y")

    def execute_with_foreign_address(plan, x, *, y=None):
        binding.active_recording().launches.append(
            ("run", (1, 1, 1), "f", "m", 0, (binding.Address(12345),)))
    bindings.record("k2", [0, 1], [x.data_ptr(), y.data_ptr()], execute_with_foreign_address,
                    None, (x,), {"y": y}, ("x",), ("y",))
    assert bindings.lookup("k2") is None   # an address outside the arguments: never replayed


def test_addresses_in_buffers_kept_for_the_process_replay_as_they_are():
    x, y, kept, stray = torch.empty(64), torch.empty(32), torch.empty(4), torch.empty(4)
    binding.keep_address(kept)
    try:
        _replay_kept_addresses(x, y, kept, stray)
    finally:
        binding._persistent.pop()   # the test's buffer does not live as long as the process


def _replay_kept_addresses(x, y, kept, stray):
    def execute(plan, x, *, y=None, other=kept):
        binding.active_recording().launches.append(
            ("run", (1, 1, 1), "f", "m", 0, (binding.Address(other.data_ptr() + 4),
                                             binding.Address(y.data_ptr()))))
    bindings = binding.Bindings()
    bindings.record("k", [0, 1], [x.data_ptr(), y.data_ptr()], execute, None, (x,), {"y": y},
                    ("x",), ("y",))
    assert bindings.lookup("k").launches[0][5] == (kept.data_ptr() + 4, (1, 0))
    bindings.record("k2", [0, 1], [x.data_ptr(), y.data_ptr()],
                    lambda plan, x, y=None: execute(plan, x, y=y, other=stray), None, (x,),
                    {"y": y}, ("x",), ("y",))
    assert bindings.lookup("k2") is None   # any other foreign address: never replayed


def test_recorded_tensor_descriptors_are_rebuilt_over_the_new_address():
    from triton.tools.tensor_descriptor import TensorDescriptor

    from graphrt import kernel_utils
    x, y = torch.empty(64, 32), torch.empty(16, 8)
    described = TensorDescriptor.from_tensor(x[8:], [16, 32])
    key = kernel_utils._argument_classes((described, 3))
    assert key[0][:3] == (TensorDescriptor, torch.float32, (16, 32))
    assert kernel_utils._argument_classes((TensorDescriptor.from_tensor(x, [8, 32]), 3)) != key
    # what Triton specializes on: not the extent (a run-time value), so one entry serves all
    assert kernel_utils._argument_classes((TensorDescriptor.from_tensor(x[4:], [16, 32]), 3)) \
        == key

    def execute(plan, x, *, y=None):
        binding.active_recording().launches.append(
            ("run", (1, 1, 1), "f", "m", 0, (kernel_utils._recorded_argument(described),
                                             binding.Address(y.data_ptr()))))
    bindings = binding.Bindings()
    bindings.record("k", [0, 1], [x.data_ptr(), y.data_ptr()], execute, None, (x,), {"y": y},
                    ("x",), ("y",))
    template = bindings.lookup("k").launches[0][5]
    assert type(template[0]) is binding.DescriptorAt and template[1] == (1, 0)
    rebuilt = template[0].at([4096, 8192])
    assert type(rebuilt) is TensorDescriptor and rebuilt.base.data_ptr() == 4096 + 8 * 32 * 4
    assert rebuilt.base == 4096 + 8 * 32 * 4   # an int as well, for launchers that take one
    assert (list(rebuilt.shape), list(rebuilt.strides), rebuilt.block_shape, rebuilt.padding) \
        == ([56, 32], [32, 1], [16, 32], "zero")
    assert described.base is not None and described.base.data_ptr() == x[8:].data_ptr()


# Triton 3.6's tensor-descriptor wrapper (backends/nvidia/driver.py), in its shape: an inner
# function over these three cells, with make_tensordesc_arg and _BASE_ARGS_FORMAT_LEN global
_WRAPPER_36 = """
def wrap_handle_tensordesc(launcher, tensordesc_indices, tensordesc_meta):
    def inner(*args):
        final_args = list(args[:_BASE_ARGS_FORMAT_LEN])
        tensordesc_idx = 0
        for i, arg in enumerate(args[_BASE_ARGS_FORMAT_LEN:]):
            if i in tensordesc_indices:
                final_args.extend(make_tensordesc_arg(arg, tensordesc_meta[tensordesc_idx]))
                tensordesc_idx += 1
            else:
                final_args.append(arg)
        return launcher(*final_args)
    return inner
"""


class _Form:
    """A recorded launch's run whose form is (function, leading arguments, packed): 13 leading
    arguments spread after them (Triton 3.6's), or 12 and the arguments packed (3.9's)."""

    def __init__(self, function, packed=False):
        self.function, self.packed = function, packed

    def form(self, grid, stream, function, metadata):
        leading = (*grid, stream, function, 0, 0, None, None, metadata, None, None, None)
        return self.function, leading[:-1] if self.packed else leading, self.packed


def _descriptor_binding(made: list, calls: list, wrapper_namespace=None):
    """A binding of one launch (an address, a descriptor, an int, a descriptor) through a
    wrapper of Triton 3.6's shape, whose expansion counts its calls in ``made``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from graphrt import kernel_utils

    def make_tensordesc_arg(arg, meta):
        made.append(arg.base.data_ptr())
        return [("map", arg.base.data_ptr(), meta), *arg.shape, *arg.strides]
    namespace = {"make_tensordesc_arg": make_tensordesc_arg, "_BASE_ARGS_FORMAT_LEN": 13}
    exec(_WRAPPER_36, namespace)
    inner = namespace["wrap_handle_tensordesc"](lambda *a: calls.append(a), {1, 3},
                                                 ["meta1", "meta3"])
    x, y = torch.empty(64, 32), torch.empty(16, 8)
    first = kernel_utils._recorded_argument(TensorDescriptor.from_tensor(x, [16, 32]))
    second = kernel_utils._recorded_argument(TensorDescriptor.from_tensor(y[4:], [4, 8]))
    template = ((1, 0), binding.DescriptorAt(0, 0, first), 7, binding.DescriptorAt(1, 128, second))
    return binding.Binding(((_Form(inner), (2, 1, 1), "f", "m", 5, template),), (), (),
                           ("x", "y")), inner


def test_descriptor_launch_arguments_are_kept_per_address_and_match_the_wrapper():
    """Through Triton 3.6's descriptor wrapper, a replay passes the C launch each descriptor's
    expansion, made once per base address (the last few kept), and the same arguments as the
    wrapper itself would."""
    made, calls = [], []
    bound, inner = _descriptor_binding(made, calls)
    assert bound._replays[0][3] is not None   # the wrapper recognized
    for _ in range(3):
        bound.launch([4096, 8192])
    assert made == [4096, 8192 + 128] and len(calls) == 3
    bound.launch([1 << 20, 8192])
    assert made[2:] == [1 << 20]   # the other descriptor's address is one it kept
    expected = []
    wrapped, own_inner = _descriptor_binding([], expected)
    wrapped._replays = tuple((own_inner, leading, packed, None, *rest)
                             for _, leading, packed, _, *rest in wrapped._replays)
    wrapped.launch([1 << 20, 8192])   # the same launch through the wrapper itself
    assert calls[-1] == expected[-1]
    assert calls[-1][13:] == (8192, ("map", 1 << 20, "meta1"), 64, 32, 32, 1, 7,
                              ("map", 8192 + 128, "meta3"), 12, 8, 8, 1)
    for address in range(6):   # a few kept at a time
        bound.launch([address * 256, 8192])
    kept = bound._replays[0][6][0][1]._expansions
    assert len(made) == 9 and 0 < len(kept) <= binding.EXPANSIONS_PER_DESCRIPTOR


def _installed_wrapper(calls: list, made: list):
    """(the installed Triton's descriptor wrapper over a launcher that records its arguments,
    packed) for a kernel (pointer, descriptor, int, descriptor): 3.9's with an expansion that
    counts its calls in ``made``, or 3.6's (spread) or 3.7's (packed) with their own (no TMA
    metadata, so no driver)."""
    from triton.backends.nvidia.driver import CudaLauncher

    from graphrt.kernel_utils import c_launch_layout
    signature = {"a": "*fp32", "d1": "tensordesc<fp32[16, 32]>", "n": "i32",
                 "d2": "tensordesc<fp32[4, 8]>"}
    try:
        from triton.backends.driver import wrap_handle_tensordesc_impl
    except ImportError:
        from triton.backends.nvidia.driver import wrap_handle_tensordesc
        return (wrap_handle_tensordesc(lambda *a: calls.append(a), signature, None),
                c_launch_layout(CudaLauncher))

    def make(arg, meta, base):
        made.append(arg.base.data_ptr())
        return [("map", arg.base.data_ptr(), meta, len(base)), *arg.shape, *arg.strides]
    return wrap_handle_tensordesc_impl(lambda *a: calls.append(a), signature,
                                       [{"swizzle": 1}, {"swizzle": 2}], make), True


def test_descriptor_expansions_match_the_installed_tritons_own_wrapper():
    """A replay through the installed Triton's descriptor wrapper recognizes it and passes the
    C launch what the wrapper itself would, at new and at repeated addresses."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    from graphrt import kernel_utils
    x, y = torch.empty(64, 32), torch.empty(16, 8)
    template = ((1, 0), binding.DescriptorAt(0, 0, kernel_utils._recorded_argument(
        TensorDescriptor.from_tensor(x, [16, 32]))), 7, binding.DescriptorAt(
        1, 128, kernel_utils._recorded_argument(TensorDescriptor.from_tensor(y[4:], [4, 8]))))
    mine, theirs, made = [], [], []
    inner, packed = _installed_wrapper(mine, made)
    own, _ = _installed_wrapper(theirs, [])
    replayed = binding.Binding(((_Form(inner, packed), (2, 1, 1), "f", "m", 5, template),),
                               (), (), ("x", "y"))
    through_wrapper = binding.Binding(((_Form(own, packed), (2, 1, 1), "f", "m", 5, template),),
                                      (), (), ("x", "y"))
    through_wrapper._replays = tuple((own, leading, p, None, *rest)
                                     for _, leading, p, _, *rest in through_wrapper._replays)
    assert replayed._replays[0][3] is not None   # recognized
    for addresses in ([4096, 8192], [4096, 8192], [1 << 20, 8192]):
        replayed.launch(addresses)
        through_wrapper.launch(addresses)
        assert [list(a) if isinstance(a, list) else a for a in mine[-1]] == \
            [list(a) if isinstance(a, list) else a for a in theirs[-1]]
    if own.__closure__ and "make_tensordesc_arg" in own.__code__.co_freevars:
        # 3.9's wrapper, whose expansion is the one given: made once per new base address
        assert made == [4096, 8192 + 128, 1 << 20]


def test_launches_of_other_forms_are_replayed_as_recorded():
    """A packed form (Triton 3.9), a function of another shape or a descriptor the binding did
    not record as one leave the launch to its own function."""
    made, calls = [], []
    bound, inner = _descriptor_binding(made, calls)
    run, leading, packed = bound._replays[0][:3]
    template = bound.launches[0][5]
    assert binding._expanding_form((run, leading, True), template)[3] is None
    assert binding._expanding_form((lambda *a: None, leading, False), template)[3] is None
    assert binding._expanding_form((inner, leading, False),
                                   (*template[:3], 0))[3] is None   # a descriptor not rebuilt


# -- GPU -----------------------------------------------------------------------------------------
def _fresh(t):
    return t.copy_(torch.randn_like(t, dtype=torch.float32).to(t.dtype))


def _forward_checked(plan, x, w, y, rstd, stream=None):
    y.fill_(float("nan"))
    rstd.fill_(float("nan"))
    plan.execute(x, w, y=y, rstd=rstd, stream=stream)
    torch.cuda.synchronize()
    ref_y, ref_rstd, _ = rmsnorm_forward_reference(x, w, 1e-6, None)
    torch.testing.assert_close(y.float(), ref_y.float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(rstd, ref_rstd.reshape(rstd.shape), rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_replayed_forward_reads_fresh_data_and_follows_new_buffers(seed):
    rows, hidden = 300, 1024
    x = torch.randn(rows, hidden, dtype=torch.bfloat16, device="cuda")
    w = 1 + 0.1 * torch.randn(hidden, device="cuda")
    y, rstd = torch.empty_like(x), torch.empty(rows, device="cuda")
    plan = RmsNormForward(x, w).compile()
    for _ in range(3):   # the first records, the others replay on new data
        _forward_checked(plan, _fresh(x), w, y, rstd)
    assert plan._bindings.hits >= 2
    x2, y2 = torch.randn(rows // 2, hidden, dtype=torch.bfloat16, device="cuda"), None
    y2, rstd2 = torch.empty_like(x2), torch.empty(rows // 2, device="cuda")
    for _ in range(2):   # other buffers, another row count: a binding of their own
        _forward_checked(plan, _fresh(x2), w, y2, rstd2)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        _forward_checked(plan, _fresh(x), w, y, rstd)      # another current stream
    _forward_checked(plan, _fresh(x), w, y, rstd, stream=side)  # an explicit stream


def _bound_forward():
    """A forward plan with a binding (its second call replayed), and the call's tensors."""
    x = torch.randn(64, 512, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(512, device="cuda")
    y, rstd = torch.empty_like(x), torch.empty(64, device="cuda")
    plan = RmsNormForward(x, w).compile()
    for _ in range(2):
        plan.execute(x, w, y=y, rstd=rstd)
    assert plan._bindings.hits == 1
    return plan, x, w, y, rstd


@pytest.mark.gpu
def test_a_rejected_call_after_a_binding_still_raises_and_writes_nothing(seed):
    plan, x, w, y, rstd = _bound_forward()
    y_over_x = x.view(torch.bfloat16)   # the output is the input
    before = x.clone()
    with pytest.raises(ContractError, match="overlaps"):
        plan.execute(x, w, y=y_over_x, rstd=rstd)
    with pytest.raises(ContractError, match="rstd"):
        plan.execute(x, w, y=y, rstd=rstd[:10])
    with pytest.raises(TypeError):
        plan.execute(x, w, y=y, rstd=rstd, sed=1)
    torch.cuda.synchronize()
    assert torch.equal(x, before)


@pytest.mark.gpu
def test_replayed_backward_matches_the_reference_each_step(seed):
    rows, hidden = 257, 2048
    x = torch.randn(rows, hidden, dtype=torch.bfloat16, device="cuda")
    w = 1 + 0.1 * torch.randn(hidden, device="cuda")
    g = torch.randn_like(x)
    _, rstd = graphrt.ops.rmsnorm_forward(x, w)
    dx, dw = torch.empty_like(x), torch.empty(hidden, device="cuda")
    plan = RmsNormBackward(g, x, w, rstd).compile()
    ws = torch.empty(plan.workspace_bytes(), dtype=torch.uint8, device="cuda")
    for _ in range(3):
        _fresh(g)
        dx.fill_(float("nan"))
        dw.fill_(float("nan"))
        plan.execute(g, x, w, rstd, dx=dx, dw=dw, workspace=ws)
        ref_dx, ref_dw = rmsnorm_backward_reference(g, x, w, rstd, None)
        torch.testing.assert_close(dx.float(), ref_dx.float(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(dw, ref_dw.float(), rtol=1e-4, atol=1e-3)
    assert plan._bindings.hits >= 2


@pytest.mark.gpu
def test_launch_hooks_see_replayed_plans(seed):
    from triton import knobs
    plan, x, w, y, rstd = _bound_forward()
    seen = []

    def hook(metadata):
        seen.append(metadata.get()["name"])
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        plan.execute(x, w, y=y, rstd=rstd)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert len(seen) == 1 and "rmsnorm" in seen[0]


@pytest.mark.gpu
def test_replayed_dropout_follows_the_seed_and_graph_capture(seed):
    n, d = 256, 128
    x, u = (torch.randn(n, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    weight = torch.randn(d, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(d, dtype=torch.bfloat16, device="cuda")
    outs = hstu_lmsd_forward(x, u, weight, bias, dropout_ratio=0.3, seed=1, offset=0)
    plan = HstuLmsdForward(x, u, weight, bias, dropout_ratio=0.3).compile()
    buffers = {k: torch.empty_like(v) for k, v in zip(("y", "mean", "rstd", "mask"), outs)}
    masks = []
    for step_seed in (1, 2, 1):
        plan.execute(x, u, weight, bias, seed=step_seed, offset=0, **buffers)
        masks.append(buffers["mask"].clone())
    assert torch.equal(masks[0], masks[2]) and not torch.equal(masks[0], masks[1])
    assert torch.equal(masks[0], outs.mask) and torch.equal(buffers["y"], hstu_lmsd_forward(
        x, u, weight, bias, dropout_ratio=0.3, seed=1, offset=0).y)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        plan.execute(x, u, weight, bias, seed=2, offset=0, **buffers)  # recorded on this stream
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.graph(graph):
        plan.execute(x, u, weight, bias, seed=2, offset=0, **buffers)
    for v in buffers.values():
        v.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(buffers["mask"], masks[1])
    bwd = HstuLmsdBackward(torch.randn_like(buffers["y"]), x, u, weight, bias, buffers["mean"],
                           buffers["rstd"], buffers["mask"], dropout_ratio=0.3,
                           apply_u_silu=True, concat_u=True, concat_x=True).compile()
    assert bwd._bindings is not None


@pytest.mark.gpu
def test_bound_functional_calls_follow_data_shapes_backend_and_store(seed, monkeypatch):
    rt = graphrt.Runtime("cuda")
    w = 1 + 0.1 * torch.randn(1024, device="cuda")
    for rows in (64, 300, 64, 300, 64):   # two kinds, each bound after its first call
        x = torch.randn(rows, 1024, dtype=torch.bfloat16, device="cuda")
        g = torch.randn_like(x)
        y, rstd = graphrt.ops.rmsnorm_forward(x, w, runtime=rt)
        dx, dw = graphrt.ops.rmsnorm_backward(g, x, w, rstd, runtime=rt)
        ref_y, ref_rstd, _ = rmsnorm_forward_reference(x, w, 1e-6, None)
        ref_dx, ref_dw = rmsnorm_backward_reference(g, x, w, rstd, None)
        # bound calls make their outputs from the recorded shapes, without the spec
        assert [(tuple(t.shape), t.dtype, t.device.type, t.is_contiguous())
                for t in (y, rstd, dx, dw)] == [
            ((rows, 1024), torch.bfloat16, "cuda", True), ((rows,), torch.float32, "cuda", True),
            ((rows, 1024), torch.bfloat16, "cuda", True), ((1024,), torch.float32, "cuda", True)]
        torch.testing.assert_close(y.float(), ref_y.float(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(dx.float(), ref_dx.float(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(dw, ref_dw.float(), rtol=1e-4, atol=1e-3)
    assert len(rt._bound_calls) == 4
    assert rt.plans.stats()["compiles"] == 2 and rt.plans.stats()["hits"] >= 6
    monkeypatch.setenv("GRAPHRT_BACKEND", "reference")   # another backend: another plan
    graphrt.ops.rmsnorm_forward(x, w, runtime=rt)
    assert rt.plans.stats()["compiles"] == 3
    monkeypatch.delenv("GRAPHRT_BACKEND")
    rt.plans.clear()                                      # plans gone: bound calls too
    y2, _ = graphrt.ops.rmsnorm_forward(x, w, runtime=rt)
    assert rt.plans.stats()["compiles"] == 4 and torch.equal(y2, y)


def _hstu_backward_call(rt):
    """A functional HSTU backward call on ``rt`` (8192 x 256, dropout, every segment) over
    fresh random inputs: a bound call with a workspace region and counters."""
    n, d = 8192, 256
    x, u = (torch.randn(n, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    weight, bias = (torch.randn(d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    flags = dict(dropout_ratio=0.1, apply_u_silu=True, concat_u=True, concat_x=True)
    y, mean, rstd, mask = graphrt.ops.hstu_lmsd_forward(
        x, u, weight, bias, **flags, seed=3, offset=0, runtime=rt)
    dy = torch.randn_like(y)

    def call():
        return graphrt.ops.hstu_lmsd_backward(dy, x, u, weight, bias, mean, rstd, mask, **flags,
                                              runtime=rt)
    return call


@pytest.mark.gpu
def test_a_bound_call_captured_on_its_own_stream_lends_the_graph_its_workspace(seed,
                                                                              monkeypatch):
    """A bound call keeps its workspace region (and its counters) across eager calls; captured
    on the same stream it lends the graph a region of the graph's own, so replays on another
    stream run beside eager calls without sharing scratch: both equal the eager result,
    bitwise, with the outputs poisoned."""
    monkeypatch.delenv("GRAPHRT_KEEP_WORKSPACE", raising=False)   # the default keeps
    rt = graphrt.Runtime("cuda")
    call = _hstu_backward_call(rt)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        expected = [call() for _ in range(3)][-1]
    torch.cuda.synchronize()
    kept = rt.arena.stats()["kept_bytes"]
    assert kept > 0
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        captured = call()
    assert rt.arena.stats()["kept_bytes"] == kept and rt.arena.stats()["pinned_bytes"] > 0
    assert not any(r.kept for r in rt.arena._pinned.regions)
    side = torch.cuda.Stream()
    for _ in range(3):
        torch.cuda.synchronize()
        for t in captured:
            t.fill_(float("nan"))
        side.wait_stream(torch.cuda.current_stream())
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            graph.replay()
        with torch.cuda.stream(s):
            eager = call()
        torch.cuda.synchronize()
        for want, got, replayed in zip(expected, eager, captured):
            assert torch.equal(got, want) and torch.equal(replayed, want)
    assert rt.arena.counter_map().count_nonzero().item() == 0


@pytest.mark.gpu
def test_a_kept_region_taken_back_on_another_stream_waits_for_its_last_launch(seed,
                                                                                monkeypatch):
    """A take on another stream that needs a kept region's room takes it back and waits for
    the bound call's last launch in it (queued behind a GPU sleep) before it overwrites it;
    the call then lends. Every result equals the first, bitwise; every counter ends zero."""
    monkeypatch.delenv("GRAPHRT_KEEP_WORKSPACE", raising=False)   # the default keeps
    rt = graphrt.Runtime("cuda")
    call = _hstu_backward_call(rt)
    expected = [call() for _ in range(3)][-1]
    torch.cuda.synchronize()
    assert rt.arena.stats()["kept_bytes"] > 0
    torch.cuda._sleep(int(2e9 * 0.05))   # 50 ms of GPU time before the kept region's launch
    behind = call()
    other = torch.cuda.Stream()
    with torch.cuda.stream(other), rt.arena.scope():
        room = rt.arena.take(rt.arena.capacity - 256, other)   # fits only without it
        room.fill_(255)
    assert rt.arena.stats()["kept_bytes"] == 0
    lent = call()
    torch.cuda.synchronize()
    for want, first, then in zip(expected, behind, lent):
        assert torch.equal(first, want) and torch.equal(then, want)
    assert rt.arena.counter_map().count_nonzero().item() == 0


@pytest.mark.gpu
def test_bound_dropout_calls_follow_the_seed(seed):
    n, d = 256, 128
    x, u = (torch.randn(n, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    weight, bias = (torch.randn(d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    masks = [hstu_lmsd_forward(x, u, weight, bias, dropout_ratio=0.3, seed=s, offset=0).mask
             for s in (1, 2, 1, 2, 1)]
    assert all(torch.equal(masks[0], m) for m in masks[2::2])
    assert torch.equal(masks[1], masks[3]) and not torch.equal(masks[0], masks[1])


@pytest.mark.gpu
def test_functional_dropout_with_a_new_int_seed_each_call_replays_one_binding(seed):
    """A training loop's dropout: a new int seed and offset every call are served by one
    bound call, each mask equal to the reference's Philox draws at that (seed, offset),
    outputs poisoned before each call."""
    from graphrt.ops.hstu.philox import dropout_mask
    rt = graphrt.Runtime("cuda")
    n, d = 256, 128
    x, u = (torch.randn(n, d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    weight, bias = (torch.randn(d, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    mask = torch.full((n, d), -1, dtype=torch.int8, device="cuda")
    for step, (s, off) in enumerate([(1, 0), (2, 0), (1 << 40, 5), (-3, 1 << 33), (2, 0)]):
        mask.fill_(-1)
        out = hstu_lmsd_forward(x, u, weight, bias, dropout_ratio=0.3, seed=s, offset=off,
                                mask=mask, runtime=rt)
        expected = dropout_mask(n, d, 0.3, s, off, (True, True, True), device="cuda")
        assert torch.equal(out.mask, expected), (s, off)
    plan = next(iter(rt._bound_calls.values())).plan
    assert len(rt._bound_calls) == 1 and len(plan._bindings.recorded) == 1
    assert rt.plans.stats()["compiles"] == 1


@pytest.mark.gpu
def test_every_functional_call_of_the_host_bench_is_served_bound():
    """Each functional case `graphrt bench host` times (every op's sample call, and the
    wgrad's ragged, MXFP8 and K-K variants), after two calls, is served by a bound call (the
    AdamW step, whose lists have no binding key, by its recent call): none of three more
    takes the runtime's full path. A Triton whose launches cannot be bound would leave these
    calls 10-15 us slower, with every result still right."""
    from graphrt.bench.host import full_path_calls, op_cases
    device = torch.device("cuda", torch.cuda.current_device())
    rt = graphrt.runtime(device)   # the bench's calls use the default runtime
    rt._bound_calls.clear()   # earlier tests' calls: none cleared to make room during this one
    cases = {name: fn for name, fn in op_cases(device).items() if ": functional" in name}
    for fn in cases.values():
        fn()
        fn()
    taken = {name: full_path_calls(fn, rt, calls=3) for name, fn in cases.items()}
    assert all(n == "0/3" for n in taken.values()), taken


def _fill_fresh(t):
    if t.dtype == torch.uint8:   # E8M0 scales near 2^0
        t.copy_(torch.randint(124, 130, t.shape, device=t.device))
    elif t.dtype == torch.float8_e4m3fn:
        t.copy_(torch.randn(t.shape, device=t.device).to(t.dtype))
    else:
        _fresh(t)


def _bound_equals_unbound(plan_cls, inputs: dict, outputs: dict, flags: dict, keywords=(),
                          fill=None, workspace_bytes=None):
    """``plan_cls``'s bound execute (launches with tensor descriptors replayed) against the
    same plan unbound (every call in full), bitwise, with fresh inputs and poisoned outputs:
    three calls in the same buffers, then two in new buffers of the same kind. Inputs named
    in ``keywords`` are passed by keyword; ``fill`` (name: function) refills those inputs
    instead of random values; ``workspace_bytes`` (a function of the plan) sizes the
    workspace, else ``workspace_bytes()``."""
    fill = fill or {}
    def call(plan, inputs, **kw):
        positional = [v for k, v in inputs.items() if k not in keywords]
        return plan(*positional, **{k: inputs[k] for k in keywords}, **kw)
    bound = call(plan_cls, inputs, **flags).compile()
    unbound = call(plan_cls, inputs, **flags).compile()
    unbound._bindings = None
    assert bound._bindings is not None
    for buffers in range(2):
        if buffers:
            inputs = {k: torch.empty_like(v) for k, v in inputs.items()}
            outputs = {k: torch.empty_like(v) for k, v in outputs.items()}
        workspaces = [torch.empty((workspace_bytes or type(p).workspace_bytes)(p),
                                  dtype=torch.uint8, device="cuda") for p in (bound, unbound)]
        for _ in range(3 - buffers):
            for name, t in inputs.items():
                fill.get(name, _fill_fresh)(t)
            results = []
            for plan, ws in zip((bound, unbound), workspaces):
                mine = {k: torch.full_like(v.view(torch.uint8), 0xFF).view(v.dtype)
                        for k, v in outputs.items()}
                call(plan.execute, inputs, **mine, workspace=ws)
                results.append(mine)
            torch.cuda.synchronize()
            for k in outputs:
                assert torch.equal(results[0][k].view(torch.uint8),
                                   results[1][k].view(torch.uint8)), k
    assert bound._bindings.hits >= 3
    return bound, inputs, outputs


@pytest.mark.gpu
def test_bound_mhc_backward_rebuilds_its_tensor_descriptors(seed):
    from graphrt.ops import MhcProjectionBackward
    t, k, n, n_pad = 300, 2048, 24, 32
    inputs = dict(x=torch.empty(t, k, dtype=torch.bfloat16, device="cuda"),
                  weight=torch.empty(n, k, device="cuda"),
                  grad_proj=torch.empty(t, n_pad, device="cuda"),
                  grad_r=torch.empty(t, 1, device="cuda"),
                  r=torch.empty(t, 1, device="cuda"))
    outputs = dict(dx=torch.empty(t, k, dtype=torch.bfloat16, device="cuda"),
                   dweight=torch.empty(n, k, device="cuda"))
    plan, inputs, outputs = _bound_equals_unbound(MhcProjectionBackward, inputs, outputs,
                                                  dict(allow_tf32=True))
    from graphrt.kernel_utils import ON_TESTED_TRITON
    expanding = [r[3] is not None for b in plan._bindings.recorded.values() for r in b._replays]
    if ON_TESTED_TRITON:   # 3.6's, 3.7's and 3.9's descriptor wrappers: replays pass kept expansions
        assert any(expanding)
    before = inputs["x"].clone()
    with pytest.raises(ContractError, match="overlaps"):   # dx over x, after the binding
        plan.execute(*inputs.values(), dx=inputs["x"], dweight=outputs["dweight"],
                     workspace=torch.empty(plan.workspace_bytes(), dtype=torch.uint8,
                                           device="cuda"))
    torch.cuda.synchronize()
    assert torch.equal(inputs["x"], before)


def _projection_kernel(kernel: str, monkeypatch) -> None:
    """Makes the projection's plans take ``kernel``: "cute" (the CuTe DSL kernel, skipped
    where nvidia-cutlass-dsl is missing) or "gluon" (the DSL hidden from the plan, so it takes
    the Gluon kernel, whose launches pass host tensor descriptors)."""
    from graphrt.ops.proj_rope import plan as proj_plan
    if kernel == "cute":
        pytest.importorskip("graphrt.ops.proj_rope.kernels_cute",
                            reason="nvidia-cutlass-dsl is not installed")
        return
    from graphrt.ops.proj_rope.kernels_ws import GLUON_API_OK
    if not GLUON_API_OK:
        pytest.skip("the Gluon kernel needs a tested Triton")
    real = proj_plan.hopper_module
    monkeypatch.setattr(proj_plan, "hopper_module", lambda package, module, capability: (
        None if module == "kernels_cute" else real(package, module, capability)))


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["gluon", "cute"])
@pytest.mark.parametrize("mx", [False, True])
def test_bound_projection_equals_unbound(seed, mx, kernel, monkeypatch):
    """The Gluon kernel's launches rebuild their tensor descriptors; the CuTe DSL kernel's are
    replayed through its packed launch (graphrt.cute_launch)."""
    from graphrt.ops import GemmProjRopeMxfp8
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("both kernels run on Hopper")
    _projection_kernel(kernel, monkeypatch)
    t, k, heads, nope, rope = 256, 1024, 4, 128, 64
    d = nope + rope
    operand = torch.float8_e4m3fn if mx else torch.bfloat16
    inputs = dict(x=torch.empty(t, k, dtype=operand, device="cuda"),
                  w=torch.empty(heads * d, k, dtype=operand, device="cuda"),
                  cos=torch.empty(t, rope, dtype=torch.bfloat16, device="cuda"),
                  sin=torch.empty(t, rope, dtype=torch.bfloat16, device="cuda"))
    keywords = ()
    if mx:
        inputs.update(x_scale=torch.empty(t, k // 32, dtype=torch.uint8, device="cuda"),
                      w_scale=torch.empty(heads * d, k // 32, dtype=torch.uint8, device="cuda"))
        keywords = ("x_scale", "w_scale")
    outputs = dict(
        out_fp8_row=torch.empty(t, heads, d, dtype=torch.float8_e4m3fn, device="cuda"),
        out_scales_row=torch.empty(t, heads, d // 32, dtype=torch.uint8, device="cuda"),
        out_fp8_col=torch.empty(t, heads, d, dtype=torch.float8_e4m3fn, device="cuda"),
        out_scales_col=torch.empty(t // 32, heads, d, dtype=torch.uint8, device="cuda"))
    plan, _, _ = _bound_equals_unbound(GemmProjRopeMxfp8, inputs, outputs,
                                       dict(qk_nope_dim=nope, qk_rope_dim=rope), keywords)
    described = {"gluon": "warp-specialized", "cute": "CuTe DSL"}[kernel]
    assert plan.describe()["kernel"].startswith(described), plan.describe()["kernel"]


def _new_routing(tokens: int):
    """Refills int32 offsets with a new random routing of ``tokens``, empty experts included."""
    def fill(offsets):
        cuts = torch.randint(0, tokens + 1, (offsets.numel() - 1,), device=offsets.device)
        ends = torch.cat([cuts.sort().values, torch.tensor([tokens], device=offsets.device)])
        offsets.copy_(ends.to(torch.int32))
    return fill


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["k n", "m k", "k k ragged", "k k ragged rows", "fp8 1x128",
                                  "fp8 mx"])
def test_bound_wgrad_follows_new_routing_in_every_layout(seed, case):
    from graphrt.ops import GroupedGemmWgrad
    hidden, inter, tokens, experts = 256, 128, 1000, 5
    fp8 = case.startswith("fp8")
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    a = torch.empty(hidden, tokens, dtype=dtype, device="cuda")
    b = torch.empty(inter, tokens, dtype=dtype, device="cuda").t()
    if case == "m k":
        a = torch.empty(tokens, hidden, dtype=dtype, device="cuda").t()
    if case == "k n":
        b = torch.empty(tokens, inter, dtype=dtype, device="cuda")
    if case.startswith("k k ragged"):
        a, b = a.contiguous().view(hidden, tokens), b.contiguous().view(tokens, inter)
    inputs = dict(a=a, b=b, offsets=torch.empty(experts, dtype=torch.int32, device="cuda"))
    flags, keywords = {}, ()
    if case.startswith("k k ragged"):
        flags = dict(input_order="tensor_ragged")
    if fp8:
        block = 128 if case == "fp8 1x128" else 32
        scale = torch.float32 if block == 128 else torch.uint8
        blocks = -(-tokens // block)
        inputs.update(a_scale=torch.empty(hidden, blocks, dtype=scale, device="cuda"),
                      b_scale=torch.empty(blocks, inter, dtype=scale, device="cuda"))
        keywords = ("a_scale", "b_scale")
    outputs = dict(wgrad=torch.empty(experts, hidden, inter, dtype=torch.bfloat16,
                                     device="cuda"))
    # "rows": the ragged experts off 16-byte rows copied as rows into the workspace first
    rows = (lambda p: p.call_workspace_bytes(tokens)) if case.endswith("rows") else None
    plan, _, _ = _bound_equals_unbound(GroupedGemmWgrad, inputs, outputs, flags, keywords,
                                       fill={"offsets": _new_routing(tokens)},
                                       workspace_bytes=rows)
    if case == "k n":   # bad routing on a bound call: flagged on the device, as unbound
        graphrt.check_errors()
        bad = torch.tensor([10, 5, 600, 700, tokens], dtype=torch.int32, device="cuda")
        plan.execute(inputs["a"], inputs["b"], bad, wgrad=outputs["wgrad"])
        with pytest.raises(graphrt.DeviceCheckError, match="below its begin"):
            graphrt.check_errors()
        with env(GRAPHRT_VALIDATE_OFFSETS="1"):   # read per call: the binding steps aside
            with pytest.raises(ContractError, match="non-decreasing"):
                plan.execute(inputs["a"], inputs["b"], bad, wgrad=outputs["wgrad"])


@pytest.mark.gpu
def test_bound_wgrad_writes_through_each_calls_address_table(seed):
    from graphrt.ops import GroupedGemmWgrad
    hidden, inter, tokens, experts = 128, 256, 512, 4
    a = torch.randn(hidden, tokens, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(tokens, inter, dtype=torch.bfloat16, device="cuda")
    offsets = torch.tensor([100, 100, 300, tokens], dtype=torch.int32, device="cuda")
    plan = GroupedGemmWgrad(a, b, offsets, output_mode="discrete").compile()
    expected = graphrt.ops.grouped_gemm_wgrad(a, b, offsets).wgrad
    for _ in range(3):   # new per-expert buffers every call, through the same binding
        blocks = [torch.full((hidden, inter), float("nan"), dtype=torch.bfloat16,
                             device="cuda") for _ in range(experts)]
        table = torch.tensor([t.data_ptr() for t in blocks], dtype=torch.int64, device="cuda")
        plan.execute(a, b, offsets, wgrad_ptrs=table)
        torch.cuda.synchronize()
        assert all(torch.equal(t, e) for t, e in zip(blocks, expected))
    assert plan._bindings.hits == 2
    with pytest.raises(ContractError, match="overlaps"):   # the table over an input
        plan.execute(a, b, offsets, wgrad_ptrs=a.view(torch.int64)[0, :experts])
    rt = graphrt.Runtime("cuda")
    for _ in range(2):   # a functional call that builds its table is never a bound call
        graphrt.ops.grouped_gemm_wgrad(a, b, offsets, output_mode="discrete",
                                       check_offsets=False, runtime=rt)
    assert not rt._bound_calls


@pytest.mark.gpu
def test_bound_functional_wgrad_follows_routing_data_and_output_dtype(seed):
    """The functional wgrad (its wgrad_dtype keyword a dtype) is served by a bound call after
    the first call of each kind: new routing, new data and each output dtype match the
    per-expert reference (FP32 sums), in memory that held NaN just before."""
    from graphrt.ops.grouped_gemm.reference import grouped_gemm_wgrad_reference
    rt = graphrt.Runtime("cuda")
    hidden, inter, tokens, experts = 256, 128, 1000, 5
    offsets = torch.empty(experts, dtype=torch.int32, device="cuda")
    refill = _new_routing(tokens)
    for call in range(6):
        a = torch.randn(tokens, hidden, dtype=torch.bfloat16, device="cuda").t()
        b = torch.randn(tokens, inter, dtype=torch.bfloat16, device="cuda")
        refill(offsets)
        dtype = (torch.bfloat16, torch.float32)[call % 2]
        torch.empty(experts, hidden, inter, dtype=dtype, device="cuda").fill_(float("nan"))
        (wgrad,) = graphrt.ops.grouped_gemm_wgrad(a, b, offsets, wgrad_dtype=dtype,
                                                  check_offsets=False, runtime=rt)
        expected = grouped_gemm_wgrad_reference(a.double(), b.double(), offsets,
                                                out_dtype=torch.float64)
        assert wgrad.dtype == dtype
        torch.testing.assert_close(wgrad.double(), expected, rtol=2e-2, atol=2e-2)
    assert len(rt._bound_calls) == 2 and rt.plans.stats()["compiles"] == 2


@pytest.mark.gpu
def test_bound_functional_calls_with_given_outputs_check_overlap(seed):
    rt = graphrt.Runtime("cuda")
    x = torch.randn(64, 1024, dtype=torch.bfloat16, device="cuda")
    w = 1 + 0.1 * torch.randn(1024, device="cuda").to(torch.bfloat16)   # dw in w's dtype
    _, rstd = graphrt.ops.rmsnorm_forward(x, w, runtime=rt)
    for _ in range(3):
        g = torch.randn_like(x)
        dw = torch.full((1024,), float("nan"), dtype=torch.bfloat16, device="cuda")
        dx, dw_out = graphrt.ops.rmsnorm_backward(g, x, w, rstd, dw=dw, runtime=rt)
        assert dw_out is dw
        ref_dx, ref_dw = rmsnorm_backward_reference(g, x, w, rstd, None)
        torch.testing.assert_close(dx.float(), ref_dx.float(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(dw.float(), ref_dw.float(), rtol=2e-2, atol=2e-2)
    assert [c.given for c in rt._bound_calls.values()].count(True) == 1
    hits = rt.plans.stats()["hits"]
    before = g.clone()
    with pytest.raises(ContractError, match="overlaps"):   # dw over g, on the bound kind
        graphrt.ops.rmsnorm_backward(g, x, w, rstd, dw=g.view(-1)[:1024], runtime=rt)
    torch.cuda.synchronize()
    assert torch.equal(g, before) and rt.plans.stats()["hits"] == hits


def test_the_pre_bound_launch_recognizes_the_installed_triton():
    """The pre-bound launch reads Triton's own launch code and turns itself off where that
    differs; on the Triton releases graphrt is installed with (3.6 on the GPU image, 3.9 from
    CI's torch) it must be on, for Triton's and Gluon's kernels alike."""
    import triton
    from triton.runtime.jit import JITFunction

    from graphrt.kernel_utils import _direct_launch_supported, _Launcher
    assert _direct_launch_supported(), triton.__version__
    launcher = _Launcher()
    assert launcher._enable() and launcher._plain_run(JITFunction)
    try:
        from triton.experimental.gluon._runtime import GluonJITFunction
    except ImportError:   # a Triton without Gluon
        return
    assert launcher._plain_run(GluonJITFunction)


def test_every_launch_asks_for_the_tested_fp_fusion(monkeypatch):
    """Kernels launch with FP fusion on, as they were tested (3.9 warns that its default turns
    it off from 3.10 on); a launch's own keyword still wins."""
    from graphrt import kernel_utils
    seen = []
    monkeypatch.setattr(kernel_utils, "_launcher",
                        lambda kernel, grid, args, kwargs: seen.append(kwargs))
    kernel_utils.launch("kernel", (1,), 3, BLOCK=64, num_warps=4)
    kernel_utils.launch("kernel", (1,), 3, enable_fp_fusion=False)
    assert seen == [{"enable_fp_fusion": True, "BLOCK": 64, "num_warps": 4},
                    {"enable_fp_fusion": False}]


def test_the_direct_c_launch_passes_what_tritons_launcher_passes(monkeypatch):
    """DirectRun calls Triton's C launch itself for kernels without scratch: through
    ``compiled.run``, through its replay form and through the installed Triton's own
    ``CudaLauncher.__call__``, the C launch must receive the same arguments."""
    import triton
    from triton.backends.nvidia.driver import CudaLauncher

    from graphrt.kernel_utils import c_launch_layout, direct_run, DirectRun, ScratchRun
    assert c_launch_layout(CudaLauncher) is not None, triton.__version__
    monkeypatch.setattr(triton.runtime.driver, "_active", object(), raising=False)  # no GPU here
    received = []
    launcher = object.__new__(CudaLauncher)
    vars(launcher).update(launch=lambda *a: received.append(a), num_ctas=1,
                          global_scratch_size=0, global_scratch_align=1, profile_scratch_size=0,
                          profile_scratch_align=1, launch_cooperative_grid=False, launch_pdl=True,
                          arg_annotations=("annotations",), kernel_signature=b"signature",
                          gsan_enabled=False)
    compiled = type("Compiled", (), {"run": launcher})()
    kernel_args = (4096, 0.5, 1 << 40, None)
    launcher(3, 2, 1, 77, "function", "metadata", None, None, None, *kernel_args)
    run = direct_run(compiled)
    assert isinstance(run, DirectRun)
    run(3, 2, 1, 77, "function", "metadata", None, None, None, *kernel_args)
    c_launch, leading, packed = run.form((3, 2, 1), 77, "function", "metadata")
    c_launch(*leading, kernel_args) if packed else c_launch(*leading, *kernel_args)
    assert len(received) == 3 and received[0] == received[1] == received[2]
    launcher.global_scratch_size = 128   # a kernel that needs scratch keeps Triton's path
    assert direct_run(compiled) is launcher
    # ... with its scratch from the caching allocator of the kernel's device, for that call
    from triton.runtime import _allocation
    before = _allocation._allocator.get()
    run = direct_run(compiled, "cpu")
    assert isinstance(run, ScratchRun)
    run(3, 2, 1, 77, "function", "metadata", None, None, None, *kernel_args)
    scratch = next(a for a in received[-1] if isinstance(a, torch.Tensor))
    assert scratch.dtype == torch.uint8 and scratch.numel() == 3 * 2 * 1 * 128
    assert received[-1][-len(kernel_args):] == kernel_args or packed
    # the C launch receives what Triton's own launcher passes it, the scratch in its place
    from graphrt.kernel_utils import _scratch_allocator
    with _scratch_allocator("cpu"):
        launcher(3, 2, 1, 77, "function", "metadata", None, None, None, *kernel_args)

    def marked(call):
        return [type(a) if isinstance(a, torch.Tensor) else a for a in call]
    assert marked(received[-1]) == marked(received[-2])
    # a binding's replay calls it whole, so that every replayed launch gets its scratch:
    # the same on its stream, fresh ones under capture
    from graphrt.binding import _call_form
    function, leading, _ = _call_form(run, (3, 2, 1), 77, "function", "metadata")

    def replayed_scratch():
        function(*leading, *kernel_args)
        return next(a for a in received[-1] if isinstance(a, torch.Tensor))
    first = replayed_scratch()
    assert first.numel() == 3 * 2 * 1 * 128
    assert replayed_scratch() is first
    run.on_cuda = True
    monkeypatch.setattr(torch._C, "_cuda_isCurrentStreamCapturing", lambda: True)
    function, leading, _ = _call_form(run, (3, 2, 1), 77, "function", "metadata")
    captured = replayed_scratch(), replayed_scratch()
    assert captured[0] is not captured[1] and all(c is not first for c in captured)
    assert _allocation._allocator.get() is before


def test_a_bound_call_passes_inputs_fresh_outputs_and_workspace_where_recorded(monkeypatch):
    """The bound functional call's address pool (the call's tensors, the outputs it makes,
    the workspace) against the order the recorded binding takes them in, on stand-ins. The
    workspace is a region the call keeps: the same on every call, lent instead while a hold
    takes regions (a capture), given back when the call is dropped (the default; with
    GRAPHRT_KEEP_WORKSPACE=0 every call lends one)."""
    import sys
    from graphrt.plan import Plan
    runtime_module = sys.modules["graphrt.runtime"]   # graphrt.runtime is also a function
    monkeypatch.delenv("GRAPHRT_KEEP_WORKSPACE", raising=False)   # the default keeps
    monkeypatch.setattr(runtime_module, "current_stream", lambda device: None)
    empty_strided = torch.empty_strided

    def aligned(shape, strides, dtype, device):
        """A contiguous tensor on a 256-byte boundary, as CUDA allocations are (CPU ones are
        not)."""
        n = torch.Size(shape).numel() * dtype.itemsize
        buffer = empty_strided((n + 256,), (1,), dtype=torch.uint8, device=device)
        start = (-buffer.data_ptr()) % 256
        return buffer[start:start + n].view(dtype).view(shape)
    monkeypatch.setattr(torch, "empty_strided", aligned)

    class Recorded:
        def __init__(self):
            self.calls = []

        def launch(self, addresses, ints):
            self.calls.append(("launch", addresses, ints))

        def replay(self, addresses, ints):
            self.calls.append(("replay", addresses, ints))

    class Stand:
        output_names = ("y", "stats", "given")
        bindable = staticmethod(Plan.bindable)

        def __init__(self, nbytes):
            self.nbytes = nbytes

        def workspace_bytes(self):
            return self.nbytes

    rt = graphrt.Runtime("cpu")
    rt.arena.counter_map()
    for nbytes, given, counted in ((0, False, False), (512, True, False), (1024, False, True)):
        allocated = {"stats": aligned((3, 2), (2, 1), torch.float32, "cpu"),
                     "y": aligned((4,), (1,), torch.bfloat16, "cpu")}
        recorded = Recorded()
        # the binding takes: input 1, output y, the workspace (if any), input 0, output stats,
        # then the workspace region's counters (if counted)
        sources = (1, "y", *((None,) if nbytes else ()), 0, "stats",
                   *((runtime_module.COUNTERS,) if counted else ()))
        given_out = torch.empty(5)
        call = runtime_module._BoundCall(Stand(nbytes), recorded, sources, 0, allocated, given,
                                         n_inputs=2)
        call.low_bits = (0, 16)   # y recorded 16 bytes past a boundary: the full path instead
        assert call(rt, (), {"given": given_out}, [1000, 2000], [7]) is None
        assert not recorded.calls
        call = runtime_module._BoundCall(Stand(nbytes), recorded, sources, 0, allocated, given,
                                         n_inputs=2)   # recorded at the boundary
        result = call(rt, (), {"given": given_out}, [1000, 2000], [7])
        y, stats, out = result
        assert (tuple(y.shape), y.dtype, tuple(stats.shape), stats.dtype) == (
            (4,), torch.bfloat16, (3, 2), torch.float32)
        assert out is given_out and result.names == ("y", "stats", "given")
        kind, addresses, ints = recorded.calls[0]
        expected = [2000, y.data_ptr(), 1000, stats.data_ptr()]
        if nbytes:
            workspace = addresses[2]
            assert workspace % 256 == 0
            assert rt.arena.stats()["kept_bytes"] == nbytes and rt.arena.stats()["in_use"] == 0
            assert workspace + nbytes <= rt.arena._address + rt.arena.capacity   # at the top
            assert workspace >= rt.arena._address + rt.arena.capacity - nbytes - 256
            expected.insert(2, workspace)
        if counted:   # the kept region's own words
            expected.append(rt.arena.counter_address(workspace))
            assert expected[-1] == rt.arena.counter_map()[(workspace - rt.arena._address) // 256:]\
                .data_ptr()
        assert (kind, addresses, ints) == ("replay" if given else "launch", expected, [7])
        call(rt, (), {"given": given_out}, [1000, 2000], [7])
        if nbytes:
            assert recorded.calls[1][1][2] == workspace   # the kept region again
            with rt.arena.hold() as hold:   # a capture's regions are its graph's: lent
                call(rt, (), {"given": given_out}, [1000, 2000], [7])
            lent = recorded.calls[2][1][2]
            assert lent != workspace and hold.nbytes == nbytes
            if counted:
                assert recorded.calls[2][1][-1] == rt.arena.counter_address(lent)
            hold.release()
        del call, result, y, stats
        gc.collect()
        assert rt.arena.stats()["live_regions"] == rt.arena.stats()["kept_bytes"] == 0
    monkeypatch.setenv("GRAPHRT_KEEP_WORKSPACE", "0")   # turned off: lent around each call
    recorded = Recorded()
    call = runtime_module._BoundCall(Stand(512), recorded, (1, "y", None, 0, "stats"), 0,
                                     allocated, False, n_inputs=2)
    call(rt, (), {"given": given_out}, [1000, 2000], [7])
    assert recorded.calls and rt.arena.stats()["live_regions"] == 0


def _keeping_runtime(monkeypatch):
    """A CPU runtime whose bound calls keep their workspace (no CUDA stream), and a maker of
    bound calls of a stand-in plan (one input, a 2048-byte workspace) launching through the
    given recorder."""
    import sys
    from graphrt.arena.workspace import KEPT_SHARE
    from graphrt.plan import Plan
    runtime_module = sys.modules["graphrt.runtime"]
    monkeypatch.delenv("GRAPHRT_KEEP_WORKSPACE", raising=False)
    monkeypatch.setattr(runtime_module, "current_stream", lambda device: None)

    class Stand:
        output_names = ("out",)
        bindable = staticmethod(Plan.bindable)

        def workspace_bytes(self):
            return 2048
    return (graphrt.Runtime("cpu", arena_bytes=KEPT_SHARE * 4096),
            lambda recorded: runtime_module._BoundCall(Stand(), recorded, (0, None), 0, {},
                                                       False, n_inputs=1))


def test_a_bound_call_lends_once_the_arena_takes_its_kept_region_back(monkeypatch):
    """A take that needs a kept region's room takes it back unless its call is launching
    (another thread's take, made here from inside the launch, fails instead); from then on
    the call lends a region around its launches."""
    rt, bound_call = _keeping_runtime(monkeypatch)
    room = rt.arena.capacity - 1024   # fits only where no region is kept

    class Recorded:
        def __init__(self):
            self.workspaces, self.refused = [], 0

        def launch(self, addresses, ints):
            self.workspaces.append(addresses[1])
            if len(self.workspaces) == 1:   # a take beside the launch leaves the region
                with rt.arena.scope(), pytest.raises(graphrt.ArenaExhausted):
                    rt.arena.take(room)
                self.refused += 1

    recorded, out = Recorded(), torch.empty(3)
    call = bound_call(recorded)
    for _ in range(2):
        assert call(rt, (), {"out": out}, [1000], []).out is out
    kept = recorded.workspaces[0]
    assert recorded.refused == 1 and recorded.workspaces[1] == kept
    assert rt.arena.stats()["kept_bytes"] == 2048
    with rt.arena.scope():
        assert rt.arena.take(room).data_ptr() == rt.arena._address   # taken back
    assert rt.arena.stats()["kept_bytes"] == 0
    call(rt, (), {"out": out}, [1000], [])
    assert recorded.workspaces[2] == rt.arena._address   # lent, at the bottom
    assert rt.arena.stats()["live_regions"] == 0
    del call
    gc.collect()
    assert rt.arena.stats()["live_regions"] == 0


def test_a_kept_region_is_never_taken_back_while_another_thread_launches_in_it(monkeypatch):
    """Threads switching every microsecond: one calls a bound call that keeps its region, the
    other takes the room that only the kept region's absence leaves. Every launch in the kept
    region finds it still kept; once it is taken back the call lends."""
    import sys
    import threading
    rt, bound_call = _keeping_runtime(monkeypatch)

    class Recorded:
        def __init__(self):
            self.kept, self.launches, self.bad = None, [0, 0], 0   # launches: lent, kept

        def launch(self, addresses, ints):
            if self.kept is None:   # the first call's: the region it keeps
                self.kept = (addresses[1], next(r for r in rt.arena._regions if r.kept))
            in_kept = addresses[1] == self.kept[0]
            self.launches[in_kept] += 1
            self.bad += in_kept and self.kept[1].released

    def caller(call, stop):
        while not stop.is_set():
            try:
                call(rt, (), {"out": out}, [1000], [])
            except graphrt.ArenaExhausted:   # a lend while the other thread holds the room
                pass

    out, interval = torch.empty(3), sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(20):
            recorded, stop = Recorded(), threading.Event()
            call = bound_call(recorded)
            call(rt, (), {"out": out}, [1000], [])
            thread = threading.Thread(target=caller, args=(call, stop))
            thread.start()
            while recorded.launches[1] < 20:
                pass
            taken = 0
            while not taken or recorded.launches[0] < 5:
                with rt.arena.scope():
                    try:
                        rt.arena.take(rt.arena.capacity - 1024)
                        taken += 1
                    except graphrt.ArenaExhausted:   # the call was launching in its region
                        pass
            stop.set()
            thread.join()
            assert recorded.bad == 0
            assert rt.arena.stats()["kept_bytes"] == 0 and rt.arena.stats()["live_regions"] == 0
            del call
    finally:
        sys.setswitchinterval(interval)


def test_a_bound_functional_call_gets_the_matcher_of_its_key(monkeypatch):
    """``Runtime._bind_call`` builds the bound call's CallMatcher from what ``_call_key``
    found (its binding key and tensor positions), on stand-ins: it serves the call and turns
    away one with another scalar."""
    import sys
    runtime_module = sys.modules["graphrt.runtime"]
    _, rt, x, _, _, _ = _served_stand_in(monkeypatch, "stand_in_matcher")
    (call,) = rt._bound_calls.values()
    args, kwargs = (x,), {"eps": 1e-6, "scale": 2, "y": None}
    _, addresses, ints, _ = runtime_module._call_key(type(call.plan), args, kwargs)
    assert call.binding is next(iter(call.plan._bindings.recorded.values()))
    assert call.matcher.match(args, kwargs) == (addresses, ints)
    assert call.matcher.match(args, {**kwargs, "eps": 1e-5}) is None


def _at_256(n: int, dtype=torch.float32, requires_grad=False) -> torch.Tensor:
    """``n`` zeros of ``dtype`` starting on a 256-byte boundary, as CUDA allocations do (CPU
    ones need not): every such tensor has the same address bits."""
    buffer = torch.zeros(n + 256, dtype=dtype, requires_grad=requires_grad)
    start = -buffer.data_ptr() % 256 // buffer.element_size()
    return buffer[start:start + n]


def _served_stand_in(monkeypatch, name: str, before_run=None):
    """A stand-in plan class with a functional call (``y = f(x, eps=..., scale=...)``, and
    ``check=True`` for ``before_run``, idle when False) whose runtime holds one recent bound
    call of the kind ``(x, eps=1e-6, scale=2)``: (functional, runtime, x, what its binding
    launched, what took the full path, a function that binds that kind of call on the calling
    thread's stream as the first call of that kind there would)."""
    import math
    import sys
    from graphrt.contract import row_spec
    from graphrt.opspec import OpSpec, Option, Output, Tensor, like
    from graphrt.plan import Plan
    runtime_module = sys.modules["graphrt.runtime"]
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(binding, "_current_raw_stream", lambda index: 7)
    launched, full = [], []

    class Recorded:
        def launch(self, addresses, ints):
            launched.append(list(addresses))

        replay = launch

    class Stand(Plan):
        records_launches = True
        output_names, also_written, run_time_ints = ("y",), (), {}

        def workspace_bytes(self):
            return 0

    checked = (Option("check", True, to_plan=False),) if before_run else ()
    spec = OpSpec(name, Stand, (Tensor("x", row_spec),),
                  (Option("eps", 1e-6, lambda n, v: v), Option("scale", 2, lambda n, v: v),
                   *checked),
                  (Output("y", **like("x")),), doc="a stand-in", before_run=before_run,
                  before_run_idle=(lambda check: check is False) if before_run else None)

    def aligned(shape, strides, *, dtype, device):   # as the CUDA allocator aligns
        return _at_256(math.prod(shape), dtype).view(shape)
    monkeypatch.setattr(torch, "empty_strided", aligned)
    x = aligned((16,), (1,), dtype=torch.bfloat16, device="cpu")
    y = aligned((16,), (1,), dtype=torch.bfloat16, device="cpu")
    args, kwargs = (x,), {"eps": 1e-6, "scale": 2, "y": None}
    plan = object.__new__(Stand)
    plan._checked = True
    plan._bindings = type("Bindings", (), {"recorded": {}})()
    rt = graphrt.Runtime("cpu")

    def bind():
        call_key, _, ints, positions = runtime_module._call_key(Stand, args, kwargs)
        executed = binding.binding_key(args, {"y": y, "workspace": None, "stream": None}, {})
        plan._bindings.recorded[executed[0]] = Recorded()
        on_cuda, rt._on_cuda = rt._on_cuda, False   # no CUDA stream to read here
        rt._bind_call(call_key, plan, args, kwargs, {"y": y}, {"y": y}, None, None, ints,
                      positions)
        rt._on_cuda = on_cuda
        assert rt._recent_calls[Stand].matcher is not None
    bind()
    rt._on_cuda = True   # as the stand-in's tensors pretend: Runtime.run serves their calls
    monkeypatch.setattr(rt, "_run", lambda *a, **k: full.append(a[2]) or "full path")
    return spec.functional, rt, x, launched, full, bind


def test_a_functional_call_is_served_by_its_recent_bound_call_on_its_own_values(monkeypatch):
    """The functional call's served path (``_BoundCall.serve_as``): a call of the recorded
    kind launches the binding at the call's addresses with a fresh output, taking no other
    path; a call with another value of any option, another kind of value, an output passed,
    another stream or another store version is turned away to the keyed path."""
    functional, rt, x, launched, full, _ = _served_stand_in(monkeypatch, "stand_in_served")
    served = functional(x, eps=1e-6, runtime=rt)
    assert not full and len(launched) == 1
    y = served.y
    assert y.shape == x.shape and y.dtype == x.dtype and y.data_ptr() != x.data_ptr()
    assert launched[0] == [x.data_ptr(), y.data_ptr()]
    for kwargs in ({"eps": 1e-5}, {"scale": 3}, {"scale": 2.0}, {"scale": True},
                   {"y": torch.empty_like(x)}):
        assert functional(x, runtime=rt, **kwargs) == "full path", kwargs
    other_x = torch.empty(16, dtype=torch.float32)
    assert functional(other_x, runtime=rt) == "full path"
    assert functional(x, runtime=rt, stream=5) == "full path"   # a stream passed: never served
    assert len(full) == 7 and len(launched) == 1
    monkeypatch.setattr(binding, "_current_raw_stream", lambda index: 8)
    assert functional(x, runtime=rt) == "full path"
    monkeypatch.setattr(binding, "_current_raw_stream", lambda index: 7)
    rt.plans.clear()   # the store's version moves on
    assert functional(x, runtime=rt) == "full path"
    assert len(full) == 9 and len(launched) == 1


def test_a_recent_call_recorded_with_other_keywords_serves_no_functional_call(monkeypatch):
    """A bound call recorded through ``Runtime.run`` with keywords other than the functional
    call's serves none of its calls: they go on to the keyed path, which here finds the same
    bound call by its key, and that makes it a matcher of the functional call's keywords."""
    import sys
    runtime_module = sys.modules["graphrt.runtime"]
    functional, rt, x, launched, full, _ = _served_stand_in(monkeypatch, "stand_in_other_names")
    (call,) = rt._recent_calls.values()
    others = (x,), {"eps": 1e-6, "scale": 2, "out": None}   # a Runtime.run caller's
    call.matcher = binding.call_matcher(*others, binding.binding_key(*others)[0], [0])
    keyed = []
    real_key = runtime_module._call_key
    monkeypatch.setattr(runtime_module, "_call_key", lambda *a: keyed.append(1) or real_key(*a))
    assert functional(x, runtime=rt).y.shape == x.shape
    assert len(keyed) == 1 and len(call._matchers) == 2 and call.served is None
    functional(x, runtime=rt)
    assert len(keyed) == 1 and call.served is not runtime_module._serves_nothing
    assert len(launched) == 2 and not full


def test_a_served_functional_call_runs_its_before_run_unless_idle(monkeypatch):
    """An op whose functional call runs a check before the launch (the grouped wgrad's host
    read of the offsets) is served without it only where the check would do nothing."""
    checks = []
    functional, rt, x, launched, full, _ = _served_stand_in(
        monkeypatch, "stand_in_before_run", lambda rt, args, config, own: checks.append(own))
    functional(x, runtime=rt, check=False)
    assert not checks and len(launched) == 1 and not full
    functional(x, runtime=rt)
    assert checks == [{"check": True}]


def test_a_recent_call_rematches_calls_of_its_key_that_its_matcher_refused(monkeypatch):
    """A module's calls differ from a first call of their key made under no_grad only in
    requires_grad, which the matcher's tensor test tells apart and the key does not: after one
    keyed call the recent call serves them. Calls that alternate between such kinds switch
    between the matchers kept for them (one keyed call each switch, no new matcher); a kind
    beyond ``MATCHERS`` stays keyed."""
    import sys
    runtime_module = sys.modules["graphrt.runtime"]
    functional, rt, x, launched, full, _ = _served_stand_in(monkeypatch, "stand_in_rematched")
    keyed = []
    real_key = runtime_module._call_key
    monkeypatch.setattr(runtime_module, "_call_key", lambda *a: keyed.append(1) or real_key(*a))
    x_grad = x.detach().requires_grad_(True)
    for _ in range(3):
        assert functional(x_grad, runtime=rt).y.shape == x.shape
    assert len(keyed) == 1 and len(launched) == 3 and not full
    (call,) = rt._recent_calls.values()
    for i in range(6):   # each switch of kind: one keyed call, then served
        functional(x if i % 2 else x_grad, runtime=rt)
        functional(x if i % 2 else x_grad, runtime=rt)
    assert len(keyed) == 1 + 5 and len(call._matchers) == 2
    kinds = [torch.nn.Parameter(x.detach(), requires_grad=False),
             torch.nn.Parameter(x.detach()), x.detach().as_subclass(_OtherTensor)]
    for kind in kinds:   # two more kinds kept, the fifth keyed every time
        functional(kind, runtime=rt)
        functional(kind, runtime=rt)
    assert len(call._matchers) == binding.MATCHERS == 4
    assert len(keyed) == 6 + 1 + 1 + 2
    assert not full and len(launched) == 3 + 12 + 6


class _OtherTensor(torch.Tensor):
    """A tensor subclass: another kind of tensor for the matcher's test."""


def _stand_in_plan(monkeypatch, stream=lambda index: 7):
    """A plan whose ``execute`` records one launch of x and y (on the stream ``stream(index)``
    names), with its bindings: (plan, the launches' (x, y) addresses, the binding keys built,
    by thread)."""
    import threading
    from graphrt.plan import Plan
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(binding, "_current_raw_stream", stream)
    launched, keyed = [], []

    def run(*launch):
        launched.append(launch[-2:])

    class Stand(Plan):
        records_launches = True
        output_names, also_written, run_time_ints = ("y",), (), {}

        def execute(self, x, *, y=None, workspace=None, stream=None):
            binding.active_recording().launches.append(
                (run, (1, 1, 1), "f", "m", 0,
                 (binding.Address(x.data_ptr()), binding.Address(y.data_ptr())), ["x", "y"]))

    plan = object.__new__(Stand)
    plan._compiled, plan._bindings = True, binding.Bindings()
    real_key = binding.binding_key
    monkeypatch.setattr(binding, "binding_key",
                        lambda *a: keyed.append(threading.get_ident()) or real_key(*a))
    return plan, launched, keyed


def test_plan_execute_rematches_calls_of_its_key_that_its_matcher_refused(monkeypatch):
    """``plan.execute``'s recent binding: a call of its key that its matcher refuses (the
    input requires grad) is keyed once and then matched; alternating kinds switch between the
    kept matchers, and each call launches at its own addresses."""
    plan, launched, keyed = _stand_in_plan(monkeypatch)
    x, y, x_grad = _at_256(16), _at_256(16), _at_256(16, requires_grad=True)
    plan.execute(x, y=y)   # recorded (its launch goes to the recording)
    for _ in range(2):
        plan.execute(x, y=y)
    assert len(keyed) == 1 and len(launched) == 2   # keyed once, then matched
    for t in (x_grad, x_grad, x_grad, x, x, x_grad):   # a key at each switch of kind
        plan.execute(t, y=y)
    assert len(keyed) == 1 + 3 and len(plan._bindings.recent._matchers) == 2
    assert launched[-1] == (x_grad.data_ptr(), y.data_ptr()) and len(launched) == 8


def _in_threads(target, arguments) -> list:
    """Runs ``target(a)`` for each of ``arguments`` in threads of its own, switching threads
    every microsecond, until all are done; the threads."""
    import sys
    import threading
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=target, args=(a,)) for a in arguments]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    return threads


def test_served_calls_from_threads_that_switch_matchers_all_launch_their_own_addresses(
        monkeypatch):
    """Threads sharing a runtime call the same op with two kinds of input (one requiring
    grad), so the recent call's matcher keeps switching under them while they are served:
    every call launches once, at its own input's address, with a fresh output."""
    functional, rt, x, launched, full, _ = _served_stand_in(monkeypatch, "stand_in_threads")
    x_grad = x.detach().requires_grad_(True)
    errors, calls = [], 200

    def caller(t):
        try:
            for _ in range(calls):
                y = functional(t, runtime=rt).y
                assert y.shape == t.shape and y.data_ptr() != t.data_ptr()
        except Exception as err:   # reported by the main thread
            errors.append(err)
    _in_threads(caller, (x, x_grad, x, x_grad))
    assert not errors and not full
    assert len(launched) == 4 * calls and all(a[0] == x.data_ptr() for a in launched)
    (call,) = rt._recent_calls.values()
    assert len(call._matchers) == 2


def test_matcher_for_keeps_the_current_matcher_where_it_serves_the_call(monkeypatch):
    """``binding.matcher_for`` tests the current matcher too: another thread may have switched
    to it since it refused this call, and a new matcher would then be a second one of the same
    kind."""
    monkeypatch.setattr(torch.Tensor, "get_device", lambda self: 0)
    monkeypatch.setattr(binding, "_current_raw_stream", lambda index: 7)
    x = torch.zeros(16)
    x_grad = x.detach().requires_grad_(True)

    def entry(t):
        key, positions, _, _ = binding.binding_key((t,), {"eps": 1e-6})
        return [binding.call_matcher((t,), {"eps": 1e-6}, key, positions), None]
    plain, with_grad = entry(x), entry(x_grad)
    kept = [plain, with_grad]
    key, positions, _, _ = binding.binding_key((x,), {"eps": 1e-6})
    assert binding.matcher_for(kept, plain[0], None, (x,), {"eps": 1e-6}, key,
                               positions) is plain
    assert binding.matcher_for(kept, plain[0], None, (x_grad,), {"eps": 1e-6}, key,
                               positions) is with_grad
    assert len(kept) == 2


def test_threads_on_streams_of_their_own_are_each_served_by_their_own_recent_call(monkeypatch):
    """Two threads sharing a runtime, each launching on its own stream: each thread's calls
    are served by the bound call of its stream (recent calls are kept per thread), so after
    its first call neither thread builds a key, however their calls interleave."""
    import sys
    import threading
    runtime_module = sys.modules["graphrt.runtime"]
    functional, rt, x, launched, full, bind = _served_stand_in(monkeypatch, "stand_in_streams")
    streams = threading.local()
    monkeypatch.setattr(binding, "_current_raw_stream",
                        lambda index: getattr(streams, "stream", 7))
    keyed = []
    real_key = runtime_module._call_key
    monkeypatch.setattr(runtime_module, "_call_key",
                        lambda *a: keyed.append(threading.get_ident()) or real_key(*a))
    ready, errors = threading.Barrier(2), []

    def caller(stream):
        try:
            streams.stream = stream
            if stream != 7:
                bind()   # this stream's first call of the kind (the main thread bound 7's)
            ready.wait()
            for _ in range(1000):
                functional(x, runtime=rt)
        except Exception as err:   # reported by the main thread
            errors.append(err)
    threads = _in_threads(caller, (7, 8))
    assert not errors and not full and len(launched) == 2000
    assert keyed.count(threads[0].ident) == 1   # its first call found the bound call by key
    assert keyed.count(threads[1].ident) == 1   # bind()'s own key; then served throughout


def test_threads_on_streams_of_their_own_are_each_matched_by_their_plans_recent_binding(
        monkeypatch):
    """Two threads executing one plan, each on its own stream: each thread's recent binding
    is its stream's (kept per thread), so after its first call, which records that stream's
    binding, neither thread builds a binding key, however their calls interleave."""
    import threading
    streams = threading.local()
    plan, launched, keyed = _stand_in_plan(
        monkeypatch, lambda index: getattr(streams, "stream", 7))
    x, y = _at_256(16), _at_256(16)
    ready, errors = threading.Barrier(2), []

    def caller(stream):
        try:
            streams.stream = stream
            plan.execute(x, y=y)   # this stream's binding recorded
            ready.wait()
            for _ in range(1000):
                plan.execute(x, y=y)
        except Exception as err:   # reported by the main thread
            errors.append(err)
    threads = _in_threads(caller, (7, 8))
    assert not errors and len(launched) == 2000
    assert [keyed.count(t.ident) for t in threads] == [1, 1]
    plan._bindings.clear()
    assert plan._bindings.recent is None
