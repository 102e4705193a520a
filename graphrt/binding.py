"""Bindings: a plan's launches recorded for one kind of call and replayed for calls of that kind.

``plan.execute`` checks its tensors (dtype, shape, strides, alignment, overlap) and computes its
kernels' arguments. For tensors of the same shapes, strides, dtypes, device and address
alignment, the same scalar arguments and the same stream, the checks pass again and the
launches differ only in the addresses. A plan that opts in (its ``execute`` launches only
through :func:`graphrt.kernel_utils.launch`) records the launches of its first call of a kind,
with each address written as "argument i plus d bytes", and replays them for the next calls of
that kind with their own addresses, after the one check that depends on addresses: outputs must
not overlap inputs or each other. So every layer of a model with the same shapes shares one
binding, whatever its buffers.

A call of the kind last served first meets that binding's ``CallMatcher``: the key's tests
(shapes, strides, dtypes, devices, address alignment, scalars, keywords, stream) on the
call's values directly, the tensors' part in one C++ call (PyTorch's TensorGuards), with no
key built or hashed; any difference sends the call on to the key.

A binding holds no tensors, so it keeps no memory alive. Anything a key cannot describe (lists,
objects), a CPU tensor, an active launch hook (a profiler), an operation other than a kernel
launch while recording (a copy, a fill, an allocation), a launch that goes through neither
``launch`` nor ``graphrt.cute_launch.launch`` (another DSL's kernels) or with Triton objects
other than tensors, scalars and host tensor descriptors, or an address that is not inside
exactly one argument (nor inside a buffer kept for the process: ``keep_address``) leaves the
call unbound: it runs ``execute`` in full. A tensor descriptor is recorded as its base's
"argument i plus d bytes" and its other fields, and rebuilt over the new address on replay.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from collections import OrderedDict

import torch
from torch.utils._python_dispatch import TorchDispatchMode

BINDINGS_PER_PLAN = 16
MATCHERS = 4   # matchers a binding (or bound call) keeps for kinds of calls of its key
EXPANSIONS_PER_DESCRIPTOR = 4   # base addresses whose launch arguments a descriptor keeps
_local = threading.local()
_REMATCHING = threading.Lock()   # one thread switches a binding's matcher
_this_module = sys.modules[__name__]   # generated matchers read its _current_raw_stream late
_persistent: list[tuple[int, int]] = []   # (address, bytes) of tensors kept for the process


def keep_address(t: torch.Tensor) -> None:
    """Marks ``t`` as alive until the process ends (graphrt's device error flags): a recorded
    launch may then pass an address inside it as it is, though it is no call's argument."""
    _persistent.append((t.data_ptr(), max(_extent(t), 1)))


def _persistent_address(address: int) -> bool:
    return any(start <= address < start + n for start, n in _persistent)


class Address(int):
    """A tensor argument of a recorded launch: its address, marked as one."""


class RecordedDescriptor:
    """A host tensor descriptor argument (Triton's or Gluon's) of a recorded launch: its
    base's address and its other fields, without the tensor."""

    __slots__ = ("address", "kind", "fields")

    def __init__(self, descriptor):
        self.address = descriptor.base.data_ptr()
        self.kind = type(descriptor)
        self.fields = {k: v for k, v in vars(descriptor).items() if k != "base"}


class _Pointer(int):
    """A replayed descriptor's base: an address that answers ``data_ptr()`` as a tensor
    does (Triton's launcher reads no more of it)."""

    def data_ptr(self) -> int:
        return int(self)


class DescriptorAt:
    """A recorded descriptor with its base as (tensor argument, byte offset): ``at`` makes
    the same descriptor over the replayed addresses (built without the constructor's checks,
    which the recorded call passed for the same shapes, strides and address alignment)."""

    __slots__ = ("index", "offset", "kind", "fields", "_expansions")

    def __init__(self, index: int, offset: int, recorded: RecordedDescriptor):
        self.index, self.offset = index, offset
        self.kind, self.fields = recorded.kind, recorded.fields
        self._expansions: dict = {}

    def at(self, addresses: list):
        descriptor = object.__new__(self.kind)
        vars(descriptor).update(self.fields)
        descriptor.base = _Pointer(addresses[self.index] + self.offset)
        return descriptor

    def expanded(self, addresses: list, meta, make) -> list:
        """The kernel arguments Triton's launcher makes of this descriptor at these addresses
        (``make``: its own function; with TMA metadata it encodes a tensor map on the host),
        kept for the last few base addresses: the rest of what it encodes is fixed by the
        binding's key."""
        address = addresses[self.index] + self.offset
        found = self._expansions.get(address)
        if found is None:
            found = make(self.at(addresses), meta)
            if len(self._expansions) >= EXPANSIONS_PER_DESCRIPTOR:
                self._expansions.clear()
            self._expansions[address] = found
        return found


class RunTimePart:
    """A launch argument computed from a run-time int keyword: part ``part`` of that
    keyword's split (``Plan.run_time_ints``), the keyword being the call's ``source``-th."""

    __slots__ = ("source", "part")

    def __init__(self, source: int, part: int):
        self.source, self.part = source, part

    def __eq__(self, other) -> bool:
        return type(other) is RunTimePart and (other.source, other.part) == (self.source,
                                                                          self.part)

    def __repr__(self) -> str:
        return f"RunTimePart({self.source}, {self.part})"


def _current_raw_stream(index: int) -> int:
    return torch._C._cuda_getCurrentRawStream(index)


_BY_VALUE = frozenset((int, bool, str))   # keyed as (type, value)


_INT64 = 1 << 63
RUN_TIME_INT = "run-time int"   # what a key holds for a run-time int keyword

try:   # checks shapes, strides, dtype, device, type and requires_grad of many tensors in C++
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except Exception:  # pragma: no cover - a PyTorch without it: every call builds its key
    _TensorGuards = None


def run_time_value(value) -> bool:
    """Whether a run-time int keyword's value replays without its plan's checks: a signed
    64-bit int (anything else takes the full path, whose checks reject what they reject)."""
    return type(value) is int and -_INT64 <= value < _INT64


def binding_key(args: tuple, kwargs: dict, run_time: dict | None = None
                ) -> tuple[tuple, list, list, list] | None:
    """(key, tensors, addresses, ints) of ``execute(*args, **kwargs)``: the key holds
    everything the checks and launches depend on but the addresses (the ``stream`` keyword as
    the raw stream it resolves to) and the values of the plan's run-time int keywords
    (``run_time``, see ``Plan.run_time_ints``), which ``ints`` lists in keyword order;
    ``tensors`` lists the tensor arguments' positions; None when the call cannot be bound."""
    key = []
    tensors = []
    addresses = []
    ints = []
    index = -1
    stream = kwargs.get("stream")
    if stream is not None:
        stream = getattr(stream, "cuda_stream", stream)
        if type(stream) is not int:
            return None
    n_args = len(args)
    names = (*(None,) * n_args, *kwargs) if run_time else None
    position = -1
    for value in (*args, *kwargs.values()):   # the common kinds inline: this runs every call
        position += 1
        if value is None:
            key.append(None)
            continue
        kind = type(value)
        if names is not None and names[position] in run_time and run_time_value(value):
            key.append(RUN_TIME_INT)
            ints.append(value)
        elif kind is torch.Tensor or isinstance(value, torch.Tensor):
            device = value.get_device()
            if device < 0:
                return None
            index = device
            address = value.data_ptr()
            key.append((value.shape, value.stride(), value.dtype, device, address & 255))
            tensors.append(position)
            addresses.append(address)
        elif kind in _BY_VALUE:
            key.append((kind, value))
        elif kind is float:
            key.append(value.hex())  # tells -0.0 from 0.0, and a NaN matches itself
        elif kind is torch.dtype:
            key.append(value)
        elif position >= n_args and value is kwargs.get("stream"):
            key.append(None)   # a stream object: the key ends with its raw stream
        else:
            return None
    if index < 0:
        return None
    key.append(_current_raw_stream(index) if stream is None else stream)
    key.extend(kwargs)  # which keywords were given
    return tuple(key), tensors, addresses, ints


class CallMatcher:
    """Whether a call is of the kind of one recorded call, tested without building its key:
    ``match(args, kwargs)`` gives (addresses, ints) as ``binding_key`` would for a call with
    the recorded call's key, and None for any other (which may still have that key: the
    tensors' test is stricter, telling apart types and requires_grad, so such a call is keyed
    as usual). ``match`` is generated code with the recorded call's values written in: its
    tests run one after the other with no loop over the arguments. ``tests`` gives the same
    tests as lines of code over any names of the values (a functional call's served path
    runs them on its own parameters)."""

    __slots__ = ("match", "n_args", "names", "_others", "_run_time", "_positions", "_guard",
                 "_bits", "_device", "_stream")

    def __init__(self, n_args: int, names: tuple, others: tuple, run_time: tuple,
                 positions: tuple, guard, bits: tuple, device: int, stream: int):
        self.n_args, self.names = n_args, names
        self._others, self._run_time, self._positions = others, run_time, positions
        self._guard, self._bits, self._device, self._stream = guard, bits, device, stream
        namespace: dict = {}
        lines = ["def match(args, kwargs):",
                 f"    if len(args) != {n_args} or tuple(kwargs) != {names!r}:",
                 "        return None",
                 "    v = (*args, *kwargs.values())",
                 *self.tests(lambda i: f"v[{i}]", namespace)]
        addresses = ", ".join(f"i{n}" for n in range(len(positions)))
        lines.append(f"    return [{addresses}], {self.ints(lambda i: f'v[{i}]')}")
        exec("\n".join(lines), namespace)
        self.match = namespace["match"]

    def tests(self, value, namespace: dict, indent: str = "    ") -> list[str]:
        """Lines that return None unless the values (``value(i)``: the code of the i-th of
        the call's positional then keyword values) are of the recorded kind, and leave the
        tensors' addresses in ``i0``, ``i1``, ...; what they read goes into ``namespace``."""
        namespace.update(_guard=self._guard.check, _binding=_this_module, _INT64=_INT64)
        lines = []
        for i, kind, expected in self._others:
            v = value(i)
            if expected is None:
                test = f"{v} is not None"
            else:
                namespace[f"_e{i}"], namespace[f"_k{i}"] = expected, kind
                same = (f"{v}.hex() != {expected.hex()!r}" if kind is float
                        else f"{v} != _e{i}")
                test = f"{v} is not _e{i} and (type({v}) is not _k{i} or {same})"
            lines += [f"if {test}:", "    return None"]
        for i in self._run_time:   # run_time_value, inline
            v = value(i)
            lines += [f"if type({v}) is not int or not -_INT64 <= {v} < _INT64:",
                      "    return None"]
        tensors = ", ".join(value(p) for p in self._positions)
        lines += [f"if not _guard({tensors}) or "
                  f"_binding._current_raw_stream({self._device}) != {self._stream}:",
                  "    return None"]
        lines += [f"i{n} = {value(p)}.data_ptr()" for n, p in enumerate(self._positions)]
        low = " or ".join(f"i{n} & 255 != {b}" for n, b in enumerate(self._bits))
        lines += [f"if {low}:", "    return None"]
        return [indent + line for line in lines]

    def ints(self, value) -> str:
        """The code of the list of the call's run-time ints, in keyword order."""
        return f"[{', '.join(value(i) for i in self._run_time)}]"


def tensor_guard(tensors: list):
    """PyTorch's ``TensorGuards`` of ``tensors``: its ``check(*others)`` tells in one C++ call
    whether others are of their kind (type, dtype, device, requires_grad, shapes, strides);
    None where this PyTorch has none, takes other arguments, or refuses the tensors
    themselves."""
    if _TensorGuards is None:
        return None
    try:
        guard = _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                              dynamic_dims_strides=[list(t.stride()) for t in tensors])
    except Exception:  # pragma: no cover - another PyTorch's signature
        return None
    return guard if guard.check(*tensors) else None


