"""Sweep grouped-wgrad tile configs on the GPU (device machine): each checked against FP32
torch.mm per expert, then timed next to torch._grouped_mm. ``--fp8`` sweeps the FP8 kernels
(MXFP8 and FP32 scales per 128 tokens) next to the BF16 plan on the same shapes, and the
warp-specialized Gluon kernel (kernels_gluon.py) for 1x128 where it fits; ``--ragged``
(``--many``: 128 and 256 experts) times tensor_ragged inputs (per-expert blocks, tokens
unit-stride) with counts in multiples of 256, moved off multiples of 8 (``odd``: rows not
16-byte aligned) and equal: the Triton kernel with the rows' workspace (those experts copied
as rows first) against Hopper's TMA kernel;
``--layouts`` times tile configs on the tensor2d layouts (A M- or K-major, B N- or K-major) at
the E8 cases; ``--tensor2d-tma`` times every tensor2d layout, counts in multiples of 256 and
odd, through the Triton kernel against Hopper's tensor2d TMA kernel (kernels_tensor2d.py, the
plan's) per Tensor2dTmaConfig;
``--layout-configs`` (``--case I``: only CASES[I]) times Hopper's tensor2d TMA kernel on every
layout at x256 counts, each with the tiles, stages and tile orders of LAYOUT_TMA_CONFIGS, all
in turn as fractions of the plan's config on M-N;
``--leftovers`` times the plan's ragged launches (padded copy, TMA kernel, Triton kernel for the
experts the TMA kernel leaves) against the rows copy with the Triton kernel for the experts off
multiples of 8, and the TMA kernel alone;
``--rows`` times the copy of ragged experts as rows alone per RowsConfig, ``--padded`` the
padded copy alone per PaddedConfig; ``--discrete``
times dense against discrete output through the plan; ``--fp8-choice`` times the plan's 1x128
call with the Gluon kernel and with the Triton kernel in its place, in turn, at the benchmark
cases and shapes with 128-4096 tokens an expert (the Triton kernel was the faster below 2048
until the Gluon kernel read its items' bounds and scales ahead, 2026-12-06);
``--mx-values`` MXFP8 through the plan with and without the workspace for the codes' BF16
values; ``--first`` only the first benchmark case."""
import itertools
import sys

import torch

from graphrt.bench.timing import rotating, stream_time_us
from graphrt.bench.wgrad import (CASES, FP8_RECIPES, _fp8_operands, _operands, odd_counts,
                                  medians_in_turn, offsets_of, random_counts,
                                  call_workspace)
from graphrt.block_scaling import dequantize_blocks
from graphrt.device_checks import error_flags
from graphrt.ops import GroupedGemmWgrad
from graphrt.ops.grouped_gemm import kernels, kernels_gluon as gluon
from graphrt.ops.grouped_gemm import kernels_ragged as ragged_tma
from graphrt.ops.grouped_gemm import kernels_tensor2d as tensor2d_tma
from graphrt.ops.grouped_gemm.kernels import (gemm_config, GemmConfig, launch_ragged_rows,
                                              launch_wgrad, launch_wgrad_fp8, ragged_rows_bytes,
                                              ragged_rows_views, ROWS_CONFIG, RowsConfig)
from graphrt.ops.grouped_gemm.kernels_ragged import RAGGED_TMA_CONFIG, RaggedTmaConfig
from graphrt.ops.grouped_gemm.reference import expert_bounds

CONFIGS = [GemmConfig(*c) for c in [
    (128, 128, 64, 8, 3, 8), (128, 128, 64, 8, 4, 8), (128, 256, 64, 8, 3, 8),
    (256, 128, 64, 8, 3, 8), (128, 128, 64, 4, 4, 8), (128, 256, 64, 8, 4, 8),
    (64, 256, 64, 4, 4, 8)]]
FP8_CONFIGS = {
    32: [GemmConfig(*c) for c in [
        (128, 128, 64, 4, 3, 8), (128, 256, 64, 8, 3, 8), (128, 128, 128, 8, 3, 8),
        (64, 256, 64, 4, 3, 8), (128, 64, 128, 4, 3, 8)]],
    128: [GemmConfig(*c) for c in [
        (128, 64, 128, 4, 3, 8), (128, 64, 128, 4, 4, 8), (64, 128, 128, 4, 3, 8),
        (128, 128, 128, 8, 4, 8), (256, 64, 128, 8, 3, 8), (128, 64, 128, 4, 3, 8, 168)]]}
GLUON_CONFIGS = [gluon.GluonConfig(*c) for c in [(128, 6), (128, 5), (128, 4), (64, 6)]]
# the Triton kernel's tile for ragged inputs off Hopper (the plan's), and the TMA kernel's stages
RAGGED_CONFIG = gemm_config(False)
# (three stages would leave shared memory for a copy staged beside the product: 1.00-1.10x
# four stages' time on an H100, docs/perf/wgrad.md 2026-12-06)
RAGGED_TMA_CONFIGS = [RAGGED_TMA_CONFIG, RaggedTmaConfig(stages=3),
                      RaggedTmaConfig(sorted_experts=False),
                      RaggedTmaConfig(sorted_max_experts=1024)]
