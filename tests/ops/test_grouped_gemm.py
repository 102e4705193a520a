"""Grouped GEMM weight gradients: reference, layouts, output modes, errors, kernels."""
import itertools

import pytest
import torch
import triton
import triton.language as tl

import graphrt
from graphrt import ContractError
from graphrt.device_checks import read_errors
from graphrt.ops import GroupedGemmWgrad, grouped_gemm_wgrad
from graphrt.ops.grouped_gemm import grouped_gemm_wgrad_reference
from graphrt.ops.grouped_gemm.kernels import _expert_at_rank, _ranks_by_count, _snake

from ..helpers import assert_rejected, assert_unchanged, env, needs_interpreter, rel_l2, snapshot

BF16 = torch.bfloat16


def _problem(counts, hidden, inter, a_major="k", b_major="n", device="cpu"):
    tokens = sum(counts)
    offsets = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32, device=device)
    a = torch.randn(hidden, tokens, dtype=BF16, device=device)
    b = torch.randn(tokens, inter, dtype=BF16, device=device)
    if a_major == "m":
        a = a.t().contiguous().t()
    if b_major == "k":
        b = b.t().contiguous().t()
    return a, b, offsets


def _expected(a, b, offsets, order, dtype, init=None, counts=None):
    ref = grouped_gemm_wgrad_reference(a, b, offsets, input_order=order, out_dtype=dtype,
                                       accumulate_into=init)
    if init is not None:
        for e, c in enumerate(counts):
            if c == 0:
                ref[e] = init[e]
    return ref


def _close(out, ref, dtype):
    if dtype == torch.float32:
        assert rel_l2(out, ref) < 1e-5
    else:
        assert torch.allclose(out.float(), ref.float(), rtol=3e-2, atol=8e-2)


def test_reference_per_expert_and_ragged_layout():
    counts = [3, 0, 5]
    a, b, offsets = _problem(counts, 4, 6)
    ref = grouped_gemm_wgrad_reference(a, b, offsets, out_dtype=torch.float32)
    assert torch.equal(ref[1], torch.zeros(4, 6))
    assert torch.allclose(ref[2], a[:, 3:].float() @ b[3:].float())
    # tensor_ragged: the same numbers stored as per-expert compact blocks
    blocks_a = torch.cat([a[:, s:e].contiguous().reshape(-1) for s, e in ((0, 3), (3, 3), (3, 8))])
    blocks_b = torch.cat([b[s:e].t().contiguous().reshape(-1) for s, e in ((0, 3), (3, 3), (3, 8))])
    ragged = grouped_gemm_wgrad_reference(blocks_a.view(4, 8), blocks_b.view(8, 6), offsets,
                                          input_order="tensor_ragged", out_dtype=torch.float32)
    assert torch.allclose(ragged, ref)


@needs_interpreter
@pytest.mark.parametrize("a_major,b_major,order", [("k", "n", "tensor2d"), ("m", "n", "tensor2d"),
                                                   ("k", "k", "tensor2d"), ("m", "k", "tensor2d"),
                                                   ("k", "n", "tensor_ragged"), ("k", "k", "tensor_ragged"),
                                                   ("m", "n", "tensor_ragged"), ("m", "k", "tensor_ragged")])
@pytest.mark.parametrize("mode", ["dense", "discrete"])
@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
@pytest.mark.parametrize("accumulate", [False, True])
def test_triton_kernel_interpreted(a_major, b_major, order, mode, dtype, accumulate):
    torch.manual_seed(0)
    counts = [0, 17, 5, 0, 33, 1]          # empty first and middle experts, odd counts
    a, b, offsets = _problem(counts, 40, 24, a_major, b_major)
    init = torch.randn(len(counts), 40, 24).to(dtype)
    w = init.clone()
    kwargs = dict(output_mode=mode, wgrad_dtype=dtype, accumulate_on_output=accumulate,
                  input_order=order, wgrad=w)
    if mode == "discrete":
        kwargs["wgrad_ptrs"] = torch.tensor([w[e].data_ptr() for e in range(len(counts))])
    with env(GRAPHRT_BACKEND="triton"):
        grouped_gemm_wgrad(a, b, offsets, runtime=graphrt.Runtime("cpu"), **kwargs)
    _close(w, _expected(a, b, offsets, order, dtype, init if accumulate else None, counts), dtype)


def _ragged_problem(counts, hidden, inter, device):
    """A and B as tensor_ragged buffers (per-expert blocks, tokens unit-stride) and the same
    numbers as tensor2d operands, for the reference."""
    blocks_a = [torch.randn(hidden, n, dtype=BF16, device=device) for n in counts]
    blocks_b = [torch.randn(inter, n, dtype=BF16, device=device) for n in counts]
    t = sum(counts)
    ragged_a = torch.cat([blk.reshape(-1) for blk in blocks_a]).view(hidden, t)
    ragged_b = torch.cat([blk.reshape(-1) for blk in blocks_b]).view(t, inter)
    offsets = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32, device=device)
    return ragged_a, ragged_b, torch.cat(blocks_a, 1), torch.cat(blocks_b, 1).t(), offsets


def _check_ragged_aligned_and_odd(counts, hidden, inter, device, cfg=None):
    """tensor_ragged buffers through the functional call, or with ``cfg`` the BF16 kernel
    called directly; FP32 output poisoned, against the tensor2d reference."""
    from graphrt.device_checks import error_flags
    from graphrt.ops.grouped_gemm.kernels import launch_wgrad
    a, b, a2d, b2d, offsets = _ragged_problem(counts, hidden, inter, device)
    w = torch.full((len(counts), hidden, inter), float("nan"), device=device)
    if cfg is None:
        grouped_gemm_wgrad(a, b, offsets, wgrad=w, wgrad_dtype=torch.float32,
                           input_order="tensor_ragged")
    else:
        launch_wgrad(cfg, a, b, offsets, w, None, torch.float32, error_flags(a.device),
                     hidden=hidden, inter=inter, a_k_major=True, b_k_major=True, ragged=True,
                     accumulate=False, dot_fp32=device == "cpu")
    _close(w, _expected(a2d, b2d, offsets, "tensor2d", torch.float32), torch.float32)


@needs_interpreter
@pytest.mark.parametrize("hidden", [40, 36])   # 36: the 24-token expert (at token 29) starts off 16 bytes
def test_ragged_aligned_and_odd_experts_interpreted(hidden):
    """Ragged experts whose rows start 16-byte aligned (counts multiples of 8) load 8 tokens at
    a time; the others element by element; both against the tensor2d reference."""
    torch.manual_seed(1)
    with env(GRAPHRT_BACKEND="triton"):
        _check_ragged_aligned_and_odd([16, 0, 8, 5, 24, 3], hidden, 24, "cpu")


@needs_interpreter
@pytest.mark.parametrize("with_rows", [True, False])
def test_triton_kernel_leaves_the_tma_experts_interpreted(with_rows):
    """The Triton kernel's share when Hopper's ragged TMA kernel runs first
    (``skip_tma_taken``): the experts the TMA kernel takes left untouched (poisoned: those with
    counts in multiples of 8), the others exact; with and without the rows workspace; its
    persistent grid has 2 programs here, so each walks several rounds."""
    from graphrt.device_checks import error_flags
    from graphrt.ops.grouped_gemm.kernels import gemm_config, launch_wgrad, ragged_rows_bytes
    torch.manual_seed(7)
    counts, hidden, inter = [16, 0, 5, 24, 17, 1, 8, 6, 2, 0], 40, 24
    a, b, a2d, b2d, offsets = _ragged_problem(counts, hidden, inter, "cpu")
    rows = (torch.full((ragged_rows_bytes(sum(counts), hidden, inter),), 255, dtype=torch.uint8)
            if with_rows else None)
    w = torch.full((len(counts), hidden, inter), float("nan"))
    launch_wgrad(gemm_config(True), a, b, offsets, w, None, torch.float32, error_flags(a.device),
                 hidden=hidden, inter=inter, a_k_major=True, b_k_major=True, ragged=True,
                 accumulate=False, dot_fp32=True, rows=rows, skip_tma_taken=True)
    ref = _expected(a2d, b2d, offsets, "tensor2d", torch.float32)
    for e, n in enumerate(counts):
        if n % 8 == 0:
            assert w[e].isnan().all(), e
        else:
            assert rel_l2(w[e], ref[e]) < 1e-5, e


def test_launch_flags_of_the_tma_kernels_share_checked():
    """Only ragged calls share their experts with Hopper's ragged TMA kernel: a tensor2d
    launch told to skip its experts raises before anything runs."""
    from graphrt.device_checks import error_flags
    from graphrt.ops.grouped_gemm.kernels import gemm_config, launch_wgrad
    a, b, offsets = _problem([8, 8], 16, 16, "k", "k")
    w = torch.full((2, 16, 16), float("nan"))
    with pytest.raises(ValueError, match="skip_tma_taken"):
        launch_wgrad(gemm_config(True), a, b, offsets, w, None, torch.float32,
                     error_flags(a.device), hidden=16, inter=16, a_k_major=True,
                     b_k_major=True, ragged=False, accumulate=False, dot_fp32=True,
                     skip_tma_taken=True)
    assert w.isnan().all()


def _check_ragged_rows(counts, hidden, inter, device, with_rows, decreasing_at=None):
    """tensor_ragged through ``plan.execute``: with the rows' workspace (poisoned: 0xFF bytes
    are BF16 NaNs) or without; with ``decreasing_at`` that expert's end moved below its begin
    (flagged, computed as empty, and the rows not used: the other experts' blocks then
    overlap). FP32 output poisoned, against the reference on the same ragged buffers."""
    a, b, _, _, offsets = _ragged_problem(counts, hidden, inter, device)
    if decreasing_at is not None:
        offsets[decreasing_at] = offsets[decreasing_at - 1] - 3
    plan = GroupedGemmWgrad(a, b, offsets, input_order="tensor_ragged",
                            wgrad_dtype=torch.float32).compile()
    w = torch.full((len(counts), hidden, inter), float("nan"), device=device)
    ws = None
    if with_rows:
        nbytes = plan.call_workspace_bytes(a.shape[1])
        assert nbytes >= a.shape[1] * (hidden + inter) * 2
        ws = torch.full((nbytes,), 255, dtype=torch.uint8, device=device)
    plan.execute(a, b, offsets, wgrad=w, workspace=ws)
    if decreasing_at is not None:
        with pytest.raises(graphrt.DeviceCheckError):
            graphrt.check_errors(device)
    ref = grouped_gemm_wgrad_reference(a, b, offsets, input_order="tensor_ragged",
                                       out_dtype=torch.float32)
    assert rel_l2(w, ref) < 1e-5