def call_matcher(args: tuple, kwargs: dict, key: tuple, tensors: list) -> CallMatcher | None:
    """The ``CallMatcher`` of calls of this one's kind, from its ``binding_key`` (``key`` and
    the ``tensors``' positions), or None where the fast test does not apply (a stream passed,
    no TensorGuards in this PyTorch, a key that is not ``binding_key``'s) and every call of
    the kind is keyed."""
    values = (*args, *kwargs.values())
    if _TensorGuards is None or kwargs.get("stream") is not None or not tensors \
            or type(key) is not tuple or len(key) <= len(values):
        return None
    run_time = [i for i, part in enumerate(key[:len(values)]) if part is RUN_TIME_INT]
    keyed_apart = {*tensors, *run_time}
    others = tuple((i, type(v), v) for i, v in enumerate(values) if i not in keyed_apart)
    given = [values[i] for i in tensors]
    guard = tensor_guard(given)
    if guard is None:
        return None
    stream = key[len(values)]
    if type(stream) is not int:
        return None
    return CallMatcher(len(args), tuple(kwargs), others, tuple(run_time), tuple(tensors), guard,
                       tuple(t.data_ptr() & 255 for t in given),
                       given[-1].get_device(),   # the device whose stream binding_key read
                       stream)


def matcher_for(kept: list, matcher: CallMatcher, data, args: tuple, kwargs: dict, key: tuple,
                positions: list) -> list | None:
    """For a call of ``key`` that ``matcher`` (kept with ``data``) refused (the tensors' test
    also tells apart tensor types and requires_grad, which the key leaves out): the entry
    ([matcher, data]) of ``kept`` whose matcher serves it (one test each; ``matcher``'s too,
    which another thread may have switched to since it refused), else a new [matcher, None]
    for it, kept while ``kept`` holds fewer than ``MATCHERS``; None when neither (such calls
    stay keyed). ``kept`` starts with ``matcher``'s entry, so ``matcher`` is always the
    matcher of one of them. The caller holds its lock."""
    if not kept:
        kept.append([matcher, data])
    for entry in kept:
        if entry[0].match(args, kwargs) is not None:
            return entry
    if len(kept) < MATCHERS:
        made = call_matcher(args, kwargs, key, positions)
        if made is not None:
            kept.append([made, None])
            return kept[-1]
    return None


