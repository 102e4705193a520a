"""Sticky device-side error flags: what kernels found wrong where the host cannot look.

Inside ``plan.execute`` and under CUDA-graph capture nothing may synchronize, so a kernel that
meets bad metadata (say grouped-GEMM offsets past ``tokens_sum``) keeps within its buffers, gives
the affected outputs a defined value, and sets a bit here. ``graphrt.check_errors()`` reads the
flags (one host sync), clears them and raises :class:`DeviceCheckError` naming what was found.

One int32 pair per device: word 0 is a bit mask of :data:`PROBLEMS`, word 1 the lowest index
(expert, row...) reported with it.
"""
from __future__ import annotations

import threading

import torch

from . import binding
from .errors import CaptureError, DeviceCheckError

# bit -> what it means (the kernels set these bits; keep the numbers stable)
OFFSETS_DECREASING = 1
OFFSETS_OUT_OF_RANGE = 2
OFFSETS_LAST_NOT_TOTAL = 4
PROBLEMS = {
    OFFSETS_DECREASING: "grouped_gemm_wgrad offsets: an expert's end is below its begin (the "
                        "expert was treated as empty)",
    OFFSETS_OUT_OF_RANGE: "grouped_gemm_wgrad offsets: an end is negative or past tokens_sum "
                          "(the expert was treated as empty)",
    OFFSETS_LAST_NOT_TOTAL: "grouped_gemm_wgrad offsets: the last end is not tokens_sum (tokens "
                            "after it were ignored)",
}
NO_INDEX = 2**31 - 1

_flags: dict = {}        # (device type, index) -> flags
_by_device: dict = {}    # the device objects callers pass -> the same flags
_lock = threading.Lock()


def _key(device: torch.device):
    return (device.type, device.index if device.index is not None else
            (torch.cuda.current_device() if device.type == "cuda" else -1))


def error_flags(device: torch.device) -> torch.Tensor:
    """The device's int32 [2] flag tensor, made on first use (which must not be under capture:
    compiling a plan makes it, so warm-ups and eager calls do). Looked up per execute: a device
    seen before costs one dictionary lookup."""
    flags = _by_device.get(device)
    if flags is None:
        device = torch.device(device)
        flags = _made_flags(_key(device))
        if device.index is not None or device.type != "cuda":   # "cuda" alone follows the
            _by_device[device] = flags                           # current device: not cached
    return flags


def _made_flags(key) -> torch.Tensor:
    flags = _flags.get(key)
    if flags is None:
        with _lock:
            flags = _flags.get(key)
            if flags is None:
                if key[0] == "cuda" and torch.cuda.is_current_stream_capturing():
                    raise CaptureError("graphrt's device error flags do not exist yet on "
                                       f"cuda:{key[1]}; compile the plan or run the call once "
                                       "eagerly before capturing it")
                flags = torch.tensor([0, NO_INDEX], dtype=torch.int32,
                                     device=torch.device(key[0], key[1]) if key[0] == "cuda"
                                     else key[0])
                binding.keep_address(flags)
                _flags[key] = flags
    return flags


def read_errors(device=None, *, clear: bool = True) -> list[tuple[int, str, int | None]]:
    """The problems flagged on ``device`` (None: every device with flags) as (bit, message,
    lowest index or None); reading synchronizes with the host. ``clear`` resets the flags."""
    found = []
    keys = list(_flags) if device is None else [_key(torch.device(device))]
    for key in keys:
        flags = _flags.get(key)
        if flags is None:
            continue
        mask, index = (int(v) for v in flags.tolist())
        if clear and mask:
            flags.copy_(torch.tensor([0, NO_INDEX], dtype=torch.int32))
        for bit, message in PROBLEMS.items():
            if mask & bit:
                found.append((bit, message, None if index == NO_INDEX else index))
    return found


def check_errors(device=None) -> None:
    """Raise :class:`DeviceCheckError` if a kernel flagged bad input since the last check (then
    the flags are cleared). Synchronizes with the host: call it between steps, not inside a
    captured function.

    >>> step(x, y)                         # doctest: +SKIP
    >>> graphrt.check_errors()             # raises if, say, the routing offsets were invalid
    """
    found = read_errors(device)
    if found:
        lines = [f"{msg} (first at index {idx})" if idx is not None else msg
                 for _, msg, idx in found]
        raise DeviceCheckError("a kernel flagged bad input: " + "; ".join(lines))
