"""Argument checks shared by every op. Each raises ContractError naming the argument, what was
expected and what was given; none of them touches tensor data or launches anything."""
from __future__ import annotations

import math
import numbers
from functools import lru_cache
from typing import Iterable, Mapping

import torch

from .errors import ContractError

ALIGN_BYTES = 16


def dtype_name(dtype: torch.dtype | None) -> str:
    """'bfloat16' for torch.bfloat16: how error messages name dtypes."""
    return str(dtype).replace("torch.", "")


def require_tensor(name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise ContractError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    return t


def require_dtype(name: str, t: torch.Tensor, allowed: Iterable[torch.dtype]) -> None:
    allowed = tuple(allowed)
    if t.dtype not in allowed:
        want = " or ".join(dtype_name(d) for d in allowed)
        raise ContractError(f"{name}: expected dtype {want}, got {dtype_name(t.dtype)}")


def require_aligned(name: str, t: torch.Tensor, align: int = ALIGN_BYTES) -> None:
    if t.numel() and t.data_ptr() % align:
        raise ContractError(f"{name}: data pointer must be {align}-byte aligned, "
                            f"got address {t.data_ptr():#x}")


def row_layout(name: str, t: torch.Tensor, hidden: int | None = None) -> tuple[int, int]:
    """Rows of a [..., H] tensor read in place: returns (rows, row_stride in elements).

    The last dim must have unit stride, the leading dims must collapse into one row axis with a
    single stride, and that stride must be a multiple of 16 bytes.
    """
    if t.dim() == 0:
        raise ContractError(f"{name}: expected a tensor of shape [..., H], got a scalar")
    h = t.shape[-1]
    if hidden is not None and h != hidden:
        raise ContractError(f"{name}: expected last dim {hidden}, got shape {tuple(t.shape)}")
    if t.is_contiguous() and (h * t.element_size()) % ALIGN_BYTES == 0:
        return (t.numel() // h if h else 0), h  # the common case: compact rows
    if h > 1 and t.stride(-1) != 1:
        raise ContractError(f"{name}: layout not supported: the last dim must have unit stride, "
                            f"got strides {t.stride()} for shape {tuple(t.shape)}")
    rows = 1
    for d in t.shape[:-1]:
        rows *= d
    if t.dim() == 1 or rows <= 1:
        return rows, h
    lead = [(s, st) for s, st in zip(t.shape[:-1], t.stride()[:-1]) if s != 1]
    row_stride = lead[-1][1]
    expected = row_stride
    for size, stride in reversed(lead):
        if stride != expected:
            raise ContractError(
                f"{name}: layout not supported: leading dims of shape {tuple(t.shape)} with "
                f"strides {t.stride()} do not collapse into rows of one stride")
        expected = stride * size
    if row_stride < h:
        raise ContractError(f"{name}: layout not supported: row stride {row_stride} is smaller "
                            f"than the row length {h} (rows overlap)")
    if (row_stride * t.element_size()) % ALIGN_BYTES:
        raise ContractError(f"{name}: layout not supported: row stride {row_stride} elements "
                            f"({row_stride * t.element_size()} bytes) is not a multiple of "
                            f"{ALIGN_BYTES} bytes")
    return rows, row_stride


def _span(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, last byte + 1) of the memory ``t`` can reach (``t`` not empty)."""
    start = t.data_ptr()
    if t.is_contiguous():
        return start, start + t.nbytes
    last = sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0)
    return start, start + (last + 1) * t.element_size()


def require_disjoint(outputs: Mapping[str, torch.Tensor | None],
                     inputs: Mapping[str, torch.Tensor | None]) -> None:
    """``outputs`` must not overlap ``inputs`` or each other (by address range)."""
    spans = []
    for name, t in inputs.items():
        if t is not None and t.numel():
            spans.append((name, t.device, *_span(t)))
    for name, t in outputs.items():
        if t is None or not t.numel():
            continue
        device = t.device
        lo, hi = _span(t)
        for other, other_device, other_lo, other_hi in spans:
            if lo < other_hi and other_lo < hi and other_device == device:
                raise ContractError(f"{name}: memory overlaps {other}")
        spans.append((name, device, lo, hi))


@lru_cache(maxsize=None)
def device_capability(device: torch.device) -> tuple[int, int] | None:
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


@lru_cache(maxsize=None)
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 2 for the CPU (the Triton interpreter)."""
    if device.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


def rows_operand(name: str, t: object, dtypes: Iterable[torch.dtype], hidden: int,
                 rows: int | None = None, device: torch.device | None = None) -> int:
    """Run-time check of a [..., hidden] operand read or written in rows; returns its row stride."""
    t = require_tensor(name, t)
    require_dtype(name, t, dtypes)
    if device is not None and t.device != device:
        raise ContractError(f"{name}: expected device {device}, got {t.device}")
    n, stride = row_layout(name, t, hidden)
    if rows is not None and n != rows:
        raise ContractError(f"{name}: expected {rows} rows of {hidden}, got shape {tuple(t.shape)}")
    require_aligned(name, t)
    return stride


def vector_operand(name: str, t: object, dtypes: Iterable[torch.dtype], length: int,
                   device: torch.device | None = None) -> torch.Tensor:
    """Run-time check of a compact 1-D operand such as a weight or per-row statistic."""
    t = require_tensor(name, t)
    require_dtype(name, t, dtypes)
    if device is not None and t.device != device:
        raise ContractError(f"{name}: expected device {device}, got {t.device}")
    if t.numel() != length or not t.is_contiguous():
        raise ContractError(f"{name}: expected {length} contiguous elements, got shape "
                            f"{tuple(t.shape)} with strides {t.stride()}")
    require_aligned(name, t, t.element_size())
    return t


def compact_operand(name: str, t: object, dtypes: Iterable[torch.dtype], shape: tuple,
                    device: torch.device) -> torch.Tensor:
    """Run-time check of a compact row-major operand of a fixed shape, any rank."""
    t = require_tensor(name, t)
    require_dtype(name, t, dtypes)
    if t.device != device:
        raise ContractError(f"{name}: expected device {device}, got {t.device}")
    if tuple(t.shape) != tuple(shape):
        raise ContractError(f"{name}: expected shape {tuple(shape)}, got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ContractError(f"{name}: expected a compact row-major tensor, got strides {t.stride()}")
    require_aligned(name, t)
    return t


def workspace_as(workspace: torch.Tensor, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
    """The first ``nbytes`` of checked scratch, viewed as ``dtype`` (no slice when the scratch
    is exactly that size, as the arena's is)."""
    if workspace.numel() != nbytes:
        workspace = workspace[:nbytes]
    return workspace.view(dtype)


def counters_operand(counters: object, words: int, device: torch.device) -> torch.Tensor | None:
    """Run-time check of zeroed counters (see ``WorkspaceArena.counters``): None, or at least
    ``words`` contiguous int32 on ``device``; None, whatever was passed, where the plan takes
    none (``words`` 0)."""
    if counters is None or words == 0:
        return None
    counters = require_tensor("counters", counters)
    if counters.dtype != torch.int32 or counters.device != device or counters.dim() != 1 \
            or counters.stride(0) != 1 or counters.numel() < words:
        raise ContractError(f"counters: expected at least {words} contiguous int32 words on "
                            f"{device} (the runtime's arena gives them), got "
                            f"{dtype_name(counters.dtype)} {tuple(counters.shape)} on "
                            f"{counters.device}")
    return counters


def workspace_operand(workspace: object, nbytes: int, device: torch.device) -> torch.Tensor | None:
    """Run-time check of caller-provided scratch: at least ``nbytes``, on ``device``, aligned."""
    if nbytes == 0:
        return None
    if workspace is None:
        raise ContractError(f"workspace: this plan needs {nbytes} bytes of scratch, got None "
                            f"(the functional call takes it from the runtime's arena)")
    workspace = require_tensor("workspace", workspace)
    have = workspace.numel() * workspace.element_size()
    if have < nbytes:
        raise ContractError(f"workspace: expected at least {nbytes} bytes, got {have}")
    if workspace.device != device:
        raise ContractError(f"workspace: expected device {device}, got {workspace.device}")
    if not workspace.is_contiguous():
        raise ContractError("workspace: expected a contiguous buffer")
    require_aligned("workspace", workspace, 256 if device.type == "cuda" else ALIGN_BYTES)
    return workspace


def tensor_spec_layout(name: str, t: torch.Tensor) -> str:
    """Layout class of a row operand for a plan key: 'rows', or 'unsupported: <reason>'."""
    if t.is_contiguous() and t.dim():
        return "rows"  # the hot path: plan-store lookups must stay within a few microseconds
    try:
        row_layout(name, t)
    except ContractError as err:
        return f"unsupported: {err}"
    return "rows"


# -- scalar configuration (checked when the contract is built, before anything runs) ------------
FLOAT32_MIN_NORMAL = 1.1754943508222875e-38


def flag_value(name: str, value: object) -> bool:
    """A yes/no keyword: True or False (numpy bools too), nothing that merely converts."""
    if value is True or value is False:
        return value
    if type(value).__name__ == "bool_":   # numpy.bool_
        return bool(value)
    raise ContractError(f"{name}: expected True or False, got {value!r}")


def int_value(name: str, value: object) -> int:
    """An integer keyword: an int (not a bool, not a float that would be truncated)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise ContractError(f"{name}: expected an int, got {value!r}")
    return int(value.__index__())


def real_value(name: str, value: object, low: float, high: float = math.inf, *,
               high_open: bool = False) -> float:
    """A real keyword (not a bool), finite and in [low, high] (or [low, high) with high_open)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ContractError(f"{name}: expected a float, got {type(value).__name__}")
    v = float(value)
    if not (math.isfinite(v) and low <= v and (v < high if high_open else v <= high)):
        span = f"[{low}, {high})" if high_open else f"[{low}, {high}]"
        raise ContractError(f"{name}: expected a finite value in {span}, got {v}")
    return v


def eps_value(eps: object) -> float:
    """eps of a norm: a positive finite real, at least the smallest normal FP32 (the kernels add
    it in FP32, where anything smaller is 0 and an all-zero row would give 0 * inf)."""
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise ContractError(f"eps: expected a positive finite float, got {eps!r}")
    value = float(eps)
    if not (math.isfinite(value) and value >= FLOAT32_MIN_NORMAL):
        raise ContractError(f"eps: expected a positive finite float of at least "
                            f"{FLOAT32_MIN_NORMAL:.6g} (the smallest normal FP32), got {eps!r}")
    return value


def size_value(name: str, value: object, *, multiple: int = 1, low: int = 1,
               high: int | None = None) -> int:
    """A size argument (a module's hidden size, say): an int, a multiple of ``multiple`` in
    [low, high]."""
    v = int_value(name, value)
    if v % multiple or v < low or (high is not None and v > high):
        span = f"[{low}, {high}]" if high is not None else f">= {low}"
        what = f"a multiple of {multiple} in {span}" if multiple > 1 else f"an int {span}"
        raise ContractError(f"{name}: expected {what}, got {v}")
    return v
