"""Plan for grouped GEMM weight gradients of MoE experts."""
from __future__ import annotations

import torch

from ...block_scaling import FP8
from ...contract import TensorSpec
from ...device_checks import OFFSETS_DECREASING, OFFSETS_OUT_OF_RANGE, error_flags
from ...errors import ContractError
from ...plan import env_reader, hopper_module, Plan
from ...streams import is_capturing, on_stream
from ...validate import (compact_operand, dtype_name, require_aligned, require_disjoint,
                         require_tensor, vector_operand, workspace_as, workspace_operand)
from .reference import (SCALE_BLOCKS, expert_bounds, grouped_gemm_wgrad_reference, host_ends,
                        offset_problems)

OUTPUT_MODES = ("dense", "discrete")
INPUT_ORDERS = ("tensor2d", "tensor_ragged")
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
INPUT_DTYPES = (torch.bfloat16, FP8)


def _major(t: torch.Tensor, inner_dim: int) -> str:
    """'k' when the tokens axis has unit stride, 'mn' when the other axis has, else the strides."""
    if t.dim() != 2:
        return f"unsupported: {t.dim()}-D"
    other = 1 - inner_dim
    if t.stride(inner_dim) == 1 and (t.shape[other] <= 1 or t.stride(other) == t.shape[inner_dim]):
        return "k"
    if t.stride(other) == 1 and (t.shape[inner_dim] <= 1 or t.stride(inner_dim) == t.shape[other]):
        return "mn"
    return f"unsupported strides {tuple(t.stride())}"


def operand_spec(name: str, t, tokens_dim: int) -> TensorSpec:
    """Spec of ``a`` (tokens in dim 1) or ``b`` (dim 0): the tokens are a run-time extent and
    the layout class says which axis has unit stride."""
    require_tensor(name, t)
    shape = tuple(None if i == tokens_dim else d for i, d in enumerate(t.shape))
    return TensorSpec(name, t.dtype, shape, _major(t, tokens_dim))


def scale_spec(tokens_dim: int):
    """Spec of ``a_scale`` (blocks of tokens in dim 1) or ``b_scale`` (dim 0): absent when None;
    the block count is a run-time extent and any strides are read."""
    def spec(name: str, t) -> TensorSpec:
        if t is None:
            return TensorSpec.absent(name)
        require_tensor(name, t)
        if t.dim() != 2:
            return TensorSpec(name, t.dtype, tuple(t.shape), f"unsupported: {t.dim()}-D")
        return TensorSpec(name, t.dtype,
                          tuple(None if i == tokens_dim else d for i, d in enumerate(t.shape)),
                          "strided")
    return spec


def offsets_spec(name: str, t) -> TensorSpec:
    t = require_tensor(name, t)
    return TensorSpec(name, t.dtype, tuple(t.shape),
                      "contiguous" if t.is_contiguous() else "strided")


_validate_offsets_variable = env_reader("GRAPHRT_VALIDATE_OFFSETS")


def _validate_on_host() -> bool:
    return _validate_offsets_variable() == "1"


