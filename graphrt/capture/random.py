"""A small graph-safe random kernel: uniform numbers from the runtime's device-side RNG state."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..errors import ContractError, UnsupportedError
from ..kernel_utils import (cdiv, CompileCase, CONSTEXPR, launch)
from ..rng import RngState
from ..validate import dtype_name, require_tensor


@triton.jit(do_not_specialize=["n"])
def _uniform_kernel(OUT, STATE, n, BLOCK: tl.constexpr):
    seed = tl.load(STATE)
    offset = tl.load(STATE + 1)
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    # Philox counter = offset + element index (low 32 bits), so values depend on (seed, offset)
    # and the element alone, not on the launch shape
    r = tl.rand(seed, (offset + idx).to(tl.uint32))
    tl.store(OUT + idx, r, mask=idx < n)


def uniform_(out: torch.Tensor, rng: RngState) -> torch.Tensor:
    """Fill FP32 ``out`` with U[0, 1) draws at ``rng``'s (seed, offset), then advance the offset
    by ``out.numel()``. Capturable: replays of a graph holding it draw fresh values.

    >>> rng = graphrt.runtime().rng; rng.set(7)              # doctest: +SKIP
    >>> uniform_(torch.empty(1000, device="cuda"), rng)      # doctest: +SKIP
    """
    require_tensor("out", out)
    if out.device.type != "cuda":
        raise UnsupportedError(f"out: uniform_ runs on a CUDA device, got a tensor on {out.device}")
    if out.dtype != torch.float32 or not out.is_contiguous() or out.device != rng.device:
        raise ContractError(f"out: expected a contiguous float32 tensor on {rng.device}, got "
                            f"{dtype_name(out.dtype)} on {out.device}")
    n = out.numel()
    if n:
        block = 1024
        launch(_uniform_kernel, (cdiv(n, block),), out, rng.state, n, BLOCK=block,
               num_warps=4)
    rng.advance(n)
    return out


def compile_cases() -> list[CompileCase]:
    """The variant scripts/compile_check.py compiles."""
    return [CompileCase("uniform", _uniform_kernel,
                        dict(OUT="*fp32", STATE="*i64", n="i32", BLOCK=CONSTEXPR),
                        dict(BLOCK=1024))]