def _extent(t: torch.Tensor) -> int:
    """Bytes from ``t``'s address to one past the last byte it can reach (0 if empty)."""
    if t.numel() == 0:
        return 0
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return (last + 1) * t.element_size()


class Recording:
    """The launches one ``execute`` made; ``complete`` is false once anything else happened."""

    __slots__ = ("launches", "complete")

    def __init__(self):
        # (run, grid, function, metadata, stream, arguments, the kernel's parameter names)
        self.launches: list[tuple] = []
        self.complete = True


class Binding:
    """Recorded launches with their addresses as (tensor argument, byte offset), and the
    extents that the overlap check compares."""

    __slots__ = ("launches", "outputs", "inputs", "names", "splits", "_replays", "_checked",
                 "matcher", "_launcher", "_matchers")

    def __init__(self, launches, outputs, inputs, names, splits=()):
        self.launches = launches   # (run, grid, function, metadata, stream, template)
        self.outputs = outputs     # (tensor index, extent) of each non-empty output
        self.inputs = inputs       # the same, inputs
        self.names = names         # each tensor argument's name
        self.splits = splits       # per run-time int keyword: its value to launch arguments
        # per launch: the call's leading arguments, the template with its literal arguments
        # in place, and the positions that take an address or a descriptor on each replay
        # (fewer steps than a pass that tests every argument's kind)
        self._replays = tuple(
            (*_expanding_form(_call_form(run, grid, stream, function, metadata), template),
             tuple(template),
             tuple((i, a[0], a[1]) for i, a in enumerate(template) if type(a) is tuple),
             tuple((i, a) for i, a in enumerate(template) if type(a) is DescriptorAt),
             tuple((i, a.source, a.part) for i, a in enumerate(template)
                   if type(a) is RunTimePart))
            for run, grid, function, metadata, stream, template in launches)
        self._checked: list | None = None   # the addresses the overlap check last passed
        self._launcher = None   # _generated_launcher's function, made at the first launch
        self.matcher: CallMatcher | None = None   # set by Bindings.record
        self._matchers: list = []   # [matcher, None] entries: ``rematch``'s

    def rematch(self, args: tuple, kwargs: dict, key: tuple, positions: list) -> None:
        """Makes ``matcher`` one that serves calls like this one, which the current one refused
        though its key is this call's (``matcher_for``)."""
        with _REMATCHING:
            entry = matcher_for(self._matchers, self.matcher, None, args, kwargs, key,
                                positions)
            if entry is not None:
                self.matcher = entry[0]

    def replay(self, addresses: list, ints: list = ()) -> None:
        """The overlap check on these addresses, then the launches. The check's result depends
        on the addresses alone (the extents are the binding's), so addresses equal to the ones
        it last passed (a caller reusing its buffers) are not checked again."""
        if addresses != self._checked:
            self._check_overlap(addresses)
            self._checked = list(addresses)
        self.launch(addresses, ints)

    def _check_overlap(self, addresses: list) -> None:
        """ContractError when an output's bytes overlap another tensor argument's."""
        names = self.names
        spans = [(addresses[i], addresses[i] + n, i) for i, n in self.inputs]
        for i, n in self.outputs:
            lo, hi = addresses[i], addresses[i] + n
            for other_lo, other_hi, j in spans:
                if lo < other_hi and other_lo < hi:
                    from .errors import ContractError
                    raise ContractError(f"{names[i]}: memory overlaps {names[j]}")
            spans.append((lo, hi, i))

    def launch(self, addresses: list, ints: list = ()) -> None:
        """The launches alone, at these addresses and run-time ints (outputs the caller just
        allocated cannot overlap anything)."""
        launcher = self._launcher
        if launcher is None:
            launcher = self._launcher = _generated_launcher(self._replays, self.splits)
        launcher(addresses, ints)


