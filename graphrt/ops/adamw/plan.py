"""Plan for the AdamW step over a list of tensors."""
from __future__ import annotations

import math
import operator
import threading

import torch

from ... import binding
from ...errors import ContractError
from ...plan import Plan
from ...result import Result
from ...streams import is_capturing, on_stream
from ...validate import dtype_name, real_value, require_disjoint, require_tensor
from .reference import adamw_step_reference

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
LISTS = ("params", "grads", "exp_avgs", "exp_avg_sqs", "steps")
CHECKED_CALLS = 8


def _tensors_key(lists: tuple) -> tuple | None:
    """What the tensor checks of a call read, per tensor: address, shape, dtype, device and
    contiguity (with the list lengths); None when the arguments are not lists of tensors.
    (Each property is read for all tensors in one ``map``: a third less host time than a
    tuple per tensor.)"""
    try:
        if any(type(ts) not in (list, tuple) for ts in lists):
            return None
        flat = [t for ts in lists for t in ts]
        return (tuple(map(len, lists)), tuple(map(_Tensor.data_ptr, flat)),
                tuple(map(_Tensor.size, flat)), tuple(map(_dtype, flat)),
                tuple(map(_Tensor.get_device, flat)), tuple(map(_Tensor.is_contiguous, flat)))
    except (AttributeError, TypeError):
        return None


_Tensor = torch.Tensor
_dtype = operator.attrgetter("dtype")


def _spans_disjoint(rows: list) -> bool:
    """Whether no parameter's written tensors (p, m, v) overlap another parameter's tensors (a
    launch for all of them at once would race where per-tensor launches run in order). Spans in
    address order; for each, the furthest end reached so far by another parameter's spans (any,
    and written ones) tells whether it overlaps one."""
    spans = []
    for i, (p, g, m, v, step) in enumerate(rows):
        for t, written in ((p, True), (m, True), (v, True), (g, False), (step, False)):
            if t.numel():
                lo = t.data_ptr()
                spans.append((lo, lo + t.numel() * t.element_size(), written, i))
    spans.sort()
    reach, reach_written = _Reach(), _Reach()
    for lo, hi, written, i in spans:
        if (written and reach.by_others(i) > lo) or reach_written.by_others(i) > lo:
            return False
        reach.add(hi, i)
        if written:
            reach_written.add(hi, i)
    return True


class _Reach:
    """The two furthest span ends of distinct parameters so far."""

    __slots__ = ("first", "owner", "second")

    def __init__(self):
        self.first, self.owner, self.second = -1, -1, -1

    def add(self, hi: int, i: int) -> None:
        if i == self.owner:
            self.first = max(self.first, hi)
        elif hi > self.first:
            self.first, self.owner, self.second = hi, i, self.first
        else:
            self.second = max(self.second, hi)

    def by_others(self, i: int) -> int:
        """The furthest end reached by a parameter other than ``i``."""
        return self.second if i == self.owner else self.first


class _CheckedCall:
    """A kind of call whose tensors passed the checks, and its many-tensor launches: the
    parameters that fit one (kernels.fits_one_launch) grouped by dtype, the others (``alone``)
    launched one by one. Under CUDA-graph capture every launch stays per tensor: a table built
    there would need a copy from the host, and one a captured graph reads must outlive it."""

    __slots__ = ("_tables", "alone", "calls")

    def __init__(self):
        self._tables = None
        self.alone = None
        self.calls = 0   # how many calls it served (a heuristic: not counted under a lock)

    def tables(self, lists, device) -> list:
        """The many-tensor tables of this kind of call, made on the first eager call."""
        if self._tables is None:
            from .kernels import ManyTensorTable, fits_one_launch
            rows = list(zip(*lists))
            groups: dict = {}
            alone = []
            if _spans_disjoint(rows):
                for i, row in enumerate(rows):
                    if fits_one_launch(*row[:4]):
                        groups.setdefault(row[0].dtype, []).append(row)
                    else:
                        alone.append(i)
            else:
                alone = list(range(len(rows)))
            self.alone = alone   # before the tables: a thread that sees them reads it
            self._tables = [ManyTensorTable(group, device) for group in groups.values()]
        return self._tables