class GroupedGemmWgrad(Plan):
    """Wgrad[e] = A[:, begin:end] @ B[begin:end, :] for every expert in one launch.

    a: BF16 (hidden, tokens_sum), K-major or M-major; b: BF16 (tokens_sum, intermediate), K-major
    or N-major. FP8 inputs: float8_e4m3fn codes, both K-major (tokens the unit-stride axis, as
    Hopper's FP8 tensor-core instructions read them), tensor2d, with ``a_scale`` (hidden, blocks)
    and ``b_scale`` (blocks, intermediate), any strides: uint8 E8M0 scales per 32 tokens (MXFP8)
    or FP32 scales per 128 tokens (DeepSeek-V3's 1x128 blocks), blocks counted from token 0 of
    the tensors, so neighbouring experts may share one. With ``input_order="tensor_ragged"``
    each buffer holds, in memory order, one compact block per expert with the tokens as the
    unit-stride axis (A_e [hidden, n_e], B_e [intermediate, n_e]); the tensors' own strides then
    only have to be dense, either way. An expert whose block rows are not 16-byte aligned (a
    count off a multiple of 8) runs at full speed when ``execute`` gets a ``workspace`` of
    ``call_workspace_bytes(tokens_sum)`` bytes (about as large as ``a`` and ``b``), as the
    functional call gives it: such experts' blocks are copied there first (on Hopper with
    a tested Triton and up to 64 experts, with rows padded to 64 tokens, and every expert is
    then read by TMA; elsewhere as rows); without it they run 3-5x slower. Tensor2d BF16 calls of
    up to 64 experts run Hopper's tensor2d TMA kernel in every layout (K-major operands:
    tokens_sum a multiple of 8). MXFP8 calls on Hopper given a ``workspace`` of
    ``call_workspace_bytes(tokens_sum)`` (twice as large as ``a`` and ``b``), as the
    functional call gives it, write the codes' BF16 values there first and multiply those
    with that kernel, whatever tokens_sum; without it the values are made inside the product,
    about 2x slower.
    offsets: int32 [E] cumulative ends, read on the device.
    Output dense (E, hidden, intermediate) or discrete (``wgrad_ptrs``: int64 [E] addresses;
    with 16-byte aligned ones and intermediate a multiple of 8 stored 16 bytes at a time, others
    2 bytes at a time, 1.4-2.5x slower on the H200), BF16/FP16/FP32, overwritten or accumulated
    into.

    ``execute`` does not read the offsets on the host (it must not synchronize): an expert whose
    bounds are not 0 <= begin <= end <= tokens_sum is computed as empty (zeros; untouched when
    accumulating), nothing outside ``a`` and ``b`` is read, and the problem is flagged on the
    device for ``graphrt.check_errors()``. ``GRAPHRT_VALIDATE_OFFSETS=1`` makes ``execute`` read
    them on the host too and raise ``ContractError`` (not under capture).

    >>> plan = GroupedGemmWgrad(a, b, offsets).compile()                     # doctest: +SKIP
    >>> plan.execute(a, b, offsets, wgrad=out)                               # doctest: +SKIP
    """

    op = "grouped_gemm_wgrad"
    output_names = ("wgrad",)
    records_launches = True
    also_written = ("wgrad_ptrs",)   # the addresses it writes to

    @staticmethod
    def bindable() -> bool:
        """Not while GRAPHRT_VALIDATE_OFFSETS=1: each call reads the offsets on the host."""
        return not _validate_on_host()

    def _check_support(self) -> None:
        c = self.contract
        if c.flag("output_mode") not in OUTPUT_MODES:
            raise ContractError(f"output_mode: expected one of {OUTPUT_MODES}, got {c.flag('output_mode')!r}")
        if c.flag("input_order") not in INPUT_ORDERS:
            raise ContractError(f"input_order: expected one of {INPUT_ORDERS}, got {c.flag('input_order')!r}")
        if c.flag("wgrad_dtype") not in OUT_DTYPES:
            raise ContractError(f"wgrad_dtype: expected bfloat16, float16 or float32, got "
                                f"{dtype_name(c.flag('wgrad_dtype'))}")
        for name in ("a", "b"):
            spec = c.spec(name)
            if spec.dtype not in INPUT_DTYPES:
                raise ContractError(f"{name}: expected dtype bfloat16 or float8_e4m3fn, got "
                                    f"{dtype_name(spec.dtype)}")
            if spec.layout.startswith("unsupported"):
                raise ContractError(f"{name}: layout not supported: expected tokens-major or "
                                    f"{'M' if name == 'a' else 'N'}-major, got "
                                    f"{spec.layout.replace('unsupported', '').strip(': ')}")
        if c.spec("b").dtype != c.spec("a").dtype:
            raise ContractError(f"b: expected dtype {dtype_name(c.spec('a').dtype)} (like a), got "
                                f"{dtype_name(c.spec('b').dtype)}")
        self.fp8 = c.spec("a").dtype == FP8
        self._check_scales()
        off = c.spec("offsets")
        if off.dtype != torch.int32 or len(off.shape) != 1 or off.layout != "contiguous":
            raise ContractError(f"offsets: expected a contiguous int32 [E] tensor, got "
                                f"{dtype_name(off.dtype)} {off.shape}")
        self.hidden, self.inter = c.spec("a").shape[0], c.spec("b").shape[1]
        self.experts = off.shape[0]

    def _check_scales(self) -> None:
        c = self.contract
        scales = (c.spec("a_scale"), c.spec("b_scale"))
        if not self.fp8:
            for spec in scales:
                if spec.present:
                    raise ContractError(f"{spec.name}: scales belong to FP8 inputs; a and b are "
                                        f"bfloat16")
            return
        for spec in scales:
            if not spec.present:
                raise ContractError(f"{spec.name}: FP8 inputs need scales: uint8 E8M0 per 32 "
                                    f"tokens or float32 per 128")
            if spec.dtype not in SCALE_BLOCKS or spec.layout.startswith("unsupported"):
                raise ContractError(f"{spec.name}: expected a 2-D uint8 (E8M0) or float32 tensor, "
                                    f"got {dtype_name(spec.dtype)} {spec.shape}")
        if scales[1].dtype != scales[0].dtype:
            raise ContractError(f"b_scale: expected dtype {dtype_name(scales[0].dtype)} (like "
                                f"a_scale), got {dtype_name(scales[1].dtype)}")
        for name in ("a", "b"):
            if c.spec(name).layout != "k":
                raise ContractError(f"{name}: FP8 codes must be tokens-major (K-major, the tokens "
                                    f"the unit-stride axis), got {c.spec(name).layout}-major")
        if c.flag("input_order") != "tensor2d":
            raise ContractError("input_order: FP8 inputs take tensor2d only")
        self.scale_block = SCALE_BLOCKS[scales[0].dtype]

    def _compile(self) -> None:
        if self.contract.device_type == "cuda":  # made here, never inside a capture
            error_flags(torch.device("cuda", torch.cuda.current_device()))
        if self.backend == "triton":
            from ...kernel_utils import warn_untested_triton
            from .kernels import fp8_config, gemm_config
            warn_untested_triton("grouped_gemm_wgrad", self.contract.capability,
                                 "on an H100 they took up to 1.55x the Gluon kernels' time "
                                 "for BF16 inputs and up to 2.1x for MXFP8 inputs")
            self.interpreted = self.contract.device_type != "cuda"
            self.config = (fp8_config(self.interpreted, self.scale_block) if self.fp8 else
                           gemm_config(self.interpreted))
            # the 1x128 recipe on Hopper: the warp-specialized kernel, for the calls it fits
            # (checked per call: tokens_sum and the addresses)
            gluon = (hopper_module(__package__, "kernels_gluon", self.contract.capability)
                     if self.fp8 and self.scale_block == 128 else None)
            self.gluon = gluon if gluon is not None and gluon.GLUON_API_OK else None
        self.ragged_rows = (self.backend == "triton" and not self.fp8
                            and self.contract.flag("input_order") == "tensor_ragged")
        # on Hopper, ragged BF16: the TMA kernel takes the experts with counts in multiples of
        # 8 and the Triton kernel (after it) the others
        ragged_tma = (hopper_module(__package__, "kernels_ragged", self.contract.capability)
                      if self.ragged_rows else None)
        if ragged_tma is not None and not ragged_tma.fits_ragged_tma_kernel(
                self.hidden, self.inter, self.experts, self.contract.capability):
            ragged_tma = None
        self.ragged_tma = ragged_tma
        # on Hopper, tensor2d BF16 in the layouts Tensor2dTmaConfig.plan_layouts names: the
        # tensor2d TMA kernel, for the calls it fits (checked per call: strides, addresses)
        mx = self.fp8 and self.scale_block == 32
        tensor2d_tma = (hopper_module(__package__, "kernels_tensor2d", self.contract.capability)
                        if self.backend == "triton" and (mx or not self.fp8)
                        and self.contract.flag("input_order") == "tensor2d" else None)
        if tensor2d_tma is not None and not tensor2d_tma.GLUON_API_OK:
            tensor2d_tma = None
        # MXFP8 on Hopper, given the workspace: the codes' BF16 values written out first, then
        # multiplied by that kernel as K-major BF16 operands (kernels_mx_values.py)
        self.mx_values = (mx and tensor2d_tma is not None
                          and tensor2d_tma.TENSOR2D_TMA_CONFIG.runs("k", "k", self.experts))
        self.tensor2d_tma = tensor2d_tma

    def call_workspace_bytes(self, tokens_sum: int) -> int:
        """Bytes of the optional ``workspace`` for a call with ``tokens_sum`` tokens, 0 when the
        plan has no use for it (BF16 tensor2d or 1x128 inputs, the reference backend). The
        functional call allocates it per call, like an output.

        - Ragged BF16: ``execute`` first copies the experts whose blocks are not 16-byte
          aligned row by row (token counts off multiples of 8), which the GEMM then reads at
          full speed: on Hopper's TMA kernel with rows padded to 64 tokens, else as rows.
          Without it, or with a smaller one, they load two bytes at a time (3-5x slower). As
          large as ``a`` and ``b``, plus 64 tokens an expert for the padding.
        - MXFP8 on Hopper: ``execute`` first writes the codes' BF16 values there and multiplies
          those (about 2x faster than turning codes into values inside the product, which runs
          without it). Twice as large as ``a`` and ``b``.

        >>> ws = torch.empty(plan.call_workspace_bytes(a.shape[1]), dtype=torch.uint8,
        ...                  device=a.device)                                   # doctest: +SKIP
        >>> plan.execute(a, b, offsets, wgrad=out, workspace=ws)               # doctest: +SKIP
        """
        self._require_compiled()
        if self.ragged_rows:
            from .kernels import ragged_padded_bytes, ragged_rows_bytes
            rows = ragged_rows_bytes(tokens_sum, self.hidden, self.inter)
            if self.ragged_tma is not None and self.ragged_tma.RAGGED_TMA_CONFIG.padded_odd:
                # the padded copy, or the rows where the TMA kernel does not take the call
                return max(rows, ragged_padded_bytes(tokens_sum, self.experts, self.hidden,
                                                     self.inter))
            return rows
        if self.mx_values:
            from .kernels_mx_values import mx_values_bytes
            return mx_values_bytes(tokens_sum, self.hidden, self.inter)
        return 0

    def allocate_outputs(self, *args, **kwargs) -> dict[str, torch.Tensor]:
        """The outputs, and the call's ``workspace`` (see ``call_workspace_bytes``)."""
        made = super().allocate_outputs(*args, **kwargs)
        if self.ragged_rows or self.mx_values:   # the contract holds a 2-D a (hidden, tokens_sum)
            a = args[0] if args else kwargs["a"]
            made["workspace"] = torch.empty(self.call_workspace_bytes(a.shape[1]),
                                            dtype=torch.uint8, device=a.device)
        return made

    def execute(self, a, b, offsets, *, a_scale=None, b_scale=None, wgrad=None, wgrad_ptrs=None,
                workspace=None, stream=None) -> None:
        c = self.contract
        device = require_tensor("a", a).device
        b, offsets = require_tensor("b", b), require_tensor("offsets", offsets)
        for name, t in (("b", b), ("offsets", offsets)):
            if t.device != device:
                raise ContractError(f"{name}: expected device {device}, got {t.device}")
        for name, t, want in (("a", a, c.spec("a")), ("b", b, c.spec("b"))):
            if t.dtype != want.dtype or _major(t, 1 if name == "a" else 0) != want.layout:
                raise ContractError(f"{name}: expected {dtype_name(want.dtype)} with the plan's "
                                    f"layout ({want.layout}-major), got {dtype_name(t.dtype)} "
                                    f"strides {t.stride()}")
        if a.shape[0] != self.hidden or b.shape[1] != self.inter or a.shape[1] != b.shape[0]:
            raise ContractError(f"a, b: expected ({self.hidden}, T) and (T, {self.inter}), got "
                                f"{tuple(a.shape)} and {tuple(b.shape)}")
        require_aligned("a", a)
        require_aligned("b", b)
        vector_operand("offsets", offsets, (torch.int32,), self.experts, device)
        tokens_sum = a.shape[1]
        self._check_scale_operands(a_scale, b_scale, tokens_sum, device)
        out_dtype = c.flag("wgrad_dtype")
        discrete = c.flag("output_mode") == "discrete"
        if discrete:
            wgrad_ptrs = vector_operand("wgrad_ptrs", wgrad_ptrs, (torch.int64,), self.experts,
                                        device)
        if wgrad is not None or not discrete:
            wgrad = compact_operand("wgrad", wgrad, (out_dtype,),
                                    (self.experts, self.hidden, self.inter), device)
        if _validate_on_host() and not is_capturing(device):
            check_offsets_on_host(offsets, tokens_sum)
            if discrete:
                for e, ptr in enumerate(wgrad_ptrs.cpu().tolist()):
                    if ptr == 0 or ptr % 16:
                        raise ContractError(f"wgrad_ptrs: expert {e}'s address {ptr:#x} is null "
                                            f"or not 16-byte aligned")
        scratch = self._workspace_operand(workspace, tokens_sum, device)
        require_disjoint({"wgrad": wgrad, "wgrad_ptrs": wgrad_ptrs, "workspace": scratch},
                         {"a": a, "b": b, "offsets": offsets, "a_scale": a_scale,
                          "b_scale": b_scale})
        accumulate = c.flag("accumulate")
        errors = error_flags(device)
        if self.backend == "reference":
            self._execute_reference(a, b, offsets, wgrad, wgrad_ptrs, accumulate, out_dtype,
                                    errors, a_scale, b_scale)
            return
        from .kernels import launch_wgrad, launch_wgrad_fp8
        with on_stream(stream):
            if self.mx_values and scratch is not None and self._run_mx_values(
                    a, b, a_scale, b_scale, offsets, wgrad, wgrad_ptrs if discrete else None,
                    out_dtype, errors, accumulate, scratch):
                return
            if self.gluon is not None and self.gluon.fits_gluon_kernel(a, b,
                                                                       self.contract.capability):
                self.gluon.launch_wgrad_fp8_gluon(
                    a, b, a_scale, b_scale, offsets, wgrad, wgrad_ptrs if discrete else None,
                    out_dtype, errors, hidden=self.hidden, inter=self.inter,
                    accumulate=accumulate)
                return
            if self.tensor2d_tma is not None:
                t2d = self.tensor2d_tma
                if t2d.TENSOR2D_TMA_CONFIG.runs(c.spec("a").layout, c.spec("b").layout,
                                                self.experts) and \
                        t2d.fits_tensor2d_kernel(a, b, c.capability):
                    t2d.launch_wgrad_tensor2d_tma(
                        a, b, offsets, wgrad, wgrad_ptrs if discrete else None, out_dtype,
                        errors, hidden=self.hidden, inter=self.inter, accumulate=accumulate,
                        config=t2d.TENSOR2D_TMA_CONFIG)
                    return
            tma = (self.ragged_tma if self.ragged_tma is not None
                   and self.ragged_tma.fits_tokens(tokens_sum) else None)
            padded = None
            if tma is not None:   # the experts kernels._tma_takes gives it
                if scratch is not None and tma.RAGGED_TMA_CONFIG.padded_odd:
                    # and the others, from their copy with rows padded to 64 tokens (with the
                    # offsets out of order, the copy's kernel computes them itself)
                    from .kernels import launch_ragged_padded, PADDED_CONFIG, ragged_padded_views
                    padded = ragged_padded_views(scratch, tokens_sum, self.experts, self.hidden,
                                                 self.inter)
                    launch_ragged_padded(PADDED_CONFIG, a, b, *padded, offsets, wgrad,
                                         wgrad_ptrs if discrete else None, out_dtype, errors,
                                         hidden=self.hidden, inter=self.inter,
                                         accumulate=accumulate)
                tma.launch_wgrad_ragged_tma(
                    a, b, offsets, wgrad, wgrad_ptrs if discrete else None, out_dtype, errors,
                    hidden=self.hidden, inter=self.inter, accumulate=accumulate,
                    config=tma.RAGGED_TMA_CONFIG, padded=padded)
                if padded is not None:
                    return
            if self.fp8:
                launch_wgrad_fp8(self.config, a, b, a_scale, b_scale, offsets, wgrad,
                                 wgrad_ptrs if discrete else None, out_dtype, errors,
                                 hidden=self.hidden, inter=self.inter, accumulate=accumulate,
                                 dot_fp32=self.interpreted)
                return
            launch_wgrad(self.config, a, b, offsets, wgrad, wgrad_ptrs if discrete else None,
                         out_dtype, errors, hidden=self.hidden, inter=self.inter,
                         a_k_major=c.spec("a").layout == "k", b_k_major=c.spec("b").layout == "k",
                         ragged=c.flag("input_order") == "tensor_ragged", accumulate=accumulate,
                         dot_fp32=self.interpreted, rows=scratch,
                         skip_tma_taken=tma is not None)

    def _run_mx_values(self, a, b, a_scale, b_scale, offsets, wgrad, wgrad_ptrs, out_dtype,
                       errors, accumulate, scratch) -> bool:
        """MXFP8 through the codes' BF16 values in ``scratch`` and the tensor2d TMA kernel;
        False (nothing launched) where that kernel does not take the values' views."""
        from .kernels_mx_values import launch_mx_values, mx_values_views
        a_values, b_values = mx_values_views(scratch, a.shape[1], self.hidden, self.inter)
        t2d = self.tensor2d_tma
        if not t2d.fits_tensor2d_kernel(a_values, b_values, self.contract.capability):
            return False
        launch_mx_values(a, b, a_scale, b_scale, a_values, b_values)
        t2d.launch_wgrad_tensor2d_tma(a_values, b_values, offsets, wgrad, wgrad_ptrs, out_dtype,
                                      errors, hidden=self.hidden, inter=self.inter,
                                      accumulate=accumulate, config=t2d.TENSOR2D_TMA_CONFIG)
        return True

    def _workspace_operand(self, workspace, tokens_sum: int, device) -> torch.Tensor | None:
        """The call's scratch (see ``call_workspace_bytes``) as uint8; None without one large
        enough (``workspace_bytes()`` is 0: a smaller one, as generic callers pass, means the
        path without it) or when the plan has no use for it."""
        if workspace is None or not (self.ragged_rows or self.mx_values):
            return None
        workspace = require_tensor("workspace", workspace)
        nbytes = self.call_workspace_bytes(tokens_sum)
        if nbytes == 0 or workspace.numel() * workspace.element_size() < nbytes:
            return None
        if workspace.dtype != torch.uint8:
            raise ContractError(f"workspace: expected a uint8 buffer, got "
                                f"{dtype_name(workspace.dtype)}")
        return workspace_as(workspace_operand(workspace, nbytes, device), nbytes, torch.uint8)

    def _check_scale_operands(self, a_scale, b_scale, tokens_sum: int, device) -> None:
        """FP8 plans: one scale per block of tokens (a_scale (hidden, blocks), b_scale (blocks,
        intermediate)) of the plan's dtype on a's device; BF16 plans take none."""
        if not self.fp8:
            for name, t in (("a_scale", a_scale), ("b_scale", b_scale)):
                if t is not None:
                    raise ContractError(f"{name}: scales belong to FP8 inputs; this plan is for "
                                        f"bfloat16")
            return
        blocks = -(-tokens_sum // self.scale_block)
        for name, t, shape in (("a_scale", a_scale, (self.hidden, blocks)),
                               ("b_scale", b_scale, (blocks, self.inter))):
            t = require_tensor(name, t)
            want = self.contract.spec(name).dtype
            if t.device != device:
                raise ContractError(f"{name}: expected device {device}, got {t.device}")
            if t.dtype != want or tuple(t.shape) != shape:
                raise ContractError(f"{name}: expected {dtype_name(want)} {shape} (one scale per "
                                    f"{self.scale_block} tokens), got {dtype_name(t.dtype)} "
                                    f"{tuple(t.shape)}")

    def _execute_reference(self, a, b, offsets, wgrad, wgrad_ptrs, accumulate, out_dtype, errors,
                           a_scale, b_scale):
        if wgrad is None:
            raise ContractError("wgrad_ptrs: the reference backend writes through a stacked "
                                "wgrad tensor; pass wgrad too")
        ref = grouped_gemm_wgrad_reference(a, b, offsets,
                                           input_order=self.contract.flag("input_order"),
                                           out_dtype=out_dtype,
                                           accumulate_into=wgrad if accumulate else None,
                                           a_scale=a_scale, b_scale=b_scale)
        if accumulate:  # an empty expert stays untouched
            for e, (begin, end) in enumerate(expert_bounds(offsets, a.shape[1])):
                if end > begin:
                    wgrad[e].copy_(ref[e])
        else:
            wgrad.copy_(ref)
        problems = offset_problems(host_ends(offsets), a.shape[1])
        if problems:  # flagged as the kernel would
            mask = 0
            for _, bit in problems:
                mask |= bit
            errors[0:1].bitwise_or_(mask)
            errors[1:2].clamp_max_(min(e for e, _ in problems))


def check_offsets_on_host(offsets: torch.Tensor, tokens_sum: int) -> None:
    """Raise ContractError naming the first expert whose cumulative end is out of order, out of
    [0, tokens_sum], or (the last) not tokens_sum. Reads the offsets on the host (a sync)."""
    ends = host_ends(offsets)
    problems = offset_problems(ends, tokens_sum)
    if not problems:
        return
    expert, bit = problems[0]
    begin, end = (ends[expert - 1] if expert else 0), ends[expert]
    if bit == OFFSETS_DECREASING:
        what = (f"expert {expert}'s end {end} is below its begin {begin} (cumulative ends must "
                f"be non-decreasing)")
    elif bit == OFFSETS_OUT_OF_RANGE:
        what = f"expert {expert}'s tokens [{begin}, {end}) are outside [0, tokens_sum={tokens_sum}]"
    else:
        what = f"the last end must equal tokens_sum={tokens_sum}, got {end} at expert {expert}"
    raise ContractError(f"offsets: {what}; pass check_offsets=False to skip this host read")