def _generated_launcher(replays: tuple, splits: tuple):
    """One function that makes a binding's launches: each launch's call written out with its
    literal arguments bound as names and its addresses as ``addresses[i] + offset``, so that a
    replay builds no argument list and runs no loop over the template (1.29 -> 0.80 us a
    launch of 22 arguments on the development machine's CPU)."""
    namespace: dict = {}

    def bound(value, name: str) -> str:
        namespace[name] = value
        return name
    lines = ["def launch(addresses, ints):"]
    lines += [f"    p{k} = {bound(split, f'_s{k}')}(ints[{k}])" for k, split in enumerate(splits)]
    for j, (run, leading, packed, expand, template, at, described, computed) in enumerate(
            replays):
        args = [bound(a, f"_c{j}_{i}") for i, a in enumerate(template)]
        for i, index, offset in at:
            args[i] = f"addresses[{index}]" + (f" + {offset}" if offset else "")
        for i, source, part in computed:
            args[i] = f"p{source}[{part}]"
        for n, (i, descriptor) in enumerate(described):
            name = bound(descriptor, f"_d{j}_{i}")
            if expand is None:
                args[i] = f"{name}.at(addresses)"
            else:   # the descriptor's kernel arguments spliced in its place
                make, metas = expand
                args[i] = (f"*{name}.expanded(addresses, {bound(metas[n], f'_m{j}_{i}')}, "
                           f"{bound(make, f'_e{j}')})")
        call = [bound(a, f"_l{j}_{i}") for i, a in enumerate(leading)]
        if packed:   # one sequence, of the kind the launch's own wrapper would pass
            call.append(f"[{', '.join(args)}]" if expand is not None else
                        f"({', '.join(args)},)" if args else "()")
        else:
            call.extend(args)
        lines.append(f"    {bound(run, f'_r{j}')}({', '.join(call)})")
    exec("\n".join(lines), namespace)
    return namespace["launch"]