@needs_interpreter
@pytest.mark.parametrize("with_rows", [True, False])
@pytest.mark.parametrize("decreasing_at", [None, 3])
def test_ragged_rows_workspace_interpreted(with_rows, decreasing_at):
    """Ragged experts whose rows are not 16-byte aligned copied as rows into the workspace
    first, or loaded two bytes at a time without it; aligned, odd, empty and single-token
    experts; out-of-order offsets."""
    torch.manual_seed(4)
    with env(GRAPHRT_BACKEND="triton"):
        _check_ragged_rows([16, 0, 5, 33, 17, 1, 8], 36, 24, "cpu", with_rows, decreasing_at)


def _check_rows_copy(counts, hidden, inter, device, cfg, decreasing_at=None):
    """_ragged_rows_kernel alone into a poisoned workspace: with every expert copied, each
    expert's rows equal its blocks transposed, bit for bit; with aligned experts skipped, their
    rows stay poisoned; with out-of-order offsets nothing is written."""
    from graphrt.ops.grouped_gemm.kernels import launch_ragged_rows
    a, b, a2d, b2d, offsets = _ragged_problem(counts, hidden, inter, device)
    if decreasing_at is not None:
        offsets[decreasing_at] = offsets[decreasing_at - 1] - 1
    t = sum(counts)
    begins = [0] + list(itertools.accumulate(counts))[:-1]
    for skip_aligned in (False, True):
        a_rows = torch.full((t, hidden), float("nan"), dtype=BF16, device=device)
        b_rows = torch.full((t, inter), float("nan"), dtype=BF16, device=device)
        launch_ragged_rows(cfg, a, b, a_rows, b_rows, offsets, hidden=hidden, inter=inter,
                           skip_aligned=skip_aligned)
        for s0, n in zip(begins, counts):
            aligned = n % 8 == 0 and s0 * hidden % 8 == 0 and s0 * inter % 8 == 0
            if decreasing_at is not None or (skip_aligned and aligned):
                assert a_rows[s0:s0 + n].isnan().all() and b_rows[s0:s0 + n].isnan().all()
            else:
                assert torch.equal(a_rows[s0:s0 + n], a2d[:, s0:s0 + n].t())
                assert torch.equal(b_rows[s0:s0 + n], b2d[s0:s0 + n])


