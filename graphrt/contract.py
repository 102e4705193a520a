"""Static descriptions of a call: what a compiled plan depends on and nothing else.

A :class:`Contract` is the plan-store key. It holds plan-time facts only (op, backend, device
type and compute capability, dtypes, static dims, layout classes, flags); run-time extents such as
row or token counts are recorded as ``None`` in a :class:`TensorSpec` shape, so one plan serves
every value of them.
"""
from __future__ import annotations

from operator import itemgetter
from typing import Any, NamedTuple

import torch
from torch import Tensor

from .errors import ContractError
from .validate import dtype_name, require_tensor, tensor_spec_layout

DYNAMIC = None  # marks a run-time extent in TensorSpec.shape


class TensorSpec(NamedTuple):
    """One tensor argument as a plan sees it: name, dtype, static shape and layout class.

    ``shape`` holds ints for static dims and ``None`` for dims known only at run time.
    An optional argument that was not given is described with ``dtype=None``.

    >>> TensorSpec("x", torch.bfloat16, (None, 4096), "rows")
    TensorSpec(name='x', dtype=torch.bfloat16, shape=(None, 4096), layout='rows')
    """

    name: str
    dtype: torch.dtype | None
    shape: tuple
    layout: str

    @classmethod
    def absent(cls, name: str) -> "TensorSpec":
        spec = _ABSENT.get(name)
        if spec is None:
            spec = _ABSENT[name] = cls(name, None, (), "absent")
        return spec

    @property
    def present(self) -> bool:
        return self.dtype is not None


_ABSENT: dict[str, TensorSpec] = {}
_new_spec = tuple.__new__  # TensorSpec(...) runs Python-level code; plan-store keys are hot


def row_spec(name: str, t) -> TensorSpec:
    """Spec of a [..., H] operand read in rows: the row count is dynamic, the layout class is
    'rows' or 'unsupported: <reason>' (reported by check_support)."""
    if t is None:
        return TensorSpec.absent(name)
    if not isinstance(t, Tensor):
        require_tensor(name, t)
    shape = t.shape
    if shape and t.is_contiguous():
        return _new_spec(TensorSpec, (name, t.dtype, (DYNAMIC, shape[-1]), "rows"))
    return _new_spec(TensorSpec, (name, t.dtype, (DYNAMIC, shape[-1] if shape else 0),
                                  tensor_spec_layout(name, t)))


def check_row_spec(spec: TensorSpec, dtypes: tuple, last_dim: int | None = None) -> None:
    """check_support's side of ``row_spec``: raise ContractError for a wrong dtype, an
    unsupported layout (with the reason recorded in the key) or a last dim other than
    ``last_dim``. Absent optional operands pass."""
    if not spec.present:
        return
    if spec.dtype not in dtypes:
        want = " or ".join(dtype_name(d) for d in dtypes)
        raise ContractError(f"{spec.name}: expected dtype {want}, got {dtype_name(spec.dtype)}")
    if spec.layout.startswith("unsupported"):
        raise ContractError(spec.layout.split(": ", 1)[1])
    if last_dim is not None and spec.shape[1] != last_dim:
        raise ContractError(f"{spec.name}: expected last dim {last_dim} (like x), got {spec.shape[1]}")


def compact_spec(name: str, t, dynamic_dims: tuple[int, ...] = ()) -> TensorSpec:
    """Spec of an operand that must be compact row-major: ``dynamic_dims`` are run-time extents,
    the layout class is 'contiguous' or 'strided <strides>' (rejected by check_support)."""
    if t is None:
        return TensorSpec.absent(name)
    require_tensor(name, t)
    shape = tuple(DYNAMIC if i in dynamic_dims else d for i, d in enumerate(t.shape))
    layout = "contiguous" if t.is_contiguous() else f"strided {tuple(t.stride())}"
    return _new_spec(TensorSpec, (name, t.dtype, shape, layout))


def compact_rows_spec(name: str, t) -> TensorSpec:
    """``compact_spec`` with a run-time row count (dim 0)."""
    return compact_spec(name, t, (0,))


def vector_spec(name: str, t) -> TensorSpec:
    """Spec of a fully static operand such as a weight: its whole shape is part of the key."""
    if not isinstance(t, Tensor):
        require_tensor(name, t)
    # torch.Size is a tuple: equal to, and hashed like, the plain tuple of its dims
    return _new_spec(TensorSpec, (name, t.dtype, t.shape,
                                  "contiguous" if t.is_contiguous() else "strided"))


class Contract(tuple):
    """Hashable, immutable key of a plan: ``op``, ``backend``, device facts, tensor specs, flags.

    A tuple underneath, so that hashing and comparing keys on every plan-store lookup run in C.

    >>> c = Contract("rmsnorm_forward", "triton", "cuda", (9, 0),
    ...              (TensorSpec("x", torch.bfloat16, (None, 4096), "rows"),), {"eps": 1e-6})
    >>> c == Contract("rmsnorm_forward", "triton", "cuda", (9, 0),
    ...               (TensorSpec("x", torch.bfloat16, (None, 4096), "rows"),), {"eps": 1e-6})
    True
    """

    __slots__ = ()

    def __new__(cls, op: str, backend: str, device_type: str, capability: tuple | None,
                tensors: tuple[TensorSpec, ...], flags: dict[str, Any] | tuple | None = None):
        # a tuple of (name, value) pairs is taken in the order given (plans pass a fixed order)
        if type(flags) is not tuple:
            flags = tuple(sorted((flags or {}).items()))
        if type(tensors) is not tuple:
            tensors = tuple(tensors)
        return tuple.__new__(cls, (op, backend, device_type, capability, tensors, flags))

    op = property(itemgetter(0))
    backend = property(itemgetter(1))
    device_type = property(itemgetter(2))
    capability = property(itemgetter(3))
    tensors = property(itemgetter(4))
    flags = property(itemgetter(5))

    def spec(self, name: str) -> TensorSpec:
        for s in self.tensors:
            if s.name == name:
                return s
        raise KeyError(name)

    def flag(self, name: str) -> Any:
        return dict(self.flags)[name]

    def dynamic_dims(self) -> dict[str, tuple[int, ...]]:
        """Which dims of which tensors are run-time extents."""
        return {s.name: tuple(i for i, d in enumerate(s.shape) if d is DYNAMIC)
                for s in self.tensors if s.present}

    def __repr__(self) -> str:
        specs = ", ".join(f"{s.name}:{str(s.dtype).replace('torch.', '')}{list(s.shape)}/{s.layout}"
                          for s in self.tensors if s.present)
        flags = ", ".join(f"{k}={v}" for k, v in self.flags)
        return (f"Contract({self.op}, {self.backend}, {self.device_type}{self.capability or ''}, "
                f"[{specs}], {{{flags}}})")