def _call_form(run, grid: tuple, stream: int, function, metadata) -> tuple:
    """(function, leading arguments, packed) of a recorded launch: ``run``'s own form where it
    has one (kernel_utils.DirectRun), else Triton's ``compiled.run`` call with no launch
    metadata or hooks."""
    form = getattr(run, "form", None)
    if form is not None:
        return form(grid, stream, function, metadata)
    return run, (*grid, stream, function, metadata, None, None, None), False


def _expanding_form(form: tuple, template) -> tuple:
    """(function, leading arguments, packed, expand) of a recorded launch. ``expand`` is None,
    or, where the launch's function is Triton's tensor-descriptor wrapper (the inner function
    that expands each descriptor argument into a tensor map, shape and strides, then calls the
    C launch: 3.6's, with the arguments spread, or 3.7's and 3.9's, packed) and every
    descriptor argument is a top-level one the binding rebuilds: (the wrapper's own expansion
    function, each descriptor's TMA metadata), with the C launch as the function, so that a
    replay passes expansions it kept per address."""
    function, leading, packed = form
    code, closure = getattr(function, "__code__", None), getattr(function, "__closure__", None)
    if code is None or closure is None:
        return (*form, None)
    cells = dict(zip(code.co_freevars, (cell.cell_contents for cell in closure)))
    names = set(cells)
    if names == {"launcher", "tensordesc_indices", "tensordesc_meta"}:   # 3.6 spread, 3.7 packed
        make = function.__globals__.get("make_tensordesc_arg")
        if make is None or not packed and (function.__globals__.get("_BASE_ARGS_FORMAT_LEN")
                                           != len(leading)):
            return (*form, None)
        positions = sorted(cells["tensordesc_indices"])
    elif packed and names == {"launcher", "make_tensordesc_arg", "relevant_paths", "signature",
                              "tensordesc_meta"}:   # 3.9
        paths = cells["relevant_paths"]
        if any(paths.values()):   # a descriptor inside a tuple argument
            return (*form, None)

        def make(descriptor, meta, expand=cells["make_tensordesc_arg"], base=leading):
            return expand(descriptor, meta, base)
        positions = sorted(paths)
    else:
        return (*form, None)
    metas = cells["tensordesc_meta"] or [None] * len(positions)
    if positions != [i for i, a in enumerate(template) if type(a) is DescriptorAt] \
            or len(metas) != len(positions):
        return (*form, None)
    return cells["launcher"], leading, packed, (make, tuple(metas))