TENSOR2D_TMA_CONFIGS = [tensor2d_tma.TENSOR2D_TMA_CONFIG, tensor2d_tma.Tensor2dTmaConfig(128, 6),
                        tensor2d_tma.Tensor2dTmaConfig(sorted_experts=False)]
MANY_EXPERTS_CASES = [(128, 2048, 1024, 32768), (256, 2048, 1024, 65536)]
LAYOUT_TMA_CONFIGS = [tensor2d_tma.TENSOR2D_TMA_CONFIG] + [
    tensor2d_tma.Tensor2dTmaConfig(block_n=n, stages=s, group=g)
    for n, s, g in ((256, 3, 8), (256, 4, 4), (256, 3, 4))]
# the plan's copy first: (block_w, block_t, num_warps, programs_per_sm)
ROWS_CONFIGS = [ROWS_CONFIG] + [RowsConfig(*c) for c in [
    (64, 64, 4, 16), (64, 64, 4, 8), (64, 64, 8, 8), (64, 128, 8, 4), (128, 64, 8, 4),
    (32, 64, 4, 16), (64, 32, 4, 16)]]
# (config, the layouts it runs): the plan's tile on every layout, other tiles on M-N and K-K
ALL_LAYOUTS = (("M", "N"), ("K", "N"), ("K", "K"), ("M", "K"))
LAYOUT_CONFIGS = [
    (GemmConfig(128, 256, 64, 8, 3, 8), ALL_LAYOUTS),
    (GemmConfig(128, 256, 64, 8, 4, 8), (("M", "N"), ("K", "K"))),
    (GemmConfig(256, 128, 64, 8, 3, 8), (("M", "N"), ("K", "K"))),
    (GemmConfig(128, 256, 64, 8, 3, 4), (("M", "N"), ("K", "K")))]


def _case(experts, hidden, inter, tokens, gen):
    """(offsets, expert bounds, BF16 output, FLOPs) of a benchmark case at random counts."""
    counts = random_counts(experts, tokens, gen)
    offsets = offsets_of(counts)
    out = torch.empty(experts, hidden, inter, dtype=torch.bfloat16, device="cuda")
    return offsets, expert_bounds(offsets, tokens), out, 2.0 * hidden * inter * tokens


def _timed(name, run, sets, check, flops):
    try:
        run(*sets[0])
        err = check()
        us = stream_time_us(rotating(run, sets))
        print(f"  {name}: {us:.1f} us {flops / us / 1e6:.0f} TFLOP/s err={err:.1e}", flush=True)
    except Exception as e:   # a config that does not compile or fit: report, go on
        print(f"  {name}: failed {type(e).__name__}: {str(e)[:160]}", flush=True)


def main(fp8: bool, first: bool):
    gen = torch.Generator().manual_seed(0)
    errors = error_flags(torch.device("cuda", 0))
    for experts, hidden, inter, tokens in CASES[:1] if first else CASES:
        offsets, bounds, out, flops = _case(experts, hidden, inter, tokens, gen)
        sets = [(torch.randn(hidden, tokens, dtype=torch.bfloat16, device="cuda"),
                 torch.randn(inter, tokens, dtype=torch.bfloat16, device="cuda").t())
                for _ in range(2)]
        us = stream_time_us(rotating(lambda a, b: torch._grouped_mm(a, b, offs=offsets), sets))
        print(f"E={experts} {hidden}x{inter} tokens={tokens} K-major: torch._grouped_mm "
              f"{us:.1f} us {flops / us / 1e6:.0f} TFLOP/s", flush=True)

        def check_against(a_val, b_val):
            ref = torch.stack([a_val[:, s:e].float() @ b_val[s:e].float() for s, e in bounds])
            return lambda: ((out.float() - ref).norm() / ref.norm()).item()
        bf16_configs = CONFIGS[2:3] if fp8 else CONFIGS
        for cfg in bf16_configs:
            def run(a, b, cfg=cfg):
                launch_wgrad(cfg, a, b, offsets, out, None, torch.bfloat16, errors, hidden=hidden,
                             inter=inter, a_k_major=True, b_k_major=True, ragged=False,
                             accumulate=False, dot_fp32=False)
            _timed(f"bf16 {cfg}", run, sets, check_against(*sets[0]), flops)
        if not fp8:
            continue
        for name, scale_dtype, block in FP8_RECIPES:
            fsets = [_fp8_operands(tokens, hidden, inter, scale_dtype, block) for _ in range(2)]
            a, b, sa, sb = fsets[0]
            a_val = dequantize_blocks(a, sa, 1, block)
            b_val = dequantize_blocks(b, sb, 0, block)
            for cfg in FP8_CONFIGS[block]:
                def run(a, b, sa, sb, cfg=cfg):
                    launch_wgrad_fp8(cfg, a, b, sa, sb, offsets, out, None, torch.bfloat16,
                                     errors, hidden=hidden, inter=inter, accumulate=False,
                                     dot_fp32=False)
                _timed(f"{name} {cfg}", run, fsets, check_against(a_val, b_val), flops)
            if block == 128 and gluon.fits_gluon_kernel(a, b,
                                                        torch.cuda.get_device_capability()):
                for gcfg in GLUON_CONFIGS:
                    def run_gluon(a, b, sa, sb, gcfg=gcfg):
                        gluon.launch_wgrad_fp8_gluon(a, b, sa, sb, offsets, out, None,
                                                     torch.bfloat16, errors, hidden=hidden,
                                                     inter=inter, accumulate=False, config=gcfg)
                    _timed(f"{name} Gluon {gcfg}", run_gluon, fsets, check_against(a_val, b_val),
                           flops)
            del a_val, b_val


