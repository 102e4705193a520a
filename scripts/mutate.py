"""Mutation check: apply small, realistic bugs one at a time, run the tests that should catch
each, and report any that the tests let through. Runs on the CPU (the Triton interpreter runs
the kernels); the source tree is restored after every mutation, also on Ctrl-C.

    python scripts/mutate.py            # all mutations
    python scripts/mutate.py hstu mhc   # those whose name starts with one of these

Exit code 0 when every mutation made at least one test fail. Mutations only a GPU can see
(capture paths) are left to the GPU tests.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# name, file, text to replace, replacement, pytest arguments (tests that must catch it)
MUTATIONS = [
    ("rmsnorm-fwd-rows-eps", "graphrt/ops/rmsnorm/kernels.py",
     "rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HIDDEN + eps)",
     "rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / HIDDEN)",
     ["tests/ops/test_rmsnorm.py", "-k", "interpreted"]),
    ("rmsnorm-fwd-chunked-eps", "graphrt/ops/rmsnorm/kernels.py",
     "rstd = 1.0 / tl.sqrt(tl.sum(sum_sq, axis=0) / HIDDEN + eps)",
     "rstd = 1.0 / tl.sqrt(tl.sum(sum_sq, axis=0) / HIDDEN)",
     ["tests/ops/test_rmsnorm.py", "-k", "interpreted"]),
    ("rmsnorm-bwd-chunked-rstd", "graphrt/ops/rmsnorm/kernels.py",
     "dx = rstd * (g * w - xhat * mean_wgx)", "dx = (g * w - xhat * mean_wgx)",
     ["tests/ops/test_rmsnorm.py", "-k", "interpreted"]),
    ("hstu-fwd-eps", "graphrt/ops/hstu/kernels.py",
     "rstd = tl.math.rsqrt(var + eps)", "rstd = tl.math.rsqrt(var)",
     ["tests/ops/test_hstu.py", "-k", "interpreted"]),
    ("hstu-fwd-one-pass-variance", "graphrt/ops/hstu/kernels.py",
     "var = tl.sum(centered * centered, axis=1) / D",
     "var = tl.maximum(tl.sum(x * x, axis=1) / D - mean * mean, 0.0)",
     ["tests/ops/test_hstu.py", "-k", "interpreted"]),
    ("hstu-nn-dx-du-swapped", "graphrt/nn/hstu.py",
     "return dx, du, dweight if", "return du, dx, dweight if",
     ["tests/ops/test_hstu.py", "-k", "module"]),
    ("hstu-nn-backward-dropout-ratio", "graphrt/nn/hstu.py",
     "mask if ctx.p > 0 else None, ctx.p, f[", "mask if ctx.p > 0 else None, ctx.p / 2, f[",
     ["tests/ops/test_hstu.py", "-k", "module"]),
    ("hstu-dbias-wrong-partial-rows", "graphrt/ops/hstu/kernels.py",
     "sum_partials_in_groups(partial[programs * d:], [dbias], programs)",
     "sum_partials_in_groups(partial, [dbias], programs)",
     ["tests/ops/test_hstu.py", "-k", "interpreted or compute_dweight"]),
    ("hstu-finish-dbias-wrong-partial-rows", "graphrt/ops/hstu/kernels.py",
     "finish_in_groups(PARTIAL + programs.to(tl.int64) * D, COUNTERS, DB, DB,",
     "finish_in_groups(PARTIAL, COUNTERS, DB, DB,",
     ["tests/ops/test_hstu.py", "-k", "one_launch or compute_dweight"]),
    ("reduction-group-counter-left-set", "graphrt/reduction.py",
     "        tl.atomic_xchg(COUNTERS + group, 0, sem=\"relaxed\", scope=\"gpu\")\n", "",
     ["tests/ops/test_hstu.py", "-k", "one_launch"]),
    ("reduction-second-launch-order", "graphrt/reduction.py",
     "total += tl.sum(tl.where(groups[:, None] == g, sums, 0.0), axis=0)",
     "total += tl.sum(tl.where(groups[:, None] == n_groups - 1 - g, sums, 0.0), axis=0)",
     ["tests/test_reduction.py"]),
    ("reduction-finish-last-group-full", "graphrt/reduction.py",
     "size = tl.minimum(n_parts - group * PARTS_PER_GROUP, PARTS_PER_GROUP)",
     "size = PARTS_PER_GROUP + 0 * n_parts",
     ["tests/test_reduction.py"]),
    ("runtime-bound-call-counters-at-workspace", "graphrt/runtime.py",
     'return "w" if slot == self.n_inputs + made else "c"', 'return "w"',
     ["tests/test_binding.py", "-k", "fresh_outputs_and_workspace"]),
    ("runtime-kept-workspace-under-capture", "graphrt/runtime.py",
     '"        if _kept.reclaimed or _holding():"', '"        if _kept.reclaimed:"',
     ["tests/test_binding.py", "-k", "fresh_outputs_and_workspace"]),
    ("runtime-kept-workspace-used-after-taken-back", "graphrt/runtime.py",
     '"        if _kept.reclaimed or _holding():"', '"        if _holding():"',
     ["tests/test_binding.py", "-k", "takes_its_kept"]),
    ("arena-kept-regions-never-taken-back", "graphrt/arena/workspace.py",
     "if index is None and not kept and self._kept_bytes and self._reclaim_kept():",
     "if False:", ["tests/test_core.py", "-k", "takes_back"]),
    ("arena-kept-region-taken-back-while-in-use", "graphrt/arena/workspace.py",
     "                if region.users:", "                if False:",
     ["tests/test_core.py", "tests/test_binding.py", "-k", "takes_back or takes_its_kept"]),
    ("adamw-recent-call-skips-the-guard", "graphrt/ops/adamw/plan.py",
     " or not self._guard(*flat):", ":",
     ["tests/ops/test_adamw.py", "-k", "recent"]),
    ("adamw-recent-call-takes-any-float-lr", "graphrt/ops/adamw/plan.py",
     "elif type(lr) is not float or not 0.0 <= lr < math.inf:", "elif type(lr) is not float:",
     ["tests/ops/test_adamw.py", "-k", "recent"]),
    ("adamw-recent-call-under-capture", "graphrt/ops/adamw/plan.py",
     "                or torch._C._cuda_isCurrentStreamCapturing():", "                :",
     ["tests/ops/test_adamw.py", "-k", "recent"]),
    ("adamw-server-kept-on-the-cpu", "graphrt/ops/adamw/plan.py",
     '    return device.type == "cuda"', "    return True",
     ["tests/ops/test_adamw.py", "-k", "keep_no_server"]),
    ("runtime-recent-plan-kept-twice", "graphrt/runtime.py",
     "if not any(kept is plan for kept, _, _ in recent):", "if True:",
     ["tests/ops/test_adamw.py", "-k", "few_kinds"]),
    ("adamw-one-server-per-plan", "graphrt/ops/adamw/plan.py",
     "self._servers = (server, *servers[:RECENT_KINDS - 1])", "self._servers = (server,)",
     ["tests/ops/test_adamw.py", "-k", "few_kinds"]),
    ("adamw-prepared-launch-lr-misplaced", "graphrt/ops/adamw/kernels.py",
     "_FLOAT_LR = 5 ", "_FLOAT_LR = 6 ", ["tests/ops/test_adamw.py", "-k", "prepared"]),
    ("runtime-one-recent-plan-per-class", "graphrt/runtime.py",
     "*recent[:RECENT_PLANS - 1])", ")", ["tests/ops/test_adamw.py", "-k", "few_kinds"]),
    ("arena-kept-region-in-a-hold", "graphrt/arena/workspace.py",
     "or self._active_hold() is not None):", "):",
     ["tests/test_core.py", "-k", "kept"]),
    ("arena-kept-bytes-not-given-back", "graphrt/arena/workspace.py",
     "self._kept_bytes -= r.end - r.start", "pass",
     ["tests/test_core.py", "-k", "kept"]),
    ("arena-kept-regions-at-the-bottom", "graphrt/arena/workspace.py",
     "self._last_fit(nbytes) if kept else self._first_fit(nbytes)", "self._first_fit(nbytes)",
     ["tests/test_core.py", "-k", "kept"]),
    ("arena-kept-regions-in-use", "graphrt/arena/workspace.py",
     "if end > self._high_water and not kept:", "if end > self._high_water:",
     ["tests/test_core.py", "-k", "kept"]),
    ("arena-counters-shared-by-regions", "graphrt/arena/workspace.py",
     "first = offset // ALIGNMENT", "first = 0",
     ["tests/test_core.py", "-k", "counters"]),
    ("mhc-dweight-low-half", "graphrt/ops/mhc/kernels.py",
     "acc = acc_hi + acc_lo", "acc = acc_hi",
     ["tests/ops/test_mhc.py", "-k", "interpreted"]),
    ("mhc-rms-term", "graphrt/ops/mhc/kernels.py",
     "rms_term = gr / (r * K)", "rms_term = gr * 0.0",
     ["tests/ops/test_mhc.py", "-k", "interpreted"]),
    ("wgrad-offsets-trusted", "graphrt/ops/grouped_gemm/kernels.py",
     "return begin, tl.where(valid, end - begin, 0)", "return begin, end - begin",
     ["tests/ops/test_grouped_gemm.py", "-k", "bad_offsets"]),
    ("wgrad-short-last-group", "graphrt/ops/grouped_gemm/kernels.py",
     "rows_in_group = tl.where(left < GROUP_M, left, GROUP_M)", "rows_in_group = GROUP_M",
     ["tests/ops/test_grouped_gemm.py", "-k", "interpreted"]),
    ("wgrad-ragged-skips-every-expert", "graphrt/ops/grouped_gemm/kernels.py",
     "        counts = tl.where(_tma_takes(counts) | ODD_TAKEN, -1, counts)",
     "        counts = tl.where(_tma_takes(counts) | True, -1, counts)",
     ["tests/ops/test_grouped_gemm.py", "-k", "leaves_the_tma_experts"]),
    ("wgrad-discrete-unaligned-misplaced", "graphrt/ops/grouped_gemm/kernels.py",
     "            _store_at(acc, out, m, n, HIDDEN, INTER, ACCUMULATE, OUT_DTYPE, False)",
     "            _store_at(acc, out + 1, m, n, HIDDEN, INTER, ACCUMULATE, OUT_DTYPE, False)",
     ["tests/ops/test_grouped_gemm.py", "-k", "discrete_outputs_aligned"]),
    ("wgrad-mx-values-b-scales-transposed", "graphrt/ops/grouped_gemm/kernels_mx_values.py",
     "tokens_sum, out_stride, s_bn, s_bk, CODES_8, BLOCK_R, BLOCK_T)",
     "tokens_sum, out_stride, s_bk, s_bn, CODES_8, BLOCK_R, BLOCK_T)",
     ["tests/ops/test_grouped_gemm_fp8.py", "-k", "mx_values_pass_interpreted"]),
    ("wgrad-fp8-shared-block-unmasked", "graphrt/ops/grouped_gemm/kernels.py",
     "    if EDGE:\n", "    if False:\n",
     ["tests/ops/test_grouped_gemm_fp8.py", "-k", "interpreted"]),
    ("wgrad-mx-tail-takes-head-scale", "graphrt/ops/grouped_gemm/kernels.py",
     "kb = tl.where(two == 0, begin // MX_BLOCK, last_full // MX_BLOCK)",
     "kb = tl.where(two == 0, begin // MX_BLOCK, begin // MX_BLOCK)",
     ["tests/ops/test_grouped_gemm_fp8.py", "-k", "interpreted"]),
    ("wgrad-mx-head-takes-neighbour-tokens", "graphrt/ops/grouped_gemm/kernels.py",
     "k_mask = ((head & (kk >= begin) & (kk < head_end)) |",
     "k_mask = ((head & (kk < head_end)) |",
     ["tests/ops/test_grouped_gemm_fp8.py", "-k", "interpreted"]),
    ("wgrad-ragged-aligned-stride", "graphrt/ops/grouped_gemm/kernels.py",
     "n_mask, rows, 1, 1, rows, DOT_FP32", "n_mask, rows + 8, 1, 1, rows, DOT_FP32",
     ["tests/ops/test_grouped_gemm.py", "-k", "ragged_aligned"]),
    ("wgrad-padded-slots-overlap", "graphrt/ops/grouped_gemm/kernels.py",
     "    return (begin // PAD_TOKENS + expert) * PAD_TOKENS",
     "    return begin // PAD_TOKENS * PAD_TOKENS",
     ["tests/ops/test_grouped_gemm.py", "-k", "padded_copy_interpreted"]),
    ("wgrad-no-host-check", "graphrt/ops/grouped_gemm/spec.py",
     "        check_offsets_on_host(offsets, a.shape[1])", "        pass",
     ["tests/ops/test_grouped_gemm.py", "-k", "bad_offsets"]),
    ("adamw-many-block-offset", "graphrt/ops/adamw/kernels.py",
     "first = tl.load(BLOCK_ENDS + lo - 1, mask=lo > 0, other=0)",
     "first = tl.load(BLOCK_ENDS + lo, mask=lo > 0, other=0)",
     ["tests/ops/test_adamw.py", "-k", "many_tensor"]),
    ("adamw-many-overlap-allowed", "graphrt/ops/adamw/plan.py",
     "            if _spans_disjoint(rows):", "            if True:",
     ["tests/ops/test_adamw.py", "-k", "overlapping"]),
    ("adamw-key-ignores-contiguity", "graphrt/ops/adamw/plan.py",
     ", tuple(map(_Tensor.is_contiguous, flat)))", ")",
     ["tests/ops/test_adamw.py", "-k", "cached_checks"]),
    ("arena-scopes-shared-by-threads", "graphrt/arena/workspace.py",
     "self._local = threading.local()", "self._local = type('Shared', (), {})()",
     ["tests/test_core.py", "-k", "arena"]),
    ("arena-finalizer-releases-at-once", "graphrt/arena/workspace.py",
     "self.arena._release_soon(self.regions)", "self.arena._release(self.regions)",
     ["tests/test_core.py", "-k", "garbage_collector"]),
    ("execute-swallows-keywords", "graphrt/ops/hstu/plan.py",
     "mask=None, workspace=None, stream=None) -> None:",
     "mask=None, workspace=None, stream=None, **_) -> None:",
     ["tests/test_errors.py", "-k", "misspelt"]),
    ("binding-replay-skips-overlap", "graphrt/binding.py",
     "                if lo < other_hi and other_lo < hi:",
     "                if False:",
     ["tests/test_binding.py"]),
    ("call-matcher-ignores-alignment", "graphrt/binding.py",
     '''        lines += [f"    if {low}:", "        return None"]''',
     '''        lines += ["    if False:", "        return None"]''',
     ["tests/test_binding.py"]),
    ("call-matcher-floats-by-value", "graphrt/binding.py",
     '''f"v[{i}].hex() != {expected.hex()!r}" if kind is float''',
     '''f"v[{i}] != _e{i}" if kind is float''',
     ["tests/test_binding.py"]),
    ("binding-overlap-check-kept-forever", "graphrt/binding.py",
     "        if addresses != self._checked:",
     "        if self._checked is None:",
     ["tests/test_binding.py"]),
    ("binding-address-offset-dropped", "graphrt/binding.py",
     '''args[i] = f"addresses[{index}]" + (f" + {offset}" if offset else "")''',
     '''args[i] = f"addresses[{index}]"''',
     ["tests/test_binding.py"]),
    ("binding-descriptor-offset-dropped", "graphrt/binding.py",
     "descriptor.base = _Pointer(addresses[self.index] + self.offset)",
     "descriptor.base = _Pointer(addresses[self.index])",
     ["tests/test_binding.py"]),
    ("binding-any-foreign-address-kept", "graphrt/binding.py",
     "                        if not _persistent_address(a):",
     "                        if False:",
     ["tests/test_binding.py"]),
    ("scratch-launch-slot-shifted", "graphrt/kernel_utils.py",
     "slot = 11 if packed else 7", "slot = 12 if packed else 8",
     ["tests/test_binding.py"]),
    ("scratch-kept-under-capture", "graphrt/kernel_utils.py",
     "            if capturing():", "            if False:",
     ["tests/test_binding.py", "-k", "direct_c_launch"]),
    ("wgrad-padded-copy-leaves-odd-experts", "graphrt/ops/grouped_gemm/kernels.py",
     "    if in_order == 0:\n        _odd_experts_computed(",
     "    if in_order == 2:\n        _odd_experts_computed(",
     ["tests/ops/test_grouped_gemm.py", "-k", "ragged_padded_copy_interpreted"]),
    ("bound-call-ignores-output-alignment", "graphrt/runtime.py",
     '''            lines += [f"    if {low}:", "        return None"]''',
     "            pass",
     ["tests/test_binding.py"]),
    ("binding-records-after-a-copy", "graphrt/binding.py",
     "            self.recording.complete = False",
     "            pass",
     ["tests/test_binding.py"]),
    ("cute-launch-storage-shared-by-threads", "graphrt/cute_launch.py",
     "storage = getattr(self._local, \"storage\", None) or self._storage()",
     "storage = getattr(self, \"_shared\", None) or setattr(self, \"_shared\", "
     "self._storage()) or self._shared",
     ["tests/test_cute_launch.py"]),
    ("cute-launch-packing-unchecked", "graphrt/cute_launch.py",
     "        if _STORAGE[kind].from_address(address).value != want:",
     "        if False:",
     ["tests/test_cute_launch.py"]),
    ("hopper-module-import-error-silent", "graphrt/plan.py",
     "        if not _not_installed(err):", "        if False:",
     ["tests/test_errors.py", "-k", "hopper_module"]),
]


def run_one(name, path, old, new, test_args) -> bool:
    """True when the tests caught the mutation."""
    file = ROOT / path
    source = file.read_text()
    if source.count(old) != 1:
        print(f"  {name}: the text to mutate is not found once in {path}; update the list")
        return False
    file.write_text(source.replace(old, new))
    try:
        env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONDONTWRITEBYTECODE": "1"}
        res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                              *test_args], cwd=ROOT, capture_output=True, text=True, env=env)
    finally:
        file.write_text(source)
    return res.returncode != 0


def main(argv: list[str]) -> int:
    chosen = [m for m in MUTATIONS if not argv or any(m[0].startswith(a) for a in argv)]
    missed = []
    for name, path, old, new, tests in chosen:
        t0 = time.time()
        caught = run_one(name, path, old, new, tests)
        print(f"{'caught' if caught else 'MISSED'}  {name}  ({time.time() - t0:.0f} s)", flush=True)
        if not caught:
            missed.append(name)
    print(f"{len(chosen) - len(missed)} of {len(chosen)} mutations caught")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