def launch_hooks_active() -> bool:
    """Whether Triton launch hooks (a profiler) must see every launch; kernel_utils installs
    the real test when it loads (no recording exists before it has)."""
    return False


def active_recording() -> Recording | None:
    """The recording of the running ``execute`` on this thread, if one is being recorded."""
    return getattr(_local, "recording", None)


@contextlib.contextmanager
def recording_into(recording: Recording):
    """Launches made on this thread inside the block go to ``recording`` (the recording
    around the block, if any, resumes after it)."""
    outer = getattr(_local, "recording", None)
    _local.recording = recording
    try:
        yield recording
    finally:
        _local.recording = outer


class _OnlyLaunches(TorchDispatchMode):
    """Marks the recording incomplete at the first tensor operation that is not a view."""

    def __init__(self, recording: Recording):
        super().__init__()
        self.recording = recording

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.__name__ not in ("detach", "alias"):
            self.recording.complete = False
        return func(*args, **(kwargs or {}))


def _locate(address: int, starts: list, extents: list) -> tuple | None:
    """(tensor index, offset) of the one tensor argument whose bytes hold ``address``."""
    found = None
    for i, (start, n) in enumerate(zip(starts, extents)):
        if start <= address < start + max(n, 1):
            if found is not None:
                return None   # inside two arguments: which one it follows is not known
            found = (i, address - start)
    return found


class _RecentBinding(threading.local):
    """The binding that last served a plan on this thread, when it has a matcher. Threads
    usually launch on streams of their own and a matcher serves only its recorded stream, so
    one shared recent binding would turn away every other thread's calls."""

    def __init__(self):
        self.binding: Binding | None = None