def _check_padded_copy(counts, hidden, inter, device, cfg, decreasing_at=None,
                       accumulate=False, discrete=False):
    """_ragged_padded_kernel alone into a poisoned workspace: each expert off multiples of 8
    tokens has its blocks at its slot (begin rounded down to 64, plus 64 e tokens) with rows
    padded to 64 tokens, bit for bit, zeros past its count, the blocks disjoint; the others'
    slots stay poisoned, and with out-of-order offsets everything does. The FP32 output
    (poisoned, or random values to accumulate into; dense, or its experts' addresses passed
    as a discrete output's) is left alone with the offsets in order; out of order, the valid
    experts off multiples of 8 are computed there (accumulated) and the others left alone."""
    from graphrt.device_checks import error_flags
    from graphrt.ops.grouped_gemm.kernels import (launch_ragged_padded, ragged_padded_bytes,
                                                  ragged_padded_views)
    a, b, a2d, b2d, offsets = _ragged_problem(counts, hidden, inter, device)
    if decreasing_at is not None:
        offsets[decreasing_at] = offsets[decreasing_at - 1] - 1
    t, experts = sum(counts), len(counts)
    scratch = torch.full((ragged_padded_bytes(t, experts, hidden, inter),), 255,
                         dtype=torch.uint8, device=device)
    a_pad, b_pad = ragged_padded_views(scratch, t, experts, hidden, inter)
    w = (torch.randn(experts, hidden, inter, device=device) if accumulate else
         torch.full((experts, hidden, inter), float("nan"), device=device))
    before = w.clone()
    ptrs = (torch.tensor([w[e].data_ptr() for e in range(experts)], dtype=torch.int64,
                         device=device) if discrete else None)
    launch_ragged_padded(cfg, a, b, a_pad, b_pad, offsets, w, ptrs, torch.float32,
                         error_flags(a.device), hidden=hidden, inter=inter,
                         accumulate=accumulate)
    ref = grouped_gemm_wgrad_reference(a, b, offsets, input_order="tensor_ragged",
                                       out_dtype=torch.float32)
    ends = offsets.tolist()
    for e, end in enumerate(ends):
        begin = ends[e - 1] if e else 0
        if decreasing_at is None or not 0 <= begin <= end or (end - begin) % 8 == 0:
            assert torch.equal(w[e].view(torch.int32), before[e].view(torch.int32)), e
        else:
            assert rel_l2(w[e], ref[e].to(w.device) + (before[e] if accumulate else 0)) < 1e-5, e
    begins = [0] + list(itertools.accumulate(counts))[:-1]
    written = torch.zeros_like(a_pad, dtype=torch.bool), torch.zeros_like(b_pad, dtype=torch.bool)
    for e, (s0, n) in enumerate(zip(begins, counts)):
        if decreasing_at is not None or n % 8 == 0:
            continue
        padded, slot = -(-n // 64) * 64, (s0 // 64 + e) * 64
        for pad, full, width, mask in ((a_pad, a2d, hidden, written[0]),
                                       (b_pad, b2d.t(), inter, written[1])):
            block = pad[width * slot:width * (slot + padded)].view(width, padded)
            assert torch.equal(block[:, :n], full[:, s0:s0 + n]), e
            assert (block[:, n:] == 0).all(), e
            assert not mask[width * slot:width * (slot + padded)].any(), e
            mask[width * slot:width * (slot + padded)] = True
    for pad, mask in zip((a_pad, b_pad), written):   # nothing else written: all bits still set
        assert (pad[~mask].view(torch.int16) == -1).all()


@needs_interpreter
@pytest.mark.parametrize("aligned_loads", [False, True])
@pytest.mark.parametrize("decreasing_at", [None, 3])
def test_ragged_padded_copy_interpreted(decreasing_at, aligned_loads):
    """The padded copy's persistent loop: 8 x 16 tiles over 2 programs, so that each walks many
    (expert, row tile, token tile) items; odd, aligned, empty and single-token experts, partial
    tiles at both widths, the last expert odd (the aligned loads' last word ends the buffer);
    out-of-order offsets copy nothing, and the valid odd experts are computed instead (72
    rows: three 32-row output tiles an expert, over the 2 programs): into a discrete output
    with the two-byte copy, accumulated into a dense one with the 8-byte word copy."""
    from graphrt.ops.grouped_gemm.kernels import PaddedConfig
    torch.manual_seed(8)
    _check_padded_copy([16, 0, 5, 33, 17, 1, 8, 3, 63, 65, 127, 1], 72, 24, "cpu",
                       PaddedConfig(8, 16, 4, 1, aligned_loads=aligned_loads, stages=2),
                       decreasing_at, accumulate=aligned_loads, discrete=not aligned_loads)


@needs_interpreter
@pytest.mark.parametrize("decreasing_at", [None, 3])
def test_ragged_rows_copy_interpreted(decreasing_at):
    """The copy kernel's persistent loop: 16 x 16 tiles over 2 programs, so that each walks many
    (expert, column tile, token tile) items, partial tiles at both widths and counts."""
    from graphrt.ops.grouped_gemm.kernels import RowsConfig
    torch.manual_seed(6)
    _check_rows_copy([16, 0, 5, 33, 17, 1, 8], 36, 24, "cpu", RowsConfig(16, 16, 4, 1),
                     decreasing_at)


@pytest.mark.gpu
@pytest.mark.parametrize("decreasing_at", [None, 4])
def test_gpu_ragged_rows_copy(seed, decreasing_at):
    from graphrt.ops.grouped_gemm.kernels import ROWS_CONFIG
    _check_rows_copy([0, 301, 17, 0, 1023, 259, 1, 256], 1156, 768, "cuda", ROWS_CONFIG,
                     decreasing_at)


@needs_interpreter
def test_functional_ragged_call_gives_execute_the_rows_workspace(monkeypatch):
    """The functional ragged call allocates the rows' workspace like an output, passes it to
    execute and returns only the outputs; tensor2d calls allocate none."""
    a, b, _, _, offsets = _ragged_problem([5, 3, 8], 16, 8, "cpu")
    seen = []
    execute = GroupedGemmWgrad.execute

    def spy(self, *args, **kwargs):
        seen.append(kwargs.get("workspace"))
        return execute(self, *args, **kwargs)
    monkeypatch.setattr(GroupedGemmWgrad, "execute", spy)
    rt = graphrt.Runtime("cpu")
    with env(GRAPHRT_BACKEND="triton"):
        result = grouped_gemm_wgrad(a, b, offsets, input_order="tensor_ragged", runtime=rt)
        assert len(result) == 1 and result[0].shape == (3, 16, 8)
        assert seen[-1] is not None and seen[-1].dtype == torch.uint8
        plan = rt.plan(GroupedGemmWgrad, a, b, offsets, input_order="tensor_ragged")
        assert seen[-1].numel() == plan.call_workspace_bytes(16) >= 16 * (16 + 8) * 2
        grouped_gemm_wgrad(a, b, offsets, runtime=rt)
        assert seen[-1] is None


@needs_interpreter
def test_ragged_rows_workspace_rejected_before_anything_runs():
    """A workspace large enough but of another dtype, not contiguous or overlapping an
    operand: ContractError, outputs untouched. A smaller one (``workspace_bytes()`` is 0, as
    generic callers pass) runs the two-byte path; plans without a use for it report 0 bytes."""
    torch.manual_seed(5)
    a, b, _, _, offsets = _ragged_problem([5, 3], 8, 8, "cpu")
    with env(GRAPHRT_BACKEND="triton"):
        plan = GroupedGemmWgrad(a, b, offsets, input_order="tensor_ragged",
                                wgrad_dtype=torch.float32).compile()
    nbytes = plan.call_workspace_bytes(8)
    w = torch.full((2, 8, 8), 7.0)
    before = snapshot(w)
    big = torch.empty(4 * nbytes, dtype=torch.uint8)
    for ws, pattern in ((torch.empty(nbytes, dtype=BF16), "uint8"),
                        (big[::2], "contiguous"),
                        (w.view(torch.uint8).reshape(-1), "overlaps")):
        with pytest.raises(ContractError, match=f"workspace: .*{pattern}"):
            plan.execute(a, b, offsets, wgrad=w, workspace=ws)
        assert_unchanged(before, (w,))
    ref = grouped_gemm_wgrad_reference(a, b, offsets, input_order="tensor_ragged",
                                       out_dtype=torch.float32)
    for ws in (torch.empty(0, dtype=torch.uint8), torch.empty(nbytes - 1, dtype=torch.uint8)):
        w.fill_(float("nan"))
        plan.execute(a, b, offsets, wgrad=w, workspace=ws)
        assert rel_l2(w, ref) < 1e-5
    a2, b2, off2 = _problem([5, 3], 8, 8)
    assert GroupedGemmWgrad(a2, b2, off2).compile().call_workspace_bytes(8) == 0
    assert GroupedGemmWgrad(a, b, offsets, input_order="tensor_ragged",
                            backend="reference").compile().call_workspace_bytes(8) == 0


@needs_interpreter
def test_ragged_prefetched_loop_interpreted():
    """``ragged_prefetch`` (the next step's two-byte loads issued before this step's product):
    counts below, at, between and above whole steps (16 tokens here), most not multiples of 8
    (the one that is takes the aligned loop), and an empty expert."""
    import dataclasses

    from graphrt.ops.grouped_gemm.kernels import gemm_config
    torch.manual_seed(2)
    cfg = dataclasses.replace(gemm_config(True), ragged_prefetch=True)
    _check_ragged_aligned_and_odd([16, 0, 5, 33, 17, 3], 36, 24, "cpu", cfg)


@needs_interpreter
def test_one_plan_across_token_counts_and_last_expert_empty():
    with env(GRAPHRT_BACKEND="triton"):
        rt = graphrt.Runtime("cpu")
        for counts in ([5, 7, 0], [20, 1, 0], [0, 0, 9]):
            a, b, offsets = _problem(counts, 16, 16)
            (w,) = grouped_gemm_wgrad(a, b, offsets, runtime=rt)
            _close(w, _expected(a, b, offsets, "tensor2d", BF16), BF16)
        assert rt.plans.stats()["compiles"] == 1


def test_discrete_without_outputs_allocates_stacked_buffer_and_pointers():
    a, b, offsets = _problem([2, 3], 8, 8)
    (w,) = grouped_gemm_wgrad(a, b, offsets, output_mode="discrete", wgrad_dtype=torch.float32)
    _close(w, _expected(a, b, offsets, "tensor2d", torch.float32), torch.float32)


def _errors(device, check_offsets=True):
    a, b, offsets = _problem([4, 4], 8, 8, device=device)
    w = torch.full((2, 8, 8), float("nan"), dtype=BF16, device=device)
    cases = [
        (dict(a=a.float()), "a: expected dtype bfloat16"),
        (dict(b=torch.randn(16, 8, dtype=BF16, device=device)[::2]), "b: layout not supported"),
        (dict(offsets=offsets.long()), "offsets: expected a contiguous int32"),
        (dict(wgrad=torch.empty(2, 8, 9, dtype=BF16, device=device)), "wgrad: expected shape \\(2, 8, 8\\)"),
        (dict(wgrad=torch.empty(2, 8, 8, dtype=torch.int16, device=device)), "wgrad_dtype"),
        (dict(wgrad_dtype=torch.int8, wgrad=None), "wgrad_dtype"),
        (dict(output_mode="sparse"), "output_mode"),
        (dict(input_order="csr"), "input_order"),
        (dict(b=torch.randn(9, 8, dtype=BF16, device=device)), "a, b: expected"),
        (dict(offsets=offsets.to("meta")), "offsets: expected device"),
        (dict(accumulate_on_output=True, wgrad=None), "accumulate_on_output"),
    ]
    assert_rejected(grouped_gemm_wgrad, ("a", "b", "offsets"),
                    dict(a=a, b=b, offsets=offsets, wgrad=w, check_offsets=check_offsets),
                    cases, (w,))


@pytest.mark.parametrize("check_offsets", [True, False])
def test_error_paths_write_nothing_cpu(check_offsets):
    _errors("cpu", check_offsets)


def test_unchecked_offsets_take_one_plan_lookup_a_call():
    """check_offsets=False skips the host read and with it the early plan lookup that puts
    contract errors before it: the call's own lookup is the only one."""
    rt = graphrt.Runtime("cpu")
    a, b, offsets = _problem([4, 4], 8, 8)
    for check, lookups in ((True, 2), (False, 1)):
        before = rt.plans.stats()
        grouped_gemm_wgrad(a, b, offsets, check_offsets=check, runtime=rt)
        after = rt.plans.stats()
        assert after["hits"] + after["misses"] - before["hits"] - before["misses"] == lookups


def test_bad_offsets_rejected_under_the_validate_flag():
    a, b, _ = _problem([4, 4], 8, 8)
    w = torch.full((2, 8, 8), float("nan"), dtype=BF16)
    before = snapshot(w)
    with env(GRAPHRT_VALIDATE_OFFSETS="1"):
        for bad, pattern in (([5, 3], "non-decreasing"), ([4, 7], "must equal tokens_sum=8")):
            with pytest.raises(ContractError, match=pattern):
                grouped_gemm_wgrad(a, b, torch.tensor(bad, dtype=torch.int32), wgrad=w)
    assert_unchanged(before, (w,))


# -- offsets are never trusted -------------------------------------------------------------------
# (offsets, first bad expert, experts computed as empty): tokens_sum is 12 throughout
BAD_OFFSETS = [
    ([4, 9, 40], 2, [2]),              # past tokens_sum
    ([4, -3, 12], 1, [1, 2]),          # negative (expert 2 then begins below 0)
    ([7, 3, 12], 1, [1]),              # decreasing
    ([4, 9, 10], 2, []),               # last end below tokens_sum: flagged, nothing emptied
    ([4, 9, 2**31 - 1], 2, [2]),       # the largest int32
]


def _bad_case(device, bad):
    torch.manual_seed(7)
    a, b, _ = _problem([4, 5, 3], 24, 40, device=device)
    return a, b, torch.tensor(bad, dtype=torch.int32, device=device)


def _expected_with_empty(a, b, offsets, empty, init=None):
    ends = offsets.tolist()
    out = []
    for e in range(len(ends)):
        begin = ends[e - 1] if e else 0
        if e in empty:
            out.append(torch.zeros(a.shape[0], b.shape[1]) if init is None else init[e].float())
        else:
            acc = a[:, begin:ends[e]].double() @ b[begin:ends[e]].double()
            out.append((acc if init is None else acc + init[e].double()).float())
    return torch.stack(out)


def _check_bad_offsets(device, backend):
    rt = graphrt.Runtime(device)
    for bad, first, empty in BAD_OFFSETS:
        a, b, offsets = _bad_case(device, bad)
        w = torch.full((3, 24, 40), float("nan"), device=device)
        before = snapshot(w)
        with env(GRAPHRT_BACKEND=backend):
            with pytest.raises(ContractError, match=f"offsets: .*expert {first}"):
                grouped_gemm_wgrad(a, b, offsets, wgrad=w, wgrad_dtype=torch.float32, runtime=rt)
            assert_unchanged(before, (w,))
            graphrt.check_errors(device)   # nothing launched, nothing flagged
            # where the host cannot look: defined results and a flag
            plan = rt.plan(GroupedGemmWgrad, a, b, offsets, wgrad=w)
            plan.execute(a, b, offsets, wgrad=w)
            with pytest.raises(graphrt.DeviceCheckError, match=r"offsets.*first at index " + str(first)):
                graphrt.check_errors(device)
            graphrt.check_errors(device)   # cleared by the read
            ref = _expected_with_empty(a.cpu(), b.cpu(), offsets.cpu().clamp(max=12), empty)
            assert rel_l2(w.cpu(), ref) < 1e-5, (bad, backend)
            # accumulating: an expert with bad bounds is left as it was
            init = torch.randn(3, 24, 40, device=device)
            acc = rt.plan(GroupedGemmWgrad, a, b, offsets, wgrad=w, accumulate_on_output=True)
            w.copy_(init)
            acc.execute(a, b, offsets, wgrad=w)
            with pytest.raises(graphrt.DeviceCheckError):
                graphrt.check_errors(device)
            ref = _expected_with_empty(a.cpu(), b.cpu(), offsets.cpu().clamp(max=12), empty,
                                       init.cpu())
            assert rel_l2(w.cpu(), ref) < 1e-5, (bad, backend, "accumulate")


def test_bad_offsets_reference_backend_cpu():
    _check_bad_offsets("cpu", "reference")


@needs_interpreter
def test_bad_offsets_interpreted_kernel():
    _check_bad_offsets("cpu", "triton")


def test_valid_offsets_flag_nothing():
    a, b, offsets = _problem([4, 0, 8], 8, 8)
    plan = GroupedGemmWgrad(a, b, offsets).compile()
    w = torch.empty(3, 8, 8, dtype=BF16)
    plan.execute(a, b, offsets, wgrad=w)
    graphrt.check_errors("cpu")


def test_zero_experts():
    a, b, _ = _problem([], 8, 8)
    offsets = torch.zeros(0, dtype=torch.int32)
    ref = grouped_gemm_wgrad_reference(a, b, offsets)
    assert ref.shape == (0, 8, 8)
    (w,) = grouped_gemm_wgrad(a, b, offsets)
    assert w.shape == (0, 8, 8)


def test_check_offsets_must_be_bool():
    a, b, offsets = _problem([4, 4], 8, 8)
    with pytest.raises(ContractError, match="check_offsets"):
        grouped_gemm_wgrad(a, b, offsets, check_offsets="no")


def test_plan_key_excludes_tokens_sum():
    a, b, offsets = _problem([4, 4], 8, 8)
    a2, b2, offsets2 = _problem([40, 4], 8, 8)
    assert GroupedGemmWgrad.contract_for(a, b, offsets) == GroupedGemmWgrad.contract_for(a2, b2, offsets2)
    a3, _, _ = _problem([4, 4], 8, 8, a_major="m")
    assert GroupedGemmWgrad.contract_for(a3, b, offsets) != GroupedGemmWgrad.contract_for(a, b, offsets)


def _check_non_finite_neighbours(device):
    """Inf and NaN in one expert's tokens leave every other expert's gradient finite and exact:
    the K-major paths load whole 8-token groups, which reach into the neighbours, and must mask
    them to the expert's own tokens."""
    counts = [5, 19, 3, 37]   # tokens_sum 64; experts begin at 5, 24 and 27
    for a_major, b_major in (("k", "n"), ("k", "k"), ("m", "k"), ("m", "n")):
        a, b, offsets = _problem(counts, 24, 40, a_major, b_major, device)
        a[:, 5], a[:, 23], b[6], b[22] = float("inf"), float("nan"), float("-inf"), float("nan")
        w = torch.full((4, 24, 40), float("nan"), device=device)
        grouped_gemm_wgrad(a, b, offsets, wgrad=w, wgrad_dtype=torch.float32)
        begin = 0
        for e, n in enumerate(counts):
            if e != 1:
                ref = a[:, begin:begin + n].double().cpu() @ b[begin:begin + n].double().cpu()
                assert rel_l2(w[e].cpu(), ref.float()) < 1e-5, (a_major, b_major, e)
            begin += n


@needs_interpreter
def test_non_finite_tokens_stay_in_their_expert_interpreted():
    with env(GRAPHRT_BACKEND="triton"):
        _check_non_finite_neighbours("cpu")


@pytest.mark.gpu
def test_gpu_non_finite_tokens_stay_in_their_expert(seed):
    _check_non_finite_neighbours("cuda")


# -- GPU --------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("a_major,b_major", [("k", "n"), ("m", "n"), ("k", "k"), ("m", "k")])
@pytest.mark.parametrize("dtype", [BF16, torch.float32])
@pytest.mark.parametrize("hidden", [1024, 1152])   # 8 row tiles: one full group; 9: a short last one
# tokens_sum 1596 (rows of K-major operands not 16-byte aligned) and 1600 (aligned: 8 tokens a
# load, odd counts so that experts start and end between multiples of 8)
@pytest.mark.parametrize("counts", [[0, 300, 17, 0, 1024, 255], [0, 301, 17, 0, 1023, 259]])
def test_gpu_matches_reference(seed, a_major, b_major, dtype, hidden, counts):
    a, b, offsets = _problem(counts, hidden, 768, a_major, b_major, "cuda")
    w = torch.full((len(counts), hidden, 768), float("nan"), device="cuda").to(dtype)
    grouped_gemm_wgrad(a, b, offsets, wgrad=w, wgrad_dtype=dtype)
    _close(w, _expected(a, b, offsets, "tensor2d", dtype), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [1024, 1156])
@pytest.mark.parametrize("counts", [[0, 304, 16, 0, 1024, 256], [0, 301, 17, 0, 1023, 259],
                                    [0, 304, 17, 0, 1023, 256]])
def test_gpu_ragged_matches_reference(seed, hidden, counts):
    _check_ragged_aligned_and_odd(counts, hidden, 768, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("block_n", [128, 256])
def test_gpu_ragged_prefetched_loop(seed, block_n):
    """``ragged_prefetch`` on the GPU, called directly: at the plan's tile (128 x 256, which
    the plan runs with it since 2026-12-02) and at 128 x 128 (which the sweep also times)."""
    from graphrt.ops.grouped_gemm.kernels import GemmConfig
    cfg = GemmConfig(128, block_n, 64, 8, 3, 8, ragged_prefetch=True)
    _check_ragged_aligned_and_odd([0, 301, 17, 0, 1023, 259], 1156, 768, "cuda", cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("with_rows", [True, False])
@pytest.mark.parametrize("decreasing_at", [None, 4])
def test_gpu_ragged_rows_workspace(seed, with_rows, decreasing_at):
    _check_ragged_rows([0, 301, 17, 0, 1023, 259, 1, 256], 1156, 768, "cuda", with_rows,
                       decreasing_at)


def _ragged_tma_plan(a, b, offsets, **flags):
    """The plan of a ragged call on this GPU, checked to run the TMA kernel, and its
    workspace (poisoned), where the experts off multiples of 8 tokens are copied, as the
    functional call does."""
    plan = GroupedGemmWgrad(a, b, offsets, input_order="tensor_ragged", **flags).compile()
    assert plan.ragged_tma is not None
    ws = torch.full((plan.call_workspace_bytes(a.shape[1]),), 255, dtype=torch.uint8,
                    device=a.device)
    return plan, ws


# counts in multiples of 8 (TMA) below, at and above a step of 64 tokens, and off them (the
# Triton kernel), empty experts
TMA_COUNTS = [0, 304, 17, 0, 1024, 259, 8, 256, 7, 64, 136, 6, 3, 0, 45, 72]
# tensor2d: 2216 tokens (K-major rows 16-byte aligned); experts' first tokens and counts on
# and off multiples of 8 and of 64 (the TMA kernels' boxes), empty experts
TENSOR2D_TMA_COUNTS = [0, 304, 16, 0, 1024, 259, 5, 256, 64, 136, 3, 5, 0, 45, 72, 27]


def _ragged_tma_config(monkeypatch, **fields):
    """Plans made from here on run Hopper's ragged TMA kernel with these RaggedTmaConfig
    fields."""
    from graphrt.ops.grouped_gemm import kernels_ragged
    monkeypatch.setattr(kernels_ragged, "RAGGED_TMA_CONFIG",
                        kernels_ragged.RaggedTmaConfig(**fields))


@pytest.mark.gpu
@pytest.mark.parametrize("padded_odd", [False, True])
@pytest.mark.parametrize("hidden,inter", [(1024, 768), (1160, 520)])   # 1160, 520: short tiles
@pytest.mark.parametrize("dtype", [BF16, torch.float32])
@pytest.mark.parametrize("mode,accumulate", [("dense", False), ("dense", True),
                                             ("discrete", False), ("discrete", True)])
def test_gpu_ragged_tma_matches_reference(seed, hidden, inter, dtype, mode, accumulate,
                                          padded_odd, monkeypatch):
    """Hopper's ragged TMA kernel through the plan, with the Triton kernel for the counts it
    leaves, or (``padded_odd``) taking those too from their padded copy in the workspace:
    short row and column tiles, both output modes, overwritten (output poisoned) or
    accumulated into."""
    _ragged_tma_config(monkeypatch, padded_odd=padded_odd)
    _check_ragged_tma_plan(TMA_COUNTS, hidden, inter, dtype, mode, accumulate)


def _check_ragged_tma_plan(counts, hidden, inter, dtype, mode, accumulate):
    """The ragged plan on this GPU (the TMA kernel) against the reference, the output poisoned
    or accumulated into, dense or discrete."""
    a, b, a2d, b2d, offsets = _ragged_problem(counts, hidden, inter, "cuda")
    plan, ws = _ragged_tma_plan(a, b, offsets, wgrad_dtype=dtype, output_mode=mode,
                                accumulate_on_output=accumulate)
    init = torch.randn(len(counts), hidden, inter, device="cuda").to(dtype)
    w = init.clone() if accumulate else torch.full_like(init, float("nan"))
    ptrs = (torch.tensor([w[e].data_ptr() for e in range(len(counts))], device="cuda")
            if mode == "discrete" else None)
    plan.execute(a, b, offsets, wgrad=w, wgrad_ptrs=ptrs, workspace=ws)
    _close(w, _expected(a2d, b2d, offsets, "tensor2d", dtype, init if accumulate else None,
                        counts), dtype)


@pytest.mark.gpu
def test_gpu_ragged_many_experts_run_the_triton_kernel_alone(seed):
    """A plan of more than 64 experts leaves out the TMA kernel (slower there on the H200) and
    the Triton kernel takes every expert, aligned and odd counts, empty ones among them."""
    from graphrt.ops.grouped_gemm.kernels_ragged import PLAN_MAX_EXPERTS
    counts = torch.randint(0, 40, (PLAN_MAX_EXPERTS + 8,)).tolist()
    counts[::9] = [8 * (e % 5) for e in range(len(counts[::9]))]   # aligned, some empty
    a, b, a2d, b2d, offsets = _ragged_problem(counts, 264, 136, "cuda")
    plan = GroupedGemmWgrad(a, b, offsets, input_order="tensor_ragged",
                            wgrad_dtype=torch.float32).compile()
    assert plan.ragged_tma is None
    ws = torch.full((plan.call_workspace_bytes(a.shape[1]),), 255, dtype=torch.uint8,
                    device="cuda")
    w = torch.full((len(counts), 264, 136), float("nan"), device="cuda")
    plan.execute(a, b, offsets, wgrad=w, workspace=ws)
    _close(w, _expected(a2d, b2d, offsets, "tensor2d", torch.float32), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("sorted_experts", [False, True])
def test_gpu_ragged_tma_kernel_called_directly(seed, sorted_experts):
    """The TMA kernel launched directly, as the plan does, with each of its work splits
    (experts in order, or sorted by count with the programs' order snaking), then the Triton
    kernel's share, against the reference; FP32 output poisoned."""
    from graphrt.device_checks import error_flags
    from graphrt.ops.grouped_gemm.kernels import gemm_config, launch_wgrad, ragged_rows_bytes
    from graphrt.ops.grouped_gemm.kernels_ragged import (launch_wgrad_ragged_tma,
                                                         RaggedTmaConfig)
    hidden, inter = 1024, 768
    a, b, a2d, b2d, offsets = _ragged_problem(TMA_COUNTS, hidden, inter, "cuda")
    w = torch.full((len(TMA_COUNTS), hidden, inter), float("nan"), device="cuda")
    errors = error_flags(a.device)
    launch_wgrad_ragged_tma(a, b, offsets, w, None, torch.float32, errors, hidden=hidden,
                            inter=inter, accumulate=False,
                            config=RaggedTmaConfig(sorted_experts=sorted_experts))
    rows = torch.full((ragged_rows_bytes(sum(TMA_COUNTS), hidden, inter),), 255,
                      dtype=torch.uint8, device="cuda")
    launch_wgrad(gemm_config(False), a, b, offsets, w, None, torch.float32, errors,
                 hidden=hidden, inter=inter, a_k_major=True, b_k_major=True, ragged=True,
                 accumulate=False, dot_fp32=False, rows=rows, skip_tma_taken=True)
    _close(w, _expected(a2d, b2d, offsets, "tensor2d", torch.float32), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("sorted_experts", [False, True])
def test_gpu_ragged_tma_reads_the_copy_only_once_it_is_made(seed, sorted_experts,
                                                           monkeypatch):
    """The TMA kernel, a dependent launch after the padded copy, reads no copied block
    before the copy has landed: with the largest expert off multiples of 8 (the longest
    copy, and the sorted split's first items), others odd at the end of the order, experts
    read in place between them, and the workspace poisoned before each call, every expert
    matches the reference, three calls in a row."""
    _ragged_tma_config(monkeypatch, sorted_experts=sorted_experts)
    counts = [6149, 2048, 1024, 3, 4096, 1016, 0, 517]
    hidden, inter = 1024, 512
    a, b, a2d, b2d, offsets = _ragged_problem(counts, hidden, inter, "cuda")
    plan, ws = _ragged_tma_plan(a, b, offsets, wgrad_dtype=torch.float32)
    ref = _expected(a2d, b2d, offsets, "tensor2d", torch.float32)
    for _ in range(3):
        ws.fill_(255)
        w = torch.full((len(counts), hidden, inter), float("nan"), device="cuda")
        plan.execute(a, b, offsets, wgrad=w, workspace=ws)
        _close(w, ref, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("sorted_experts", [False, True])
def test_gpu_ragged_tma_kernel_reads_the_padded_copy(seed, sorted_experts):
    """Given the padded copy of the experts off multiples of 8 tokens (made into a poisoned
    workspace), the TMA kernel launched directly computes every expert, in each work split;
    FP32 output poisoned."""
    from graphrt.device_checks import error_flags
    from graphrt.ops.grouped_gemm.kernels import (launch_ragged_padded, PADDED_CONFIG,
                                                  ragged_padded_bytes, ragged_padded_views)
    from graphrt.ops.grouped_gemm.kernels_ragged import (launch_wgrad_ragged_tma,
                                                         RaggedTmaConfig)
    hidden, inter, t, experts = 1024, 768, sum(TMA_COUNTS), len(TMA_COUNTS)
    a, b, a2d, b2d, offsets = _ragged_problem(TMA_COUNTS, hidden, inter, "cuda")
    scratch = torch.full((ragged_padded_bytes(t, experts, hidden, inter),), 255,
                         dtype=torch.uint8, device="cuda")
    padded = ragged_padded_views(scratch, t, experts, hidden, inter)
    w = torch.full((experts, hidden, inter), float("nan"), device="cuda")
    errors = error_flags(a.device)
    launch_ragged_padded(PADDED_CONFIG, a, b, *padded, offsets, w, None, torch.float32, errors,
                         hidden=hidden, inter=inter, accumulate=False)
    launch_wgrad_ragged_tma(a, b, offsets, w, None, torch.float32, errors, hidden=hidden,
                            inter=inter, accumulate=False,
                            config=RaggedTmaConfig(sorted_experts=sorted_experts), padded=padded)
    ref = _expected(a2d, b2d, offsets, "tensor2d", torch.float32)
    _close(w, ref, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", [(64, 256, 8, 2), (64, 256, 8, 2, True, 1),
                                 (64, 256, 8, 1, True, 3), (32, 512, 8, 1, True, 2)])
def test_gpu_ragged_padded_copy_alone(seed, cfg):
    """The padded copy alone on the GPU, two-byte loads or 8-byte words (pipelined or not),
    into a poisoned workspace: bit for bit, zeros past each count, nothing else written; long
    and short experts, the last one odd (its last word ends the buffer)."""
    from graphrt.ops.grouped_gemm.kernels import PaddedConfig
    _check_padded_copy([1501, 2049, 0, 1, 1024, 1733, 7, 1875], 264, 136, "cuda",
                       PaddedConfig(*cfg))


@pytest.mark.gpu
@pytest.mark.parametrize("accumulate", [False, True])
def test_gpu_ragged_padded_copy_out_of_order(seed, accumulate):
    """With an expert's end below its begin the copy's kernel copies nothing and computes the
    valid experts off multiples of 8 itself, into a poisoned output or accumulated into
    random values; the others are left alone (the invalid one to the TMA kernel, which
    flags it)."""
    from graphrt.ops.grouped_gemm.kernels import PADDED_CONFIG
    _check_padded_copy([1501, 2049, 0, 1, 1024, 1733, 7, 1875], 264, 136, "cuda",
                       PADDED_CONFIG, decreasing_at=4, accumulate=accumulate)


@pytest.mark.gpu
@pytest.mark.parametrize("aligned,stages", [(False, 1), (True, 3)])
def test_gpu_ragged_padded_copy_plan_other_configs(seed, aligned, stages, monkeypatch):
    """The plan with the padded copy by two-byte loads, or moving 8-byte words pipelined 3
    items ahead (the default: one stage), against the reference."""
    from graphrt.ops.grouped_gemm import kernels
    monkeypatch.setattr(kernels, "PADDED_CONFIG",
                        kernels.PaddedConfig(aligned_loads=aligned, stages=stages))
    _check_ragged_rows([16, 0, 5, 33, 17, 1, 8, 300, 7], 264, 136, "cuda", True)


@pytest.mark.gpu
@pytest.mark.parametrize("decreasing_at", [None, 3])
def test_gpu_ragged_padded_copy_workspace(seed, decreasing_at, monkeypatch):
    """The plan with the padded copy: aligned, odd, empty and single-token experts; with an
    expert's end below its begin (flagged, computed as empty) nothing is copied and the Triton
    kernel takes the experts off multiples of 8 two bytes at a time."""
    _ragged_tma_config(monkeypatch, padded_odd=True)
    _check_ragged_rows([16, 0, 5, 33, 17, 1, 8, 300, 7], 264, 136, "cuda", True, decreasing_at)


@pytest.mark.gpu
def test_gpu_ragged_padded_copy_functional_calls_follow_new_routing(seed, monkeypatch):
    """The functional call with the padded copy, on a fresh runtime (the default one's bound
    calls were recorded without it): the second and third calls of the same kind replay the
    first's launches into their own workspaces, with new odd counts each; FP32 output
    poisoned, against the reference."""
    _ragged_tma_config(monkeypatch, padded_odd=True)
    rt = graphrt.Runtime("cuda")
    hidden, inter, tokens = 264, 136, 1203
    for counts in ([300, 0, 17, 5, 881], [1, 600, 33, 0, 569], [8, 16, 1179, 0, 0]):
        assert sum(counts) == tokens
        a, b, a2d, b2d, offsets = _ragged_problem(counts, hidden, inter, "cuda")
        w = torch.full((len(counts), hidden, inter), float("nan"), device="cuda")
        grouped_gemm_wgrad(a, b, offsets, wgrad=w, wgrad_dtype=torch.float32,
                           input_order="tensor_ragged", runtime=rt)
        _close(w, _expected(a2d, b2d, offsets, "tensor2d", torch.float32), torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("aligned", [False, True])
def test_gpu_ragged_padded_copy_capture_replays_new_routing(seed, aligned, monkeypatch):
    """The functional call with the padded copy by two-byte loads or 8-byte words, on a fresh
    runtime, captured: routings with long odd, aligned and empty experts replayed against
    eager calls, bitwise, and the reference."""
    from graphrt.capture import capture
    from graphrt.ops.grouped_gemm import kernels
    monkeypatch.setattr(kernels, "PADDED_CONFIG", kernels.PaddedConfig(aligned_loads=aligned))
    read_errors()
    rt = graphrt.Runtime("cuda")
    counts = [1000, 2003, 0, 1093]
    a, b, _, _, offsets = _ragged_problem(counts, 1024, 512, "cuda")
    call = lambda a, b, o: grouped_gemm_wgrad(a, b, o, input_order="tensor_ragged",  # noqa: E731
                                              runtime=rt)[0]
    frag = capture(call, a, b, offsets)
    for routing in ([4096, 0, 0, 0], [1, 2, 3, 4090], [1024, 1024, 1024, 1024],
                    [333, 0, 3001, 762]):
        new = torch.tensor(list(itertools.accumulate(routing)), dtype=torch.int32, device="cuda")
        replayed = frag(a, b, new).clone()
        eager = call(a, b, new)
        assert torch.equal(replayed, eager)
        _close(replayed, grouped_gemm_wgrad_reference(a, b, new, input_order="tensor_ragged"),
               BF16)
    graphrt.check_errors()


@pytest.mark.gpu
def test_gpu_ragged_tma_next_rows_stay_out(seed):
    """A box past an expert's count (40 and 88 tokens: steps of 64) reaches the next row's
    first tokens in memory (TMA gives zeros past the block): NaN and inf there reach only the
    rows and columns that own them."""
    counts = [40, 0, 24, 88]
    a, b, a2d, b2d, offsets = _ragged_problem(counts, 64, 256, "cuda")
    block_a = a.reshape(-1)[:64 * 40].view(64, 40)        # expert 0's A block
    block_b = b.reshape(-1)[256 * 64:].view(256, 88)      # expert 3's B block
    block_a[5, :8] = float("nan")
    block_b[9, :3] = float("inf")
    a2d[5, :8] = float("nan")
    b2d[64:67, 9] = float("inf")
    plan, _ = _ragged_tma_plan(a, b, offsets, wgrad_dtype=torch.float32)
    w = torch.full((4, 64, 256), 3.0, device="cuda")
    plan.execute(a, b, offsets, wgrad=w)
    ref = _expected(a2d, b2d, offsets, "tensor2d", torch.float32)
    assert torch.equal(w.isnan(), ref.isnan()) and torch.equal(w.isinf(), ref.isinf())
    finite = ref.isfinite()
    assert finite[0, 4].all() and finite[0, 6].all() and finite[3][:, 8].all()
    assert rel_l2(w[finite], ref[finite]) < 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("mode,accumulate,dtype", [("dense", False, torch.float32),
                                                   ("dense", True, BF16),
                                                   ("discrete", False, BF16),
                                                   ("discrete", True, torch.float32)])
def test_gpu_tensor2d_k_major_through_tma(seed, mode, accumulate, dtype):
    """tensor2d with both operands K-major through the plan on Hopper: the TMA kernel takes
    every expert, its boxes from the multiple of 64 tokens at or before its first token; a
    box reads the previous expert's last tokens and the next one's first, where NaN and inf
    reach only the experts that own them. Output poisoned or accumulated into."""
    counts, hidden, inter = TENSOR2D_TMA_COUNTS, 1160, 520   # short row and column tiles
    a, b, offsets = _problem(counts, hidden, inter, "k", "k", "cuda")
    a[5, 300] = float("nan")    # expert 1's, inside expert 2's first box (from token 256)
    a[5, 1601] = float("nan")   # expert 5's, inside the first boxes of 6 and 7
    b[2066, 9] = float("inf")   # expert 10's, inside expert 9's last box and 11's first
    plan = GroupedGemmWgrad(a, b, offsets, wgrad_dtype=dtype, output_mode=mode,
                            accumulate_on_output=accumulate).compile()
    assert plan.tensor2d_tma is not None
    init = torch.randn(len(counts), hidden, inter, device="cuda").to(dtype)
    w = init.clone() if accumulate else torch.full_like(init, float("nan"))
    ptrs = (torch.tensor([w[e].data_ptr() for e in range(len(counts))], device="cuda")
            if mode == "discrete" else None)
    plan.execute(a, b, offsets, wgrad=w, wgrad_ptrs=ptrs)
    ref = _expected(a, b, offsets, "tensor2d", dtype, init if accumulate else None, counts)
    assert torch.equal(w.isnan(), ref.isnan()) and torch.equal(w.isinf(), ref.isinf())
    assert ref[1, 5].isnan().any() and ref[5, 5].isnan().any()
    assert not (ref[2].isnan().any() or ref[6].isnan().any() or ref[7].isnan().any())
    finite = ref.isfinite()
    _close(w[finite], ref[finite], dtype)


def _check_discrete_outputs(device, order, a_major, b_major, shift, accumulate,
                            counts=(40, 0, 264, 13, 128, 75), hidden=392, inter=264, **call):
    """Discrete BF16 outputs ``shift`` elements past 16-byte alignment (0: aligned, stored 16
    bytes at a time; 4: 8 bytes off, which execute does not check), written exactly where they
    point and nothing around them touched; poisoned, or accumulated into."""
    counts = list(counts)
    if order == "tensor_ragged":
        a, b, a2d, b2d, offsets = _ragged_problem(counts, hidden, inter, device)
    else:
        a, b, offsets = _problem(counts, hidden, inter, a_major, b_major, device)
        a2d, b2d = a, b
    size = hidden * inter
    init = torch.randn(len(counts), hidden, inter, device=device).to(BF16)
    store = torch.full((len(counts) * (size + 8) + 16,), float("nan"), dtype=BF16, device=device)
    first = (-store.data_ptr() % 16) // 2 + shift
    views = [store[first + e * (size + 8):][:size].view(hidden, inter)
             for e in range(len(counts))]
    if accumulate:
        for e, view in enumerate(views):
            view.copy_(init[e])
    ptrs = torch.tensor([v.data_ptr() for v in views], device=device)
    assert all((p % 16 == 0) == (shift == 0) for p in ptrs.tolist())
    graphrt.ops.grouped_gemm_wgrad(a, b, offsets, input_order=order, wgrad_ptrs=ptrs,
                                   output_mode="discrete", accumulate_on_output=accumulate,
                                   check_offsets=False, **call)
    ref = _expected(a2d, b2d, offsets, "tensor2d", BF16, init if accumulate else None, counts)
    for e in range(len(counts)):
        if counts[e] or accumulate:
            _close(views[e], ref[e], BF16)
        else:
            assert (views[e] == 0).all()
    untouched = torch.ones_like(store, dtype=torch.bool)
    for view in views:
        begin = (view.data_ptr() - store.data_ptr()) // 2
        untouched[begin:begin + size] = False
    assert store[untouched].isnan().all()


@needs_interpreter
@pytest.mark.parametrize("shift", [0, 4])
def test_discrete_outputs_aligned_or_not_interpreted(shift):
    with env(GRAPHRT_BACKEND="triton"):
        _check_discrete_outputs("cpu", "tensor2d", "k", "n", shift, True, counts=(9, 0, 16, 5),
                                hidden=24, inter=16, runtime=graphrt.Runtime("cpu"))


@pytest.mark.gpu
@pytest.mark.parametrize("order,a_major,b_major", [("tensor2d", "k", "k"), ("tensor2d", "m", "n"),
                                                   ("tensor_ragged", "k", "k")])
@pytest.mark.parametrize("shift", [0, 4])
@pytest.mark.parametrize("accumulate", [False, True])
def test_gpu_discrete_outputs_aligned_or_not(seed, order, a_major, b_major, shift, accumulate):
    """Through the plan: the TMA kernels, and for ragged the Triton kernel's odd experts."""
    _check_discrete_outputs("cuda", order, a_major, b_major, shift, accumulate)


@pytest.mark.gpu
@pytest.mark.parametrize("a_major,b_major,tokens_off_8,sorted_experts", [
    ("m", "n", False, True), ("m", "n", True, True), ("k", "n", False, True),
    ("k", "k", False, True), ("m", "k", False, True), ("m", "n", False, False),
    ("k", "k", False, False)])
@pytest.mark.parametrize("mode,accumulate,dtype", [("dense", False, torch.float32),
                                                   ("dense", True, BF16),
                                                   ("discrete", False, BF16),
                                                   ("discrete", True, torch.float32)])
def test_gpu_tensor2d_tma_kernel_every_layout(seed, a_major, b_major, tokens_off_8,
                                              sorted_experts, mode, accumulate, dtype):
    """Hopper's tensor2d TMA kernel (kernels_tensor2d.py) launched directly in each layout and
    both work splits, against the reference: odd, aligned and empty experts, blocks of 64
    tokens shared between experts, tiles cut short (1160 x 520), and for M-N a token count off
    multiples of 8. NaN and inf among one expert's tokens, inside its neighbours' blocks, reach
    only it. Output poisoned or accumulated into, dense or discrete."""
    from graphrt.device_checks import error_flags
    from graphrt.ops.grouped_gemm.kernels_tensor2d import (fits_tensor2d_kernel,
                                                           launch_wgrad_tensor2d_tma,
                                                           Tensor2dTmaConfig)
    counts = TENSOR2D_TMA_COUNTS[:-1] + [26] if tokens_off_8 else TENSOR2D_TMA_COUNTS
    hidden, inter = 1160, 520
    a, b, offsets = _problem(counts, hidden, inter, a_major, b_major, "cuda")
    assert fits_tensor2d_kernel(a, b, torch.cuda.get_device_capability())
    # tokens in blocks of 64 that experts share: 303 (expert 1's last, its block shared with
    # 2), 1601 (expert 5's, shared with 6 and 7), 2066 (expert 10's, shared with 9, 11, 13)
    a[5, 303] = float("nan")
    a[7, 1601] = float("nan")
    b[2066, 9] = float("inf")
    init = torch.randn(len(counts), hidden, inter, device="cuda").to(dtype)
    w = init.clone() if accumulate else torch.full_like(init, float("nan"))
    ptrs = (torch.tensor([w[e].data_ptr() for e in range(len(counts))], device="cuda")
            if mode == "discrete" else None)
    launch_wgrad_tensor2d_tma(a, b, offsets, w, ptrs, dtype, error_flags(a.device),
                              hidden=hidden, inter=inter, accumulate=accumulate,
                              config=Tensor2dTmaConfig(sorted_experts=sorted_experts))
    ref = _expected(a, b, offsets, "tensor2d", dtype, init if accumulate else None, counts)
    assert torch.equal(w.isnan(), ref.isnan()) and torch.equal(w.isinf(), ref.isinf())
    assert ref[1, 5].isnan().all() and ref[5, 7].isnan().all() and ref[10][:, 9].isinf().any()
    assert not any(ref[e].isnan().any() or ref[e].isinf().any() for e in (2, 6, 7, 9, 11, 13))
    finite = ref.isfinite()
    _close(w[finite], ref[finite], dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("a_major,b_major", [("m", "n"), ("k", "n"), ("k", "k"), ("m", "k")])
def test_gpu_tensor2d_tma_kernel_through_the_plan(seed, a_major, b_major, monkeypatch):
    """Plans of the layouts ``Tensor2dTmaConfig.plan_layouts`` names run the tensor2d TMA
    kernel: the functional call matches the reference, and captured in a CUDA graph, replays
    of new routing (odd, empty and all-in-one experts) match eager calls bitwise, the bad
    offsets of one replay flagged and computed as empty."""
    from graphrt.capture import capture
    from graphrt.ops.grouped_gemm import kernels_tensor2d as k2
    layouts = frozenset({("k" if a_major == "k" else "mn", "k" if b_major == "k" else "mn")})
    monkeypatch.setattr(k2, "TENSOR2D_TMA_CONFIG", k2.Tensor2dTmaConfig(plan_layouts=layouts))
    launched = []
    real = k2.launch_wgrad_tensor2d_tma
    monkeypatch.setattr(k2, "launch_wgrad_tensor2d_tma",
                        lambda *args, **kw: launched.append(1) or real(*args, **kw))
    counts = [100, 200, 0, 213, 55]   # 568 tokens: K-major rows 16-byte aligned
    a, b, offsets = _problem(counts, 264, 136, a_major, b_major, "cuda")
    (w,) = grouped_gemm_wgrad(a, b, offsets, wgrad_dtype=torch.float32)
    assert launched
    _close(w, _expected(a, b, offsets, "tensor2d", torch.float32), torch.float32)
    frag = capture(lambda a, b, o: grouped_gemm_wgrad(a, b, o)[0], a, b, offsets)
    for routing in ([568, 0, 0, 0, 0], [1, 2, 3, 506, 56], [0, 63, 65, 128, 312]):
        new = torch.tensor(list(itertools.accumulate(routing)), dtype=torch.int32, device="cuda")
        replayed = frag(a, b, new).clone()
        (eager,) = grouped_gemm_wgrad(a, b, new)
        assert torch.equal(replayed, eager)
    graphrt.check_errors("cuda")
    bad = torch.tensor([100, 2**31 - 1, 50, 400, 568], dtype=torch.int32, device="cuda")
    out = frag(a, b, bad)
    with pytest.raises(graphrt.DeviceCheckError, match="first at index 1"):
        graphrt.check_errors("cuda")
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.isfinite(out.float()).all()


def test_tensor2d_tma_config_runs_every_layout_up_to_its_sorted_expert_limit():
    from graphrt.ops.grouped_gemm.kernels_tensor2d import TENSOR2D_TMA_CONFIG, Tensor2dTmaConfig
    assert TENSOR2D_TMA_CONFIG.sorts(64) and not TENSOR2D_TMA_CONFIG.sorts(65)
    assert not Tensor2dTmaConfig(sorted_experts=False).sorts(8)
    assert all(TENSOR2D_TMA_CONFIG.runs(a, b, 64) for a in ("k", "mn") for b in ("k", "mn"))
    assert not any(TENSOR2D_TMA_CONFIG.runs(a, b, 65) for a in ("k", "mn") for b in ("k", "mn"))
    only_mn = Tensor2dTmaConfig(plan_layouts=frozenset({("mn", "mn")}))
    assert only_mn.runs("mn", "mn", 8) and not only_mn.runs("k", "k", 8)


def test_tensor2d_tma_kernel_takes_aligned_rows_only():
    """The tensor2d TMA kernel's operands: K-major ones need T a multiple of 8 (16-byte row
    strides), M- and N-major ones hidden and intermediate multiples of 8; BF16 only, Hopper
    only, and nothing on Triton releases other than the one its Gluon API was written for."""
    from graphrt.ops.grouped_gemm import kernels_tensor2d as k
    hopper = (9, 0)
    a, b, _ = _problem([8, 8], 16, 24, "m", "n")
    assert k.fits_tensor2d_kernel(a, b, hopper) == k.GLUON_API_OK
    assert not k.fits_tensor2d_kernel(a, b, (10, 0))
    a, b, _ = _problem([8, 7], 16, 24, "m", "n")     # T = 15: M- and N-major rows still fit
    assert k.fits_tensor2d_kernel(a, b, hopper) == k.GLUON_API_OK
    a, b, _ = _problem([8, 7], 16, 24, "k", "n")     # K-major A with T = 15 does not
    assert not k.fits_tensor2d_kernel(a, b, hopper)
    a, b, _ = _problem([8, 7], 16, 24, "m", "k")
    assert not k.fits_tensor2d_kernel(a, b, hopper)
    a, b, _ = _problem([8, 8], 12, 24, "m", "n")     # hidden 12: M-major rows of 24 bytes
    assert not k.fits_tensor2d_kernel(a, b, hopper)
    a, b, _ = _problem([8, 8], 16, 24, "m", "n")
    assert not k.fits_tensor2d_kernel(a.float(), b.float(), hopper)


@pytest.mark.gpu
def test_gpu_ragged_tma_bad_offsets_flag_and_stay_in_bounds(seed):
    """An expert whose end falls below its begin: flagged, computed as empty, the others
    exact (the TMA kernel reads only inside each valid expert's blocks)."""
    counts = [0, 304, 17, 0, 1024, 259, 1, 256]
    a, b, _, _, offsets = _ragged_problem(counts, 1024, 768, "cuda")
    offsets[4] = offsets[3] - 3
    plan, ws = _ragged_tma_plan(a, b, offsets, wgrad_dtype=torch.float32)
    graphrt.check_errors("cuda")
    w = torch.full((len(counts), 1024, 768), float("nan"), device="cuda")
    plan.execute(a, b, offsets, wgrad=w, workspace=ws)
    with pytest.raises(graphrt.DeviceCheckError):
        graphrt.check_errors("cuda")
    ref = grouped_gemm_wgrad_reference(a, b, offsets, input_order="tensor_ragged",
                                       out_dtype=torch.float32)
    assert rel_l2(w, ref) < 1e-5


@pytest.mark.gpu
def test_gpu_ragged_capture_replays_new_routing(seed):
    """The functional ragged call captured (its rows' workspace allocated inside the graph):
    routings with odd, aligned and empty experts replayed against eager calls, bitwise."""
    from graphrt.capture import capture
    counts = [100, 203, 0, 209]
    a, b, _, _, offsets = _ragged_problem(counts, 520, 264, "cuda")
    call = lambda a, b, o: grouped_gemm_wgrad(a, b, o, input_order="tensor_ragged")[0]  # noqa: E731
    frag = capture(call, a, b, offsets)
    for routing in ([512, 0, 0, 0], [1, 2, 3, 506], [128, 128, 128, 128], [33, 0, 400, 79]):
        new = torch.tensor(list(itertools.accumulate(routing)), dtype=torch.int32, device="cuda")
        replayed = frag(a, b, new).clone()
        eager = call(a, b, new)
        assert torch.equal(replayed, eager)
        ref = grouped_gemm_wgrad_reference(a, b, new, input_order="tensor_ragged")
        _close(replayed, ref, BF16)


@pytest.mark.gpu
def test_gpu_capture_replays_new_routing_bitwise(seed):
    from graphrt.capture import capture
    counts = [100, 200, 0, 212]
    a, b, offsets = _problem(counts, 512, 256, device="cuda")
    frag = capture(lambda a, b, o: grouped_gemm_wgrad(a, b, o)[0], a, b, offsets)
    for routing in ([512, 0, 0, 0], [1, 2, 3, 506], [128, 128, 128, 128]):
        new = torch.tensor(list(itertools.accumulate(routing)), dtype=torch.int32, device="cuda")
        replayed = frag(a, b, new).clone()
        (eager,) = grouped_gemm_wgrad(a, b, new)
        assert torch.equal(replayed, eager)


@pytest.mark.gpu
@pytest.mark.parametrize("check_offsets", [True, False])
def test_gpu_error_paths_write_nothing(check_offsets):
    _errors("cuda", check_offsets)


@pytest.mark.gpu
def test_gpu_served_calls_still_read_the_offsets_on_the_host():
    """Calls of a kind the runtime serves from its recent bound call: with the default
    check_offsets the offsets are still read on the host, so bad ones are named before any
    launch; with check_offsets=False the call is served as it is."""
    graphrt.check_errors("cuda")   # flags an earlier test may have left
    rt = graphrt.Runtime("cuda")
    a, b, offsets = _problem([64, 64], 64, 64, device="cuda")
    for check in (False, True):
        for _ in range(3):   # bound, then served
            (w,) = grouped_gemm_wgrad(a, b, offsets, check_offsets=check, runtime=rt)
            _close(w, _expected(a, b, offsets, "tensor2d", BF16), BF16)
        assert rt._recent_calls and rt.plans.stats()["hits"] >= 2
    for ends in ([80, 40], [64, 100]):   # the same kind of call as the last ones
        with pytest.raises(ContractError, match="offsets: .*check_offsets=False"):
            grouped_gemm_wgrad(a, b, torch.tensor(ends, dtype=torch.int32, device="cuda"),
                               runtime=rt)
    graphrt.check_errors("cuda")   # nothing was launched with them


@pytest.mark.gpu
def test_gpu_bad_offsets_stay_in_bounds_and_flag():
    _check_bad_offsets("cuda", "triton")


@pytest.mark.gpu
def test_gpu_bad_offsets_under_capture_flag_on_replay(seed):
    from graphrt.capture import capture
    a, b, offsets = _problem([100, 200, 0, 212], 256, 128, device="cuda")
    frag = capture(lambda a, b, o: grouped_gemm_wgrad(a, b, o)[0], a, b, offsets)
    graphrt.check_errors("cuda")
    bad = torch.tensor([100, 2**31 - 1, 50, 512], dtype=torch.int32, device="cuda")
    out = frag(a, b, bad)
    with pytest.raises(graphrt.DeviceCheckError, match="first at index 1"):
        graphrt.check_errors("cuda")
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.equal(out[2], torch.zeros_like(out[2]))
    assert torch.isfinite(out.float()).all()


def _module_check(device):
    torch.manual_seed(0)
    layer = graphrt.nn.GroupedLinear(3, 32, 16, device=device)
    counts = [5, 0, 11]
    offsets = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32, device=device)
    x = torch.randn(16, 32, dtype=BF16, device=device, requires_grad=True)
    y = layer(x, offsets)
    dy = torch.randn_like(y)
    y.backward(dy)
    xd, wd = x.detach().double().requires_grad_(), layer.weight.detach().double().requires_grad_()
    ref = torch.cat([xd[s:e] @ wd[i].t() for i, (s, e) in enumerate(((0, 5), (5, 5), (5, 16)))])
    ref.backward(dy.double())
    assert rel_l2(y, ref) < 1e-2 and rel_l2(x.grad, xd.grad) < 1e-2
    assert rel_l2(layer.weight.grad[[0, 2]], wd.grad[[0, 2]]) < 1e-2
    assert torch.equal(layer.weight.grad[1], torch.zeros_like(layer.weight.grad[1]))


def test_grouped_linear_module_cpu():
    _module_check("cpu")


@pytest.mark.gpu
def test_grouped_linear_module_gpu():
    _module_check("cuda")


def test_grouped_linear_rejects_bad_inputs_before_running():
    layer = graphrt.nn.GroupedLinear(3, 32, 16)
    x = torch.randn(16, 32, dtype=BF16)
    good = torch.tensor([5, 5, 16], dtype=torch.int32)
    cases = [
        ((x, torch.tensor([5, 5, 12], dtype=torch.int32)), "offsets: the last end must equal tokens_sum=16"),
        ((x, torch.tensor([5, 3, 16], dtype=torch.int32)), "offsets: expert 1"),
        ((x, good.long()), "offsets: expected dtype"),
        ((x, good[:2]), "offsets: expected 3"),
        ((torch.randn(16, 31, dtype=BF16), good), "x: expected"),
        ((x.float(), good), "x: expected"),
    ]
    for args, pattern in cases:
        with pytest.raises(ContractError, match=pattern):
            layer(*args)
    for bad in (dict(experts=0), dict(in_features=2.5), dict(dtype=torch.float32)):
        kwargs = dict(experts=3, in_features=32, out_features=16)
        kwargs.update(bad)
        with pytest.raises(ContractError, match=next(iter(bad))):
            graphrt.nn.GroupedLinear(**kwargs)


@pytest.mark.parametrize("a_major,b_major", [("k", "n"), ("k", "k"), ("m", "n"), ("m", "k")])
def test_ragged_blocks_in_any_dense_tensor_match_fp64_per_expert(a_major, b_major):
    """tensor_ragged: per-expert blocks with tokens as the unit-stride axis, however the buffer
    is viewed (the contract's ragged input for both operands), against FP64 per expert."""
    torch.manual_seed(3)
    counts, hidden, inter = [3, 0, 5, 2], 8, 6
    offsets = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32)
    blocks_a = [torch.randn(hidden, n).to(BF16) for n in counts]      # A_e [hidden, n_e]
    blocks_b = [torch.randn(inter, n).to(BF16) for n in counts]       # B_e^T [intermediate, n_e]
    flat_a = torch.cat([blk.reshape(-1) for blk in blocks_a])
    flat_b = torch.cat([blk.reshape(-1) for blk in blocks_b])
    t = sum(counts)
    a = flat_a.view(hidden, t) if a_major == "k" else flat_a.view(t, hidden).t()
    b = flat_b.view(t, inter) if b_major == "n" else flat_b.view(inter, t).t()
    w = torch.full((4, hidden, inter), float("nan"))
    grouped_gemm_wgrad(a, b, offsets, wgrad=w, wgrad_dtype=torch.float32,
                       input_order="tensor_ragged")
    for e in range(4):
        want = blocks_a[e].double() @ blocks_b[e].double().t()
        assert torch.allclose(w[e].double(), want, atol=1e-5), e


def test_ragged_tma_kernel_takes_only_calls_its_coordinates_reach():
    """Hopper's ragged TMA kernel: hidden and intermediate multiples of 8 on Hopper only, plans
    of at most 64 experts, and calls whose tokens_sum fits TMA's 32-bit extents (the others
    run the Triton kernel for every expert)."""
    from graphrt.ops.grouped_gemm import kernels_ragged as k
    assert k.fits_tokens(2**31 - 1) and not k.fits_tokens(2**31)
    assert not k.fits_ragged_tma_kernel(7168, 2048, 8, (8, 0))
    assert not k.fits_ragged_tma_kernel(7164, 2048, 8, (9, 0))
    assert not k.fits_ragged_tma_kernel(7168, 2048, 65, (9, 0))
    assert k.fits_ragged_tma_kernel(7168, 2048, 64, (9, 0)) == k.GLUON_API_OK


def test_ragged_tma_sorted_split_up_to_its_expert_limit():
    """The sorted split is the default up to 64 experts (slower above on the H200), and off
    everywhere when the config turns it off."""
    from graphrt.ops.grouped_gemm.kernels_ragged import RAGGED_TMA_CONFIG, RaggedTmaConfig
    assert RAGGED_TMA_CONFIG.sorts(1) and RAGGED_TMA_CONFIG.sorts(64)
    assert not RAGGED_TMA_CONFIG.sorts(65)
    assert not RaggedTmaConfig(sorted_experts=False).sorts(8)
    assert RaggedTmaConfig(sorted_max_experts=256).sorts(256)


@triton.jit
def _order_kernel(OFFSETS, ORDER, POSITIONS, experts, tokens_sum, rounds,
                  EXPERTS_POW2: tl.constexpr, CHUNK: tl.constexpr,
                  SHARE: tl.constexpr):
    """ORDER[r]: the expert of rank r; POSITIONS[round, program]: the snake's position."""
    idx = tl.arange(0, EXPERTS_POW2)
    ranks = _ranks_by_count(OFFSETS, idx, tl.arange(0, CHUNK), experts, tokens_sum, SHARE)
    program, programs = tl.program_id(0), tl.num_programs(0)
    if program == 0:
        for rank in range(0, experts):
            tl.store(ORDER + rank, _expert_at_rank(ranks, idx, rank))
    for round_ in range(0, rounds):
        tl.store(POSITIONS + round_ * programs + program, _snake(round_, program, programs))


@needs_interpreter
@pytest.mark.parametrize("share", ["every expert", "TMA first", "TMA left"])
@pytest.mark.parametrize("chunk", [2, 8])
@pytest.mark.parametrize("counts,bad_at", [([5, 0, 9, 9, 1, 30], None), ([7, 7, 7], None),
                                           ([0, 0, 0, 0, 4], None), ([3, 8, 2, 6, 6, 1, 4], 2),
                                           ([8, 16, 3, 5, 8, 0, 24], None),
                                           ([12], None), ("random 37", 20)])
def test_experts_ranked_by_count_interpreted(counts, bad_at, chunk, share):
    """The order a balanced persistent split walks experts in: by count, largest first, ties
    by index, an expert with bad bounds as empty, compared a chunk of experts at a time
    (chunks shorter and longer than the experts); for the ragged TMA kernel the experts it
    leaves (counts off multiples of 8) after the empty ones, and for the Triton kernel that
    runs after it those experts first, the TMA kernel's after; and the snake covers every
    position once."""
    from graphrt.ops.grouped_gemm.kernels import EVERY_EXPERT, TMA_FIRST, TMA_LEFT
    if counts == "random 37":   # ties and empty experts among more experts than a chunk
        counts = torch.randint(0, 6, (37,), generator=torch.Generator().manual_seed(3)).tolist()
    ends = list(itertools.accumulate(counts))
    if bad_at is not None:   # its end below its begin
        ends[bad_at] = ends[bad_at - 1] - 1
    offsets = torch.tensor(ends, dtype=torch.int32)
    order = torch.full((len(counts),), -1, dtype=torch.int32)
    programs, rounds = 5, 3
    positions = torch.full((rounds, programs), -1, dtype=torch.int32)
    _order_kernel[(programs,)](offsets, order, positions, len(counts), sum(counts), rounds,
                               EXPERTS_POW2=max(2, 1 << (len(counts) - 1).bit_length()),
                               CHUNK=chunk, SHARE={"every expert": EVERY_EXPERT,
                                                   "TMA first": TMA_FIRST,
                                                   "TMA left": TMA_LEFT}[share].value)
    begins = [0] + ends[:-1]
    valid = [0 <= begin <= end for begin, end in zip(begins, ends)]
    sizes = [end - begin if ok else 0 for begin, end, ok in zip(begins, ends, valid)]
    if share == "TMA first":
        sizes = [n if n % 8 == 0 else -1 for n in sizes]
    elif share == "TMA left":
        sizes = [-1 if n % 8 == 0 else n for n in sizes]
    assert order.tolist() == sorted(range(len(counts)), key=lambda e: (-sizes[e], e))
    assert sorted(positions.reshape(-1).tolist()) == list(range(rounds * programs))
    assert positions[1].tolist() == [2 * programs - 1 - p for p in range(programs)]


@pytest.mark.parametrize("trust", ["1", "0", None])
def test_the_gluon_gate_reads_the_triton_version_and_graphrt_trust_triton(trust):
    """Under a Triton the Gluon kernels were not tested with, they are off unless
    GRAPHRT_TRUST_TRITON=1 (read at import); in a fresh interpreter with the version set."""
    import os
    import subprocess
    import sys
    script = ("import triton; triton.__version__ = '3.1.0'\n"
              "import graphrt.kernel_utils as k; print(k.ON_TESTED_TRITON, k.TRITON_TRUSTED)")
    environment = {k: v for k, v in os.environ.items() if k != "GRAPHRT_TRUST_TRITON"}
    if trust is not None:
        environment["GRAPHRT_TRUST_TRITON"] = trust
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=environment, check=True)
    assert out.stdout.split() == [str(trust == "1")] * 2


@pytest.mark.parametrize("tested", [True, False])
def test_hopper_plans_say_once_when_this_triton_takes_the_portable_kernels(tested,
                                                                           monkeypatch):
    """A plan compiled for a Hopper GPU on a Triton its Gluon kernels were not tested with
    warns once (SlowerPathWarning) that it runs the portable kernels; on the tested one it
    says nothing. The contract's capability is set to 9.0 on the CPU."""
    import warnings

    import graphrt.plan as plan_module
    from graphrt import kernel_utils, notices
    monkeypatch.setattr(plan_module, "_facts_cache", {})
    monkeypatch.setattr(plan_module, "device_capability", lambda device: (9, 0))
    monkeypatch.setattr(kernel_utils, "ON_TESTED_TRITON", tested)
    monkeypatch.setattr(notices, "_said", set())
    a, b = torch.randn(24, 16, dtype=BF16).t(), torch.randn(16, 8, dtype=BF16)
    offsets = torch.tensor([7, 16], dtype=torch.int32)
    with env(GRAPHRT_BACKEND="triton"), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            GroupedGemmWgrad(a, b, offsets).compile()
            GroupedGemmWgrad(a, b, offsets, wgrad_dtype=torch.float32).compile()
    said = [str(w.message) for w in seen if issubclass(w.category, notices.SlowerPathWarning)]
    if tested:
        assert said == []
    else:
        assert len(said) == 1 and "grouped_gemm_wgrad" in said[0] and "3.6" in said[0]