_KEYWORDS = ("lr", "betas", "eps", "weight_decay", "maximize")   # the functional call's
RECENT_KINDS = 4   # servers a plan keeps (parameter groups stepped in turn)
_SEQUENCES = frozenset((list, tuple))


def _plain_floats(betas, eps, weight_decay) -> bool:
    """Whether betas is a tuple of two floats and eps and weight_decay are floats: the only
    kinds a server keeps and takes (equal values of other kinds may check otherwise)."""
    return type(betas) is tuple and len(betas) == 2 and type(betas[0]) is float \
        and type(betas[1]) is float and type(eps) is float and type(weight_decay) is float


def _serves_on(device: torch.device) -> bool:
    """Whether calls on ``device`` get servers: CUDA ones (a server tests the CUDA stream)."""
    return device.type == "cuda"


class _RecentStep:
    """Serves an AdamW call of one checked kind again, through ``plan.execute`` or the
    functional call (see ``AdamWStep.serve_recent``), with only the tests that tell it is one:
    no plan lookup and no checks. It launches nothing for any other call. A float lr is the one
    value that may change (a schedule's): it is tested as the checks test it. It holds the
    checked call's tables, so they outlive the plan's memory of them."""

    __slots__ = ("_checked", "_lengths", "_addresses", "_guard", "_lr",
                 "_fixed", "_maximize", "_launches", "_device", "_stream", "_done")

    def __init__(self, checked: _CheckedCall, lists: tuple, flat: list, guard, lr,
                 betas: tuple, eps: float, weight_decay: float, maximize: bool):
        self._checked = checked
        self._lengths = tuple(map(len, lists))
        self._addresses = tuple(map(_Tensor.data_ptr, flat))
        self._guard = guard.check   # ``binding.tensor_guard`` of ``flat``
        self._lr = lr if isinstance(lr, torch.Tensor) else None   # None: any float lr
        self._fixed = (betas, eps, weight_decay)
        beta1, beta2 = _betas(betas)
        from .kernels import adamw_many_launcher
        hyper = dict(beta1=beta1, beta2=beta2, eps=real_value("eps", eps, 0.0),
                     weight_decay=real_value("weight_decay", weight_decay, 0.0),
                     maximize=maximize)
        # the full call on this stream waited there for the tables' upload and kept them for it
        self._launches = tuple(adamw_many_launcher(table, lr_tensor=self._lr, **hyper)
                               for table in checked._tables)
        self._maximize = maximize
        self._device = flat[0].get_device()
        self._stream = binding._current_raw_stream(self._device)
        self._done = Result((), ())

    def __call__(self, args: tuple, kwargs: dict) -> Result | None:
        """The functional call's server: its ``Result`` (empty), or None."""
        if len(args) != 5 or tuple(kwargs) != _KEYWORDS \
                or kwargs["maximize"] is not self._maximize:
            return None
        return self._done if self.serve(args, kwargs["lr"], kwargs["betas"], kwargs["eps"],
                                        kwargs["weight_decay"]) else None

    def serve(self, args: tuple, lr, given, given_eps, given_decay) -> bool:
        """Whether it launched this step: ``args`` the five lists, the rest as given."""
        a0, a1, a2, a3, a4 = args
        if type(a0) not in _SEQUENCES or type(a1) not in _SEQUENCES \
                or type(a2) not in _SEQUENCES or type(a3) not in _SEQUENCES \
                or type(a4) not in _SEQUENCES \
                or (len(a0), len(a1), len(a2), len(a3), len(a4)) != self._lengths:
            return False
        flat = [*a0, *a1, *a2, *a3, *a4]
        try:
            if tuple(map(_Tensor.data_ptr, flat)) != self._addresses or not self._guard(*flat):
                return False
        except TypeError:   # something in a list that is not a tensor
            return False
        # kinds first: a tensor compared by value would be read on the host
        if not _plain_floats(given, given_eps, given_decay) \
                or (given, given_eps, given_decay) != self._fixed:
            return False
        if self._lr is not None:
            if lr is not self._lr:
                return False
        elif type(lr) is not float or not 0.0 <= lr < math.inf:
            return False
        if binding._current_raw_stream(self._device) != self._stream \
                or torch._C._cuda_isCurrentStreamCapturing():
            return False
        for launch in self._launches:
            launch(lr)
        return True