class Bindings:
    """The bindings of one plan by key, least recently used dropped first."""

    def __init__(self, size: int = BINDINGS_PER_PLAN):
        self.size = size
        self.recorded: OrderedDict = OrderedDict()
        self.lock = threading.Lock()
        self.hits = 0
        self._this_thread = _RecentBinding()

    @property
    def recent(self) -> Binding | None:
        """This thread's recent binding (``_RecentBinding``)."""
        return self._this_thread.binding

    def lookup(self, key) -> Binding | None:
        found = self.recorded.get(key)
        if found is not None:
            self.hits += 1
            if found.matcher is not None:
                self._this_thread.binding = found
            try:
                self.recorded.move_to_end(key)
            except KeyError:  # dropped by another thread meanwhile
                pass
        return found

    def record(self, key, positions: list, addresses: list, execute, plan, args: tuple,
               kwargs: dict, names: tuple, output_names, run_time: dict | None = None,
               ints: list = ()) -> None:
        """Runs ``execute`` (in full: every check) while recording its launches, and keeps
        them as a binding under ``key`` when nothing but launches happened and every address
        they pass lies inside one tensor argument. ``run_time``: the plan's run-time int
        keywords, whose values (``ints``, as ``binding_key`` found them) the launches take
        through the kernel parameters each one names."""
        with recording_into(Recording()) as recording, _OnlyLaunches(recording):
            execute(plan, *args, **kwargs)
        if not (recording.complete and recording.launches):
            return
        given = [n for n in kwargs if run_time and n in run_time and run_time_value(kwargs[n])]
        splits = tuple(run_time[n][1] for n in given)
        computed = {}   # kernel parameter: (source, part, the value this call passed)
        for source, (name, value) in enumerate(zip(given, ints)):
            for part, (param, v) in enumerate(zip(run_time[name][0], splits[source](value))):
                computed[param] = (source, part, v)
        values = (*args, *kwargs.values())
        names = (*names[:len(args)], *kwargs)
        extents = [_extent(values[p]) for p in positions]
        launches = []
        taken = set()   # the declared parameters some launch took
        for run, grid, function, metadata, stream, arguments, *params in recording.launches:
            template = []
            params = params[0] if params else ()
            if computed and not params:
                return   # a launch whose parameters are unknown might take a run-time int
            for position, a in enumerate(arguments):
                part = computed.get(params[position]) if computed else None
                if part is not None:
                    if type(a) is not int or a != part[2]:
                        return   # not the value the plan declares: never replayed
                    taken.add(params[position])
                    template.append(RunTimePart(part[0], part[1]))
                elif type(a) is Address:
                    where = _locate(a, addresses, extents)
                    if where is None:
                        if not _persistent_address(a):
                            return
                        where = int(a)
                    template.append(where)
                elif type(a) is RecordedDescriptor:
                    where = _locate(a.address, addresses, extents)
                    if where is None:
                        return
                    template.append(DescriptorAt(*where, a))
                elif type(a) is tuple:   # a template's tuples are addresses
                    return
                else:
                    template.append(a)
            launches.append((run, grid, function, metadata, stream, tuple(template)))
        if taken != set(computed):
            return   # a declared parameter no launch has: the value may have gone elsewhere
        outputs, inputs = [], []
        for i, p in enumerate(positions):
            if extents[i]:
                (outputs if names[p] in output_names else inputs).append((i, extents[i]))
        made = Binding(tuple(launches), tuple(outputs), tuple(inputs),
                       tuple(names[p] for p in positions), splits)
        made.matcher = call_matcher(args, kwargs, key, positions)
        with self.lock:
            self.recorded[key] = made
            while len(self.recorded) > self.size:
                self.recorded.popitem(last=False)
            if made.matcher is not None:
                self._this_thread.binding = made

    def clear(self) -> None:
        with self.lock:
            self.recorded.clear()
            self._this_thread = _RecentBinding()   # every thread's
