"""Plans for HSTU LayerNorm-Multiply-SiLU-Dropout forward and backward."""
from __future__ import annotations

import math

import torch

from ...contract import Contract, check_row_spec
from ...errors import ContractError
from ...plan import Plan, write_reference
from ...streams import on_stream
from ...reduction import grouped_counter_words, grouped_workspace_bytes
from ...validate import (compact_operand, counters_operand, dtype_name, require_disjoint,
                         require_tensor, rows_operand, sm_count, vector_operand, workspace_as,
                         workspace_operand)
from .philox import keep_threshold, split_int64
from .reference import hstu_lmsd_backward_reference, hstu_lmsd_forward_reference

BF16 = torch.bfloat16
MIN_D, MAX_D = 8, 4096
# the widest rows whose partials the backward's last programs sum in its own launch: at D=512
# the kernel took what the second launch does (H100, 2026-12-07), at D=4096 18% longer (one
# program reads 17 rows of 32 KB one after another)
ONE_LAUNCH_MAX_D = 512
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def dropout_p32(p) -> float:
    """p as the kernels see it (FP32); must be finite and in [0, 1) after the conversion."""
    try:
        p32 = float(torch.tensor(float(p), dtype=torch.float32))
    except (TypeError, ValueError):
        raise ContractError(f"dropout_ratio: expected a float, got {p!r}") from None
    if not (math.isfinite(p32) and 0.0 <= p32 < 1.0):
        raise ContractError(f"dropout_ratio: expected a finite value in [0, 1) in FP32, got {p!r}"
                            + (f" (FP32 rounds it to {p32})" if p32 != float(p) else ""))
    return p32


def _require_2d(name: str, t, d: int) -> None:
    t = require_tensor(name, t)
    if t.dim() != 2:
        raise ContractError(f"{name}: expected a 2-D [N, {d}] tensor (flatten the leading dims), "
                            f"got shape {tuple(t.shape)}")


def _segments(contract: Contract) -> int:
    return 1 + contract.flag("concat_u") + contract.flag("concat_x")


def _check_common(contract: Contract, rows_names: tuple[str, ...]) -> int:
    x = contract.spec("x")
    d = x.shape[1]
    if d % 8 or not MIN_D <= d <= MAX_D:
        raise ContractError(f"x: D must be a multiple of 8 in [{MIN_D}, {MAX_D}], got {d}")
    for name in rows_names:
        check_row_spec(contract.spec(name), (BF16,))
    for name in ("weight", "bias"):
        spec = contract.spec(name)
        if spec.dtype != BF16 or tuple(spec.shape) != (d,) or spec.layout != "contiguous":
            raise ContractError(f"{name}: expected a contiguous bfloat16 [{d}] tensor, got "
                                f"{dtype_name(spec.dtype)} {tuple(spec.shape)} ({spec.layout})")
    return d


def _rng_value(name: str, value, device: torch.device):
    """seed/offset: a signed 64-bit int, or a one-element int64 tensor on the op's device."""
    if isinstance(value, bool):
        raise ContractError(f"{name}: expected an int or a one-element int64 tensor, got a bool")
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise ContractError(f"{name}: expected a signed 64-bit int, got {value}")
        return value
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.int64 or value.numel() != 1 or value.device != device:
            raise ContractError(f"{name}: expected a one-element int64 tensor on {device}, got "
                                f"{dtype_name(value.dtype)} {tuple(value.shape)} on {value.device}")
        return value
    raise ContractError(f"{name}: expected an int or a one-element int64 tensor, got "
                        f"{type(value).__name__}")