def _tensor_list(name: str, value, length: int | None = None) -> list:
    if isinstance(value, torch.Tensor) or not isinstance(value, (list, tuple)):
        raise ContractError(f"{name}: expected a list of tensors, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise ContractError(f"{name}: expected {length} tensors (one per parameter), got {len(value)}")
    for i, t in enumerate(value):
        require_tensor(f"{name}[{i}]", t)
    return list(value)


def parameter_list(params) -> list:
    """``params`` as a non-empty list whose first element is a tensor (a ContractError
    otherwise): what picks the device, the runtime and the plan. The other elements are checked
    in ``execute`` with every other list, once per kind of call (a list of 100 parameters
    checked here on every call cost more host time than the launch)."""
    if isinstance(params, torch.Tensor) or not isinstance(params, (list, tuple)):
        raise ContractError(f"params: expected a list of tensors, got {type(params).__name__}")
    if not params:
        raise ContractError("params: expected at least one tensor, got an empty list")
    require_tensor("params[0]", params[0])
    return list(params)


def _betas(betas) -> tuple[float, float]:
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ContractError(f"betas: expected a pair (beta1, beta2), got {betas!r}")
    return (real_value("betas[0]", betas[0], 0.0, 1.0, high_open=True),
            real_value("betas[1]", betas[1], 0.0, 1.0, high_open=True))


def _check_lr(lr, device: torch.device):
    if isinstance(lr, torch.Tensor):
        if lr.numel() != 1 or lr.dtype != torch.float32 or lr.device != device:
            raise ContractError(f"lr: a tensor lr must be one float32 element on {device}, got "
                                f"{dtype_name(lr.dtype)} shape {tuple(lr.shape)} on {lr.device}")
        return lr
    return real_value("lr", lr, 0.0)


class AdamWStep(Plan):
    """One AdamW step, in place, over lists of parameters, gradients, both moments and the
    per-parameter step counts (FP32 one-element tensors on the device, already counting this
    step, as ``torch.optim.AdamW(capturable=True)`` keeps them). p, g, m and v of one parameter
    share a dtype (BF16, FP16 or FP32) and a shape and are contiguous; the math is FP32.

    >>> plan = AdamWStep(params, grads, ms, vs, steps, lr=1e-3).compile()      # doctest: +SKIP
    >>> plan.execute(params, grads, ms, vs, steps, lr=1e-3)                    # doctest: +SKIP
    """

    op = "adamw_step"
    output_names = ()
    serves_recent_calls = True

    def _compile(self) -> None:
        # calls whose tensors passed the checks, by everything the checks read (addresses,
        # shapes, dtypes, devices, contiguity), oldest first; how often a call was not one
        self._checked_calls: dict = {}
        self._remembering = threading.Lock()
        self.checked_calls_missed = 0
        self._servers: tuple = ()   # _RecentStep of the last few kinds, newest first

    def execute(self, params, grads, exp_avgs, exp_avg_sqs, steps, *, lr=1e-3, betas=(0.9, 0.999),
                eps: float = 1e-8, weight_decay: float = 1e-2, workspace=None, stream=None) -> None:
        lists = (params, grads, exp_avgs, exp_avg_sqs, steps)
        if stream is None:
            for server in self._servers:
                if server.serve(lists, lr, betas, eps, weight_decay):
                    return
        given = (lr, betas, eps, weight_decay)
        key = _tensors_key(lists)
        checked = self._checked_calls.get(key) if key is not None else None
        if checked is None:
            lists = self._check_tensors(*lists)
            self.checked_calls_missed += 1
        device = lists[0][0].device
        lr = _check_lr(lr, device)
        if isinstance(lr, torch.Tensor) != self.contract.flag("lr_on_device"):
            raise ContractError("lr: this plan was built for a "
                                f"{'tensor' if self.contract.flag('lr_on_device') else 'float'} lr")
        beta1, beta2 = _betas(betas)
        eps = real_value("eps", eps, 0.0)
        weight_decay = real_value("weight_decay", weight_decay, 0.0)
        hyper = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                     maximize=self.contract.flag("maximize"))
        if checked is None:
            checked = _CheckedCall()
            if key is not None:
                self._remember(key, checked)
        checked.calls += 1
        if self.backend == "reference":
            adamw_step_reference(*lists, **hyper)
            return
        from .kernels import launch_adamw, launch_adamw_many
        with on_stream(stream):
            tables = None if is_capturing(device) else checked.tables(lists, device)
            if tables is None:   # under capture the launches stay per tensor (see _CheckedCall)
                launch_adamw(*lists, **hyper)
                return
            for table in tables:
                table.keep_for_current_stream()
                launch_adamw_many(table, **hyper)
            if checked.alone:
                launch_adamw(*([ts[i] for i in checked.alone] for ts in lists), **hyper)
        if stream is None and _serves_on(device):
            self._keep_server(checked, lists, *given)

    def _keep_server(self, checked: _CheckedCall, lists: tuple, lr, betas, eps,
                     weight_decay) -> None:
        """After an eager call on the current CUDA stream: a server for its kind
        (``_RecentStep``), unless it has one or is not one to serve so: seen once only (fresh
        gradients every step would pay for a guard each call), some parameter launched alone,
        a hyperparameter not a plain float."""
        if checked.calls < 2 or checked.alone or not checked._tables \
                or not _plain_floats(betas, eps, weight_decay) \
                or not (type(lr) is float or isinstance(lr, torch.Tensor)):
            return
        fixed, lr_tensor = (betas, eps, weight_decay), lr if type(lr) is not float else None
        servers = self._servers
        if any(s._checked is checked and s._fixed == fixed and s._lr is lr_tensor
               for s in servers):
            return
        flat = [t for ts in lists for t in ts]
        guard = binding.tensor_guard(flat)
        if guard is None:
            return
        server = _RecentStep(checked, lists, flat, guard, lr, betas, eps, weight_decay,
                             self.contract.flag("maximize"))
        self._servers = (server, *servers[:RECENT_KINDS - 1])

    def serve_recent(self, args: tuple, kwargs: dict) -> Result | None:
        """A functional call served by one of the servers ``execute`` kept (``Plan.serve_recent``;
        ``_keep_server``): the same tensors in every list (addresses, shapes, strides, dtypes,
        devices), the same betas, eps, weight_decay and maximize, the same lr tensor or any
        float lr, the same stream and no capture. None, having launched nothing, otherwise."""
        for server in self._servers:
            result = server(args, kwargs)
            if result is not None:
                return result
        return None

    def _check_tensors(self, params, grads, exp_avgs, exp_avg_sqs, steps) -> tuple:
        params = _tensor_list("params", parameter_list(params))
        n = len(params)
        lists = (params, *(_tensor_list(name, value, n) for name, value in
                           zip(LISTS[1:], (grads, exp_avgs, exp_avg_sqs, steps))))
        device = params[0].device
        for i, (p, g, m, v, step) in enumerate(zip(*lists)):
            if p.dtype not in DTYPES:
                raise ContractError(f"params[{i}]: expected dtype bfloat16, float16 or float32, got "
                                    f"{dtype_name(p.dtype)}")
            for name, t in (("params", p), ("grads", g), ("exp_avgs", m), ("exp_avg_sqs", v)):
                if t.dtype != p.dtype or t.shape != p.shape or t.device != device:
                    raise ContractError(f"{name}[{i}]: expected {dtype_name(p.dtype)} {tuple(p.shape)} "
                                        f"on {device} like params[{i}], got {dtype_name(t.dtype)} "
                                        f"{tuple(t.shape)} on {t.device}")
                if not t.is_contiguous():
                    raise ContractError(f"{name}[{i}]: expected a contiguous tensor, got strides "
                                        f"{t.stride()}")
            if step.dtype != torch.float32 or step.numel() != 1 or step.device != device:
                raise ContractError(f"steps[{i}]: expected one float32 element on {device} (the step "
                                    f"count), got {dtype_name(step.dtype)} shape {tuple(step.shape)} "
                                    f"on {step.device}")
            require_disjoint({f"params[{i}]": p, f"exp_avgs[{i}]": m, f"exp_avg_sqs[{i}]": v},
                             {f"grads[{i}]": g, f"steps[{i}]": step})
        return lists

    def _remember(self, key, checked) -> None:
        with self._remembering:
            calls = self._checked_calls
            calls[key] = checked
            while len(calls) > CHECKED_CALLS:
                calls.pop(next(iter(calls)), None)