def _ragged_case(counts, operands, hidden, inter):
    """(offsets, FP32 reference) of ragged ``counts`` over ``operands`` (a K-major buffer and
    the transpose of one), the experts' blocks one after another."""
    offsets = offsets_of(counts)
    a_flat, b_flat = operands[0].reshape(-1), operands[1].t().reshape(-1)
    ref, begin = [], 0
    for n in counts:
        block_a = a_flat[hidden * begin:hidden * (begin + n)].view(hidden, n).float()
        block_b = b_flat[inter * begin:inter * (begin + n)].view(inter, n).float()
        ref.append(block_a @ block_b.t())
        begin += n
    return offsets, torch.stack(ref)


def main_ragged(first: bool, many: bool):
    """tensor_ragged at x256, odd and equal counts: the Triton kernel at the plan's tile with
    the rows workspace (the path off Hopper) against the TMA kernel (kernels_ragged.py, counts
    in multiples of 8) per RaggedTmaConfig followed by the Triton kernel for the other experts
    (the plan on Hopper), each checked, then timed in turn with torch._grouped_mm on tensor2d
    operands of the same counts. Where every count is a multiple of 8, also the TMA kernel
    alone (what the Triton kernel's launch with no work adds) and the tensor2d TMA kernel on
    the same buffers read as tensor2d K-K operands. ``many``: cases of 128 and 256 experts,
    where ranking the experts by count costs the most."""
    gen = torch.Generator().manual_seed(0)
    errors = error_flags(torch.device("cuda", 0))
    cases = MANY_EXPERTS_CASES if many else CASES[:1] if first else CASES
    for experts, hidden, inter, tokens in cases:
        aligned = random_counts(experts, tokens, gen)
        out = torch.empty(experts, hidden, inter, dtype=torch.bfloat16, device="cuda")
        flops = 2.0 * hidden * inter * tokens
        # K-major buffers holding the experts' blocks one after another (and, read as
        # tensor2d, torch._grouped_mm's K-major operands)
        sets = [(torch.randn(hidden, tokens, dtype=torch.bfloat16, device="cuda"),
                 torch.randn(inter, tokens, dtype=torch.bfloat16, device="cuda").t())
                for _ in range(2)]
        ws = torch.empty(ragged_rows_bytes(tokens, hidden, inter), dtype=torch.uint8,
                         device="cuda")
        # equal: every expert the same count, so that a static split of the work items over
        # the persistent TMA kernel's programs is balanced (the Triton kernel's programs are
        # placed by the hardware as SMs free up)
        equal = [tokens // experts] * experts
        for label, counts in (("x256", aligned), ("odd", odd_counts(aligned, gen)),
                              ("equal", equal)):
            offsets, ref = _ragged_case(counts, sets[0], hidden, inter)
            print(f"E={experts} {hidden}x{inter} tokens={tokens} tensor_ragged {label}",
                  flush=True)

            def triton_rows(a, b, offsets=offsets, skip_tma_taken=False):
                launch_wgrad(RAGGED_CONFIG, a, b, offsets, out, None, torch.bfloat16, errors,
                             hidden=hidden, inter=inter, a_k_major=True, b_k_major=True,
                             ragged=True, accumulate=False, dot_fp32=False, rows=ws,
                             skip_tma_taken=skip_tma_taken)
            runs = [("Triton 128 x 256, rows workspace", triton_rows)]
            for tcfg in RAGGED_TMA_CONFIGS:
                def tma(a, b, offsets=offsets, tcfg=tcfg):   # the plan's two launches
                    ragged_tma.launch_wgrad_ragged_tma(a, b, offsets, out, None, torch.bfloat16,
                                                       errors, hidden=hidden, inter=inter,
                                                       accumulate=False, config=tcfg)
                    triton_rows(a, b, offsets, skip_tma_taken=True)
                runs.append((f"TMA {tcfg}, then Triton", tma))
            if label != "odd":   # every expert is the TMA kernel's: what the Triton launch adds
                def tma_alone(a, b, offsets=offsets):
                    ragged_tma.launch_wgrad_ragged_tma(a, b, offsets, out, None, torch.bfloat16,
                                                       errors, hidden=hidden, inter=inter,
                                                       accumulate=False)
                runs.append(("TMA alone", tma_alone))
            for name, run in runs:
                _timed(name, run, sets,
                       lambda ref=ref: ((out.float() - ref).norm() / ref.norm()).item(), flops)
            if label != "odd":   # torch._grouped_mm takes counts in multiples of 8 only
                def tensor2d_kernel(a, b, offsets=offsets):   # the same buffers read as tensor2d
                    tensor2d_tma.launch_wgrad_tensor2d_tma(a, b, offsets, out, None,
                                                           torch.bfloat16, errors, hidden=hidden,
                                                           inter=inter, accumulate=False)
                runs.append(("tensor2d TMA kernel, K-K (tensor2d)", tensor2d_kernel))
                runs.append(("torch._grouped_mm (tensor2d)",
                             lambda a, b, offsets=offsets: torch._grouped_mm(a, b, offs=offsets)))
            _in_turn(runs, sets)


def _in_turn(runs, sets, rounds=5):
    """``runs`` ((name, run) pairs) timed in turn, median of ``rounds`` each, and each as a
    ratio of the first: timed one after another, the GPU's clock drift between them would
    read as a difference, in either direction."""
    times = {name: [] for name, _ in runs}
    for _ in range(rounds):
        for name, run in runs:
            times[name].append(stream_time_us(rotating(run, sets)))
    medians = {name: sorted(t)[rounds // 2] for name, t in times.items()}
    first = medians[runs[0][0]]
    print("  in turn: " + "; ".join(f"{name} {us:.1f} us ({us / first:.3f})"
                                    for name, us in medians.items()), flush=True)


# the copy by two-byte loads (the default before 2026-12-05)
TWO_BYTE_COPY = kernels.PaddedConfig(aligned_loads=False)


def main_leftovers(first: bool):
    """The plan's ragged launches on Hopper, x256 and odd counts, in turn: as the plan runs
    them (the padded copy read by the TMA kernel, RaggedTmaConfig.padded_odd), with the rows
    copy and the Triton kernel for the experts off multiples of 8 instead, with the copy by
    two-byte loads (TWO_BYTE_COPY), and (x256) the TMA kernel alone, each checked against
    FP32 per-expert products first; at odd counts also the rows copy and both padded copies
    alone, and the TMA kernel alone reading the padded copy."""
    gen = torch.Generator().manual_seed(0)
    errors = error_flags(torch.device("cuda", 0))
    for experts, hidden, inter, tokens in CASES[:1] if first else CASES:
        aligned = random_counts(experts, tokens, gen)
        out = torch.empty(experts, hidden, inter, dtype=torch.bfloat16, device="cuda")
        sets = [(torch.randn(hidden, tokens, dtype=torch.bfloat16, device="cuda"),
                 torch.randn(inter, tokens, dtype=torch.bfloat16, device="cuda").t())
                for _ in range(2)]
        ws = torch.empty(ragged_rows_bytes(tokens, hidden, inter), dtype=torch.uint8,
                         device="cuda")
        pad = kernels.ragged_padded_views(
            torch.empty(kernels.ragged_padded_bytes(tokens, experts, hidden, inter),
                        dtype=torch.uint8, device="cuda"), tokens, experts, hidden, inter)
        for label, counts in (("x256", aligned), ("odd", odd_counts(aligned, gen))):
            offsets, ref = _ragged_case(counts, sets[0], hidden, inter)
            print(f"E={experts} {hidden}x{inter} tokens={tokens} tensor_ragged {label}",
                  flush=True)

            def plan_launches(a, b, offsets=offsets, padded=False,
                              copy_config=kernels.PADDED_CONFIG):
                if padded:
                    kernels.launch_ragged_padded(copy_config, a, b, *pad, offsets, out, None,
                                                 torch.bfloat16, errors, hidden=hidden,
                                                 inter=inter, accumulate=False)
                ragged_tma.launch_wgrad_ragged_tma(a, b, offsets, out, None, torch.bfloat16,
                                                   errors, hidden=hidden, inter=inter,
                                                   accumulate=False,
                                                   padded=pad if padded else None)
                if not padded:
                    launch_wgrad(RAGGED_CONFIG, a, b, offsets, out, None, torch.bfloat16,
                                 errors, hidden=hidden, inter=inter, a_k_major=True,
                                 b_k_major=True, ragged=True, accumulate=False, dot_fp32=False,
                                 rows=ws, skip_tma_taken=True)
            runs = [("padded copy, TMA takes every expert (the plan's)",
                     lambda a, b, run=plan_launches: run(a, b, padded=True)),
                    ("rows copy, Triton kernel after TMA", plan_launches),
                    ("two-byte copy, then TMA", lambda a, b, run=plan_launches: run(
                        a, b, padded=True, copy_config=TWO_BYTE_COPY))]
            copies = [] if label != "odd" else [   # the copies alone, not checked here
                ("rows copy alone", lambda a, b, offsets=offsets: launch_ragged_rows(
                    ROWS_CONFIG, a, b, *ragged_rows_views(ws, tokens, hidden, inter), offsets,
                    hidden=hidden, inter=inter, skip_aligned=True)),
                ("padded copy alone", lambda a, b, offsets=offsets: kernels.launch_ragged_padded(
                    kernels.PADDED_CONFIG, a, b, *pad, offsets, out, None, torch.bfloat16,
                    errors, hidden=hidden, inter=inter, accumulate=False)),
                ("two-byte copy alone", lambda a, b, offsets=offsets:
                    kernels.launch_ragged_padded(TWO_BYTE_COPY, a, b, *pad, offsets, out, None,
                                                 torch.bfloat16, errors, hidden=hidden,
                                                 inter=inter, accumulate=False)),
                ("TMA alone on the padded copy", lambda a, b, offsets=offsets:
                 ragged_tma.launch_wgrad_ragged_tma(
                     a, b, offsets, out, None, torch.bfloat16, errors, hidden=hidden,
                     inter=inter, accumulate=False, padded=pad))]
            if label == "x256":
                runs.append(("TMA alone", lambda a, b, offsets=offsets:
                             ragged_tma.launch_wgrad_ragged_tma(
                                 a, b, offsets, out, None, torch.bfloat16, errors,
                                 hidden=hidden, inter=inter, accumulate=False)))
            for name, run in runs:
                out.fill_(float("nan"))
                run(*sets[0])
                err = ((out.float() - ref).norm() / ref.norm()).item()
                print(f"  {name}: err={err:.1e}", flush=True)
            _in_turn(runs + copies, sets)


def main_layouts(first: bool):
    gen = torch.Generator().manual_seed(0)
    errors = error_flags(torch.device("cuda", 0))
    cases = [c for c in CASES if c[0] == 8]
    for experts, hidden, inter, tokens in cases[:1] if first else cases:
        offsets, bounds, out, flops = _case(experts, hidden, inter, tokens, gen)
        print(f"E={experts} {hidden}x{inter} tokens={tokens} counts x256", flush=True)
        for a_major, b_major in ALL_LAYOUTS:
            sets = [_operands(tokens, hidden, inter, a_major.lower(), b_major.lower())
                    for _ in range(2)]
            a0, b0 = sets[0]
            ref = torch.stack([a0[:, s:e].float() @ b0[s:e].float() for s, e in bounds])

            def check(ref=ref):
                return ((out.float() - ref).norm() / ref.norm()).item()
            for cfg, layouts in LAYOUT_CONFIGS:
                if (a_major, b_major) not in layouts:
                    continue

                def run(a, b, cfg=cfg, a_k=a_major == "K", b_k=b_major == "K"):
                    launch_wgrad(cfg, a, b, offsets, out, None, torch.bfloat16, errors,
                                 hidden=hidden, inter=inter, a_k_major=a_k, b_k_major=b_k,
                                 ragged=False, accumulate=False, dot_fp32=False)
                _timed(f"{a_major}{b_major} {cfg}", run, sets, check, flops)
            del sets, ref


def main_rows(first: bool):
    """The copy of ragged experts off 16-byte rows (_ragged_rows_kernel) alone, per RowsConfig:
    odd counts (TB/s of its reads and writes against the 4.25 TB/s copy ceiling), and x256
    counts, where it copies nothing (the cost an aligned call pays)."""
    gen = torch.Generator().manual_seed(0)
    for experts, hidden, inter, tokens in CASES[:1] if first else CASES:
        aligned = random_counts(experts, tokens, gen)
        a = torch.randn(hidden, tokens, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(inter, tokens, dtype=torch.bfloat16, device="cuda")
        ws = torch.empty(ragged_rows_bytes(tokens, hidden, inter), dtype=torch.uint8,
                         device="cuda")
        a_rows, b_rows = ragged_rows_views(ws, tokens, hidden, inter)
        for label, counts in (("odd", odd_counts(aligned, gen)), ("x256", aligned)):
            offsets = offsets_of(counts)
            begins = [0] + list(itertools.accumulate(counts))[:-1]
            copied = sum(n for s0, n in zip(begins, counts)
                         if n and (n % 8 or s0 * hidden % 8 or s0 * inter % 8))
            moved = 2 * 2 * copied * (hidden + inter)
            print(f"E={experts} {hidden}x{inter} tokens={tokens} counts {label}: "
                  f"{copied} tokens to copy, {moved / 1e6:.0f} MB moved", flush=True)
            for cfg in ROWS_CONFIGS:
                def run(skip=True, cfg=cfg, offsets=offsets):
                    launch_ragged_rows(cfg, a, b, a_rows, b_rows, offsets, hidden=hidden,
                                       inter=inter, skip_aligned=skip)
                try:
                    ws.fill_(255)   # poison (NaN), then every expert copied and compared
                    run(skip=False)
                    a_flat, b_flat = a.reshape(-1), b.reshape(-1)
                    exact = all(
                        torch.equal(a_rows[s0:s0 + n], a_flat[hidden * s0:hidden * (s0 + n)]
                                    .view(hidden, n).t())
                        and torch.equal(b_rows[s0:s0 + n], b_flat[inter * s0:inter * (s0 + n)]
                                        .view(inter, n).t())
                        for s0, n in zip(begins, counts))
                    us = stream_time_us(run)
                    rate = f" {moved / us / 1e6:.2f} TB/s ({moved / us / 4.25e6:.2f} of copy)"
                    print(f"  {cfg}: {us:.1f} us{rate if moved else ''} exact={exact}",
                          flush=True)
                except Exception as e:
                    print(f"  {cfg}: failed {type(e).__name__}: {str(e)[:160]}", flush=True)


PADDED_CONFIGS = [kernels.PaddedConfig(*c) for c in [
    # two-byte loads
    (32, 256, 8, 4, False), (16, 256, 4, 8, False), (32, 512, 8, 4, False),
    (64, 256, 8, 2, False), (16, 512, 8, 4, False), (8, 512, 4, 8, False),
    (32, 128, 4, 8, False), (64, 128, 8, 4, False),
    # 8-byte words shifted into place, the loads pipelined ``stages`` items ahead
    # (programs an SM: what registers and shared memory let stay resident)
    (64, 256, 8, 2, True, 1), (64, 256, 8, 1, True, 3), (32, 256, 8, 2, True, 3),
    (32, 256, 4, 3, True, 2), (64, 512, 8, 1, True, 1), (32, 512, 8, 1, True, 2)]]


def main_padded(first: bool):
    """The padded copy of ragged experts off multiples of 8 tokens (_ragged_padded_kernel)
    alone at odd counts, per PaddedConfig: TB/s of its reads and writes against the 4.25 TB/s
    copy ceiling, each config's copy compared with the blocks first."""
    gen = torch.Generator().manual_seed(0)
    for experts, hidden, inter, tokens in CASES[:1] if first else CASES:
        counts = odd_counts(random_counts(experts, tokens, gen), gen)
        a = torch.randn(hidden, tokens, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(inter, tokens, dtype=torch.bfloat16, device="cuda")
        offsets = offsets_of(counts)
        # the copy's output argument (computed into only with offsets out of order)
        out = torch.empty(experts, hidden, inter, dtype=torch.bfloat16, device="cuda")
        errors = error_flags(a.device)
        ws = torch.empty(kernels.ragged_padded_bytes(tokens, experts, hidden, inter),
                         dtype=torch.uint8, device="cuda")
        a_pad, b_pad = kernels.ragged_padded_views(ws, tokens, experts, hidden, inter)
        begins = [0] + list(itertools.accumulate(counts))[:-1]
        copied = sum(n for n in counts if n % 8)
        moved = 2 * 2 * copied * (hidden + inter)
        print(f"E={experts} {hidden}x{inter} tokens={tokens} counts odd: {copied} tokens to "
              f"copy, {moved / 1e6:.0f} MB moved", flush=True)
        for cfg in PADDED_CONFIGS:
            def run(cfg=cfg):
                kernels.launch_ragged_padded(cfg, a, b, a_pad, b_pad, offsets, out, None,
                                             torch.bfloat16, errors, hidden=hidden,
                                             inter=inter, accumulate=False)
            try:
                ws.fill_(255)
                run()
                exact = True
                for e, (s0, n) in enumerate(zip(begins, counts)):
                    if n % 8:
                        slot, padded = (s0 // 64 + e) * 64, -(-n // 64) * 64
                        for pad, full, width in ((a_pad, a, hidden), (b_pad, b, inter)):
                            block = pad[width * slot:width * (slot + padded)].view(width, padded)
                            exact &= torch.equal(block[:, :n], full.reshape(-1)[
                                width * s0:width * (s0 + n)].view(width, n))
                us = stream_time_us(run, calls=20, repeats=7)
            except Exception as e:
                print(f"  {cfg}: failed {type(e).__name__}: {str(e)[:160]}", flush=True)
                continue
            print(f"  {cfg}: {us:.1f} us {moved / us / 1e6:.2f} TB/s "
                  f"({moved / us / 4.25e6:.2f} of copy) exact={exact}", flush=True)


def main_tensor2d_tma(first: bool):
    gen = torch.Generator().manual_seed(0)
    errors = error_flags(torch.device("cuda", 0))
    for experts, hidden, inter, tokens in CASES[:1] if first else CASES:
        aligned = random_counts(experts, tokens, gen)
        odd = odd_counts(aligned, gen)
        out = torch.empty(experts, hidden, inter, dtype=torch.bfloat16, device="cuda")
        flops = 2.0 * hidden * inter * tokens
        for a_major, b_major in ALL_LAYOUTS:
            a_k, b_k = a_major == "K", b_major == "K"
            sets = [_operands(tokens, hidden, inter, a_major.lower(), b_major.lower())
                    for _ in range(2)]
            for label, counts in (("x256", aligned), ("odd", odd)):
                offsets = offsets_of(counts)
                a0, b0 = sets[0]
                ref = torch.stack([a0[:, s:e].float() @ b0[s:e].float()
                                   for s, e in expert_bounds(offsets, tokens)])
                print(f"E={experts} {hidden}x{inter} tokens={tokens} {a_major}-{b_major} {label}",
                      flush=True)

                def triton(a, b, offsets=offsets, a_k=a_k, b_k=b_k):
                    launch_wgrad(RAGGED_CONFIG, a, b, offsets, out, None, torch.bfloat16,
                                 errors, hidden=hidden, inter=inter, a_k_major=a_k,
                                 b_k_major=b_k, ragged=False, accumulate=False, dot_fp32=False)
                runs = [("Triton kernel", triton)]
                for tcfg in TENSOR2D_TMA_CONFIGS:
                    def tma(a, b, offsets=offsets, tcfg=tcfg):
                        tensor2d_tma.launch_wgrad_tensor2d_tma(
                            a, b, offsets, out, None, torch.bfloat16, errors, hidden=hidden,
                            inter=inter, accumulate=False, config=tcfg)
                    runs.append((f"tensor2d TMA {tcfg}", tma))
                for name, run in runs:
                    out.fill_(float("nan"))   # an expert left unwritten reads as err=nan
                    _timed(name, run, sets,
                           lambda ref=ref: ((out.float() - ref).norm() / ref.norm()).item(),
                           flops)
                _in_turn(runs, sets)
                del ref
            del sets


def main_layout_configs(case):
    """Hopper's tensor2d TMA kernel launched directly on every layout with each of
    LAYOUT_TMA_CONFIGS at x256 counts (CASES, or CASES[case] alone): each first checked
    against FP32 per expert with the output NaN-poisoned, then all timed in turn."""
    gen = torch.Generator().manual_seed(0)
    for experts, hidden, inter, tokens in CASES if case is None else CASES[case:case + 1]:
        offsets, bounds, out, _ = _case(experts, hidden, inter, tokens, gen)
        errors = error_flags(offsets.device)
        print(f"E={experts} {hidden}x{inter} tokens={tokens} x256, in turn, us", flush=True)
        runs = {}
        for a_major, b_major in ALL_LAYOUTS:
            sets = [_operands(tokens, hidden, inter, a_major.lower(), b_major.lower())
                    for _ in range(2)]
            a0, b0 = sets[0]
            ref = torch.stack([a0[:, s:e].float() @ b0[s:e].float() for s, e in bounds])
            for tcfg in LAYOUT_TMA_CONFIGS:
                def tma(a, b, tcfg=tcfg):
                    tensor2d_tma.launch_wgrad_tensor2d_tma(
                        a, b, offsets, out, None, torch.bfloat16, errors, hidden=hidden,
                        inter=inter, accumulate=False, config=tcfg)
                name = f"{a_major}-{b_major} n{tcfg.block_n} s{tcfg.stages} g{tcfg.group}"
                out.fill_(float("nan"))   # an expert left unwritten reads as err=nan
                tma(a0, b0)
                print(f"  {name}: err={((out.float() - ref).norm() / ref.norm()).item():.1e}",
                      flush=True)
                runs[name] = rotating(tma, sets)
            del ref
        medians = medians_in_turn(runs)
        first = next(iter(medians.values()))
        for name, us in medians.items():
            print(f"  {name}: {us:.1f} ({first / us:.3f} of the first)", flush=True)
        del runs, sets


def main_discrete():
    """Dense against discrete output through the plan (K-K and M-N tensor2d, ragged; x256
    counts), timed in turn: pointers 16-byte aligned (16-byte stores) and 8 bytes off (stores
    of 2 bytes)."""
    gen = torch.Generator().manual_seed(0)
    for experts, hidden, inter, tokens in CASES:
        offsets, _, out, _ = _case(experts, hidden, inter, tokens, gen)
        size = hidden * inter
        spread = torch.empty(experts * size + 8, dtype=torch.bfloat16, device="cuda")
        shifted = torch.tensor([spread.data_ptr() + 8 + 2 * size * e for e in range(experts)],
                               dtype=torch.int64, device="cuda")
        aligned = torch.tensor([w.data_ptr() for w in out], dtype=torch.int64, device="cuda")
        for order, a_major, b_major in (("tensor2d", "k", "k"), ("tensor2d", "m", "n"),
                                        ("tensor_ragged", "k", "k")):
            sets = [_operands(tokens, hidden, inter, a_major, b_major) for _ in range(2)]
            dense = GroupedGemmWgrad(sets[0][0], sets[0][1], offsets,
                                     input_order=order).compile()
            discrete = GroupedGemmWgrad(sets[0][0], sets[0][1], offsets, input_order=order,
                                        output_mode="discrete").compile()
            ws = call_workspace(dense, tokens)
            print(f"E={experts} {hidden}x{inter} tokens={tokens} {order} A {a_major} B {b_major}",
                  flush=True)
            _in_turn([("dense", lambda a, b: dense.execute(a, b, offsets, wgrad=out,
                                                           workspace=ws)),
                      ("discrete, aligned", lambda a, b: discrete.execute(
                          a, b, offsets, wgrad_ptrs=aligned, workspace=ws)),
                      ("discrete, 8 bytes off", lambda a, b: discrete.execute(
                          a, b, offsets, wgrad_ptrs=shifted, workspace=ws))], sets)
            del sets


def main_mx_values():
    """MXFP8 through the plan with the workspace for the codes' BF16 values (the values pass,
    then the tensor2d TMA kernel) and without it (the values made inside the product), next
    to BF16 K-K through the plan, x256 and odd counts, timed in turn; and the values pass alone
    against the copy ceiling (4.25 TB/s)."""
    from graphrt.ops.grouped_gemm.kernels_mx_values import launch_mx_values, mx_values_views
    gen = torch.Generator().manual_seed(0)
    for experts, hidden, inter, tokens in CASES:
        aligned = random_counts(experts, tokens, gen)
        for counts_name, counts in (("x256", aligned), ("odd", odd_counts(aligned, gen))):
            offsets = offsets_of(counts)
            out = torch.empty(experts, hidden, inter, dtype=torch.bfloat16, device="cuda")
            mx_sets = [_fp8_operands(tokens, hidden, inter, torch.uint8, 32) for _ in range(2)]
            bf_sets = [_operands(tokens, hidden, inter, "k", "k") for _ in range(2)]
            a, b, sa, sb = mx_sets[0]
            mx = GroupedGemmWgrad(a, b, offsets, a_scale=sa, b_scale=sb).compile()
            bf = GroupedGemmWgrad(*bf_sets[0], offsets).compile()
            ws = call_workspace(mx, tokens)
            print(f"E={experts} {hidden}x{inter} tokens={tokens} counts {counts_name}: "
                  f"workspace {ws.numel() / 2**20:.0f} MiB", flush=True)
            a_values, b_values = mx_values_views(ws, tokens, hidden, inter)

            def mx_run(i, workspace):
                a, b, sa, sb = mx_sets[i]
                mx.execute(a, b, offsets, a_scale=sa, b_scale=sb, wgrad=out, workspace=workspace)

            def values_pass(i):
                launch_mx_values(*mx_sets[i], a_values, b_values)

            moved = (hidden + inter) * tokens * 3 + (hidden + inter) * (tokens // 32)
            us = stream_time_us(rotating(values_pass, [(0,), (1,)]))
            print(f"  values pass alone: {us:.1f} us, {moved / us / 1e6:.2f} TB/s "
                  f"({moved / us / 1e6 / 4.25:.2f} of the copy ceiling)", flush=True)
            _in_turn([("BF16 K-K", lambda i: bf.execute(*bf_sets[i], offsets, wgrad=out)),
                      ("MXFP8, values workspace", lambda i: mx_run(i, ws)),
                      ("MXFP8, no workspace", lambda i: mx_run(i, None))], [(0,), (1,)])


# (experts, hidden, intermediate, tokens): the benchmark cases, then fewer tokens per expert
FP8_CHOICE_CASES = [*CASES, (8, 2048, 1024, 4096), (8, 2048, 1024, 16384),
                    (8, 2048, 1024, 32768), (32, 2048, 1024, 32768), (8, 7168, 2048, 8192),
                    (16, 4096, 1536, 16384), (32, 4096, 1536, 32768), (64, 2048, 1024, 65536),
                    (8, 2048, 1024, 2048), (32, 2048, 1024, 8192), (64, 2048, 1024, 8192)]


def main_fp8_choice():
    """The plan's 1x128 calls, x256 counts: the Gluon kernel against the Triton kernel, beside
    the BF16 K-K plan on the same shapes, in turn."""
    gen = torch.Generator().manual_seed(0)
    for experts, hidden, inter, tokens in FP8_CHOICE_CASES:
        offsets, bounds, out, flops = _case(experts, hidden, inter, tokens, gen)
        fsets = [_fp8_operands(tokens, hidden, inter, torch.float32, 128) for _ in range(2)]
        bsets = [_operands(tokens, hidden, inter, "k", "k") for _ in range(2)]
        a, b, sa, sb = fsets[0]
        gluon_plan = GroupedGemmWgrad(a, b, offsets, a_scale=sa, b_scale=sb).compile()
        triton_plan = GroupedGemmWgrad(a, b, offsets, a_scale=sa, b_scale=sb).compile()
        triton_plan.gluon = None
        bf16_plan = GroupedGemmWgrad(*bsets[0], offsets).compile()
        a_val, b_val = dequantize_blocks(a, sa, 1, 128), dequantize_blocks(b, sb, 0, 128)
        ref = torch.stack([a_val[:, s:e].double() @ b_val[s:e].double() for s, e in bounds])
        print(f"E={experts} {hidden}x{inter} tokens={tokens} ({tokens // experts} a expert)",
              flush=True)
        for name, plan in (("Gluon", gluon_plan), ("Triton", triton_plan)):
            out.fill_(float("nan"))
            plan.execute(a, b, offsets, a_scale=sa, b_scale=sb, wgrad=out)
            err = ((out.double() - ref).norm() / ref.norm()).item()
            print(f"  {name} err={err:.1e}", flush=True)
        del a_val, b_val, ref

        def fp8(i, plan):
            a, b, sa, sb = fsets[i]
            plan.execute(a, b, offsets, a_scale=sa, b_scale=sb, wgrad=out)
        _in_turn([("bf16 K-K", lambda i: bf16_plan.execute(*bsets[i], offsets, wgrad=out)),
                  ("1x128 Gluon", lambda i: fp8(i, gluon_plan)),
                  ("1x128 Triton", lambda i: fp8(i, triton_plan))], [(0,), (1,)])


if __name__ == "__main__":
    if "--fp8-choice" in sys.argv[1:]:
        main_fp8_choice()
    elif "--mx-values" in sys.argv[1:]:
        main_mx_values()
    elif "--discrete" in sys.argv[1:]:
        main_discrete()
    elif "--layout-configs" in sys.argv[1:]:
        args = sys.argv[1:]
        main_layout_configs(int(args[args.index("--case") + 1]) if "--case" in args else None)
    elif "--leftovers" in sys.argv[1:]:
        main_leftovers("--first" in sys.argv[1:])
    elif "--padded" in sys.argv[1:]:
        main_padded("--first" in sys.argv[1:])
    elif "--rows" in sys.argv[1:]:
        main_rows("--first" in sys.argv[1:])
    elif "--layouts" in sys.argv[1:]:
        main_layouts("--first" in sys.argv[1:])
    elif "--tensor2d-tma" in sys.argv[1:]:
        main_tensor2d_tma("--first" in sys.argv[1:])
    elif "--ragged" in sys.argv[1:]:
        main_ragged("--first" in sys.argv[1:], "--many" in sys.argv[1:])
    else:
        main("--fp8" in sys.argv[1:], "--first" in sys.argv[1:])