class HstuLmsdForward(Plan):
    """y = [drop(a) if concat_u, drop(x) if concat_x, drop(LayerNorm(x) * w + b) * a)] with
    a = SiLU(u) (or u), inverted dropout from counter-addressed Philox at (seed, offset).

    >>> plan = HstuLmsdForward(x, u, w, b, dropout_ratio=0.1).compile()         # doctest: +SKIP
    >>> plan.execute(x, u, w, b, seed=1, offset=0, y=y, mean=m, rstd=r, mask=k)  # doctest: +SKIP
    """

    op = "hstu_lmsd_forward"
    records_launches = True
    # an int seed and offset reach the kernel only as its seed_lo/hi and off_lo/hi halves, so
    # a call with new ones replays the binding of the last (tensors are addresses anyway)
    run_time_ints = {"seed": (("seed_lo", "seed_hi"), split_int64),
                     "offset": (("off_lo", "off_hi"), split_int64)}
    output_names = ("y", "mean", "rstd", "mask")

    def _check_support(self) -> None:
        c = self.contract
        self.d = _check_common(c, ("x", "u"))
        if c.spec("u").shape[1] != self.d:
            raise ContractError(f"u: expected last dim {self.d} (like x), got {c.spec('u').shape[1]}")
        eps = c.flag("eps")
        if not (math.isfinite(eps) and eps > 0):
            raise ContractError(f"eps: expected a positive finite float, got {eps}")
        self.p = c.flag("dropout_ratio")
        self.segments = _segments(c)

    def _compile(self) -> None:
        if self.backend == "triton":
            from .kernels import forward_config
            self.config = forward_config(self.d)

    def execute(self, x, u, weight, bias, *, seed=0, offset=0, y=None, mean=None, rstd=None,
                mask=None, workspace=None, stream=None) -> None:
        c, d = self.contract, self.d
        device = require_tensor("x", x).device
        _require_2d("x", x, d)
        rows = x.shape[0]
        sx = rows_operand("x", x, (BF16,), d, rows, device)
        su = rows_operand("u", u, (BF16,), d, rows, device)
        vector_operand("weight", weight, (BF16,), d, device)
        vector_operand("bias", bias, (BF16,), d, device)
        sy = rows_operand("y", y, (BF16,), self.segments * d, rows, device)
        vector_operand("mean", mean, (torch.float32,), rows, device)
        vector_operand("rstd", rstd, (torch.float32,), rows, device)
        if self.p > 0:
            mask = compact_operand("mask", mask, (torch.int8,), (rows, d), device)
            seed = _rng_value("seed", seed, device)
            offset = _rng_value("offset", offset, device)
            if isinstance(seed, torch.Tensor) != isinstance(offset, torch.Tensor) or \
                    isinstance(seed, torch.Tensor) != c.flag("rng_tensors"):
                raise ContractError("seed, offset: pass both as ints or both as tensors, as when "
                                    "the plan was built")
        elif mask is not None:
            raise ContractError("mask: dropout_ratio is 0, so there is no mask; pass None")
        require_disjoint({"y": y, "mean": mean, "rstd": rstd, "mask": mask},
                         {"x": x, "u": u, "weight": weight, "bias": bias})
        flags = {k: c.flag(k) for k in ("apply_u_silu", "concat_u", "concat_x")}
        if self.backend == "reference":
            seed_v = int(seed.item()) if isinstance(seed, torch.Tensor) else seed
            off_v = int(offset.item()) if isinstance(offset, torch.Tensor) else offset
            ref = hstu_lmsd_forward_reference(x, u, weight, bias, eps=c.flag("eps"),
                                              dropout_ratio=self.p, seed=seed_v, offset=off_v,
                                              dtype=torch.float32, **flags)
            write_reference((y, mean, rstd, mask), ref)
            return
        from .kernels import launch_forward
        with on_stream(stream):
            launch_forward(self.config, sm_count(x.device), x, u, weight, bias, y, mean, rstd,
                           mask if self.p > 0 else None, seed, offset, rows, (sx, su, sy),
                           c.flag("eps"), flags, keep_threshold(self.p), 1.0 / (1.0 - self.p))


class HstuLmsdBackward(Plan):
    """dx, du and FP32-reduced dweight, dbias (BF16; fixed-order, bitwise reproducible) of
    HstuLmsdForward, given its mean, rstd and mask; ``compute_dweight=False`` skips dweight.
    ``counters`` (``counter_words()`` zeroed int32 words, which the functional call takes from
    its arena; none for D over ``ONE_LAUNCH_MAX_D``) let one launch sum the partials; without
    them a second launch does, with the same bits.

    >>> plan = HstuLmsdBackward(dy, x, u, w, b, mean, rstd, mask, dropout_ratio=0.1,
    ...                         apply_u_silu=True, concat_u=True, concat_x=True).compile()  # doctest: +SKIP
    >>> arena = graphrt.runtime().arena                                          # doctest: +SKIP
    >>> with arena.scope():                                                      # doctest: +SKIP
    ...     ws = arena.take(plan.workspace_bytes())
    ...     plan.execute(dy, x, u, w, b, mean, rstd, mask, dx=dx, du=du, dweight=dw, dbias=db,
    ...                  counters=arena.counters(ws, plan.counter_words()), workspace=ws)
    """

    op = "hstu_lmsd_backward"
    records_launches = True

    output_names = ("dx", "du", "dweight", "dbias")

    def _check_support(self) -> None:
        c = self.contract
        self.d = _check_common(c, ("dy", "x", "u"))
        self.segments = _segments(c)
        if c.spec("dy").shape[1] != self.segments * self.d:
            raise ContractError(f"dy: expected {self.segments} segments of {self.d} columns, got "
                                f"{c.spec('dy').shape[1]}")
        if c.spec("u").shape[1] != self.d:
            raise ContractError(f"u: expected last dim {self.d} (like x)")
        self.p = c.flag("dropout_ratio")
        self.programs = c.flag("programs")

    def _compile(self) -> None:
        if self.backend == "triton":
            from .kernels import backward_config
            self.config = backward_config(self.d)

    def workspace_bytes(self) -> int:
        return grouped_workspace_bytes(self.programs, self.d) if self.backend == "triton" else 0

    def counter_words(self) -> int:
        if self.backend != "triton" or self.d > ONE_LAUNCH_MAX_D:
            return 0
        return grouped_counter_words(self.programs)

    def execute(self, dy, x, u, weight, bias, mean, rstd, mask, *, dx=None, du=None,
                dweight=None, dbias=None, counters=None, workspace=None, stream=None) -> None:
        c, d = self.contract, self.d
        device = require_tensor("x", x).device
        _require_2d("x", x, d)
        rows = x.shape[0]
        sdy = rows_operand("dy", dy, (BF16,), self.segments * d, rows, device)
        sx = rows_operand("x", x, (BF16,), d, rows, device)
        su = rows_operand("u", u, (BF16,), d, rows, device)
        vector_operand("weight", weight, (BF16,), d, device)
        vector_operand("bias", bias, (BF16,), d, device)
        vector_operand("mean", mean, (torch.float32,), rows, device)
        vector_operand("rstd", rstd, (torch.float32,), rows, device)
        if self.p > 0:
            mask = compact_operand("mask", mask, (torch.int8,), (rows, d), device)
        elif mask is not None:
            raise ContractError("mask: dropout_ratio is 0, so there is no mask; pass None")
        sdx = rows_operand("dx", dx, (BF16,), d, rows, device)
        sdu = rows_operand("du", du, (BF16,), d, rows, device)
        if c.flag("compute_dweight"):
            vector_operand("dweight", dweight, (BF16,), d, device)
        elif dweight is not None:
            raise ContractError("dweight: compute_dweight is False; pass None")
        vector_operand("dbias", dbias, (BF16,), d, device)
        workspace = workspace_operand(workspace, self.workspace_bytes(), device)
        counters = counters_operand(counters, self.counter_words(), device)
        require_disjoint({"dx": dx, "du": du, "dweight": dweight, "dbias": dbias,
                          "workspace": workspace, "counters": counters},
                         {"dy": dy, "x": x, "u": u, "weight": weight, "bias": bias, "mean": mean,
                          "rstd": rstd, "mask": mask})
        flags = {k: c.flag(k) for k in ("apply_u_silu", "concat_u", "concat_x")}
        if self.backend == "reference":
            ref = hstu_lmsd_backward_reference(dy, x, u, weight, bias, mean, rstd, mask,
                                               dropout_ratio=self.p, dtype=torch.float32,
                                               compute_dweight=c.flag("compute_dweight"), **flags)
            write_reference((dx, du, dweight, dbias), ref)
            return
        from .kernels import launch_backward
        partial = workspace_as(workspace, self.workspace_bytes(), torch.float32)
        with on_stream(stream):
            launch_backward(self.config, self.programs, dy, x, u, weight, bias, mean, rstd,
                            mask if self.p > 0 else None, dx, du, dweight, dbias, partial,
                            counters, rows,
                            (sdy, sx, su, sdx, sdu), flags, 1.0 / (1.0 - self.p))
