#!/usr/bin/env bash
# One device-machine call: GPU tests, compute-sanitizer, benchmarks, demo; logs under $OUT.
# Usage there: bash scripts/gpu_session.sh [tests|optests|ptests|suite|jax_tests|sanitize|memcheck|sweep|sweep_mhc|
#                                          fp8_tiles|gluon_in_turn|sanitize_gluon|sweep_wgrad|
#                                          ragged_in_turn|trees_in_turn|bench|mhc|lmsd|
#                                          wgrad|proj|jax|capture|ddp|hf|plan_store|examples|profile|
#                                          copy_ceiling|l2_ceiling|host|host_parts|autograd_split|
#                                          hstu_one_launch|demo ...]
# optests runs the GPU tests under $TEST_PATHS (files; $TEST_K: a -k expression, spaces and all);
# ptests runs the groups of $TEST_GROUPS (';' between groups) side by side, suite every GPU test
# that way (the JAX tests not marked gpu are jax_tests);
# sweep and sweep_mhc take $SWEEP_CASES,
# sweep_wgrad $SWEEP_ARGS (--fp8); profile
# runs ncu over scripts/profile_kernels.py for the ops in $PROFILE_OPS; sanitize and memcheck
# check only the kernels whose names hold $SANITIZE_KERNELS, when set (all of sanitize.py runs;
# memcheck and racecheck over every kernel took about 4 minutes on an H100, over
# _ragged_padded's about 2); stalls samples where the
# warps of the kernels matching $PROFILE_KERNELS (a regex) wait, per SASS instruction.
# With .cute/ carried alone (scripts/cute_bundle.sh; too big to travel with .whl/), the CuTe DSL
# comes from its tarball and cachetools from the wheel the bundle script copies beside it.
# With .t39/triton.tar.xz or .t37/triton.tar.xz carried (scripts/triton_bundle.sh: CI's Triton, or
# the one torch 2.13's CUDA wheels pin, for the image's Python, trimmed to fit the carry limit),
# that Triton runs instead of the image's.
set -u
# a warm machine keeps an earlier call's .cute/ beside .whl/: each wheel once (pip refuses twins)
python3 -m pip install -q --no-index --no-deps --upgrade --target .site \
  $(ls .whl/*.whl .cute/*.whl 2>/dev/null | awk -F/ '!seen[$NF]++')
cute_path=""
if [ -f .cute/cs_all.tar.xz ]; then
  mkdir -p /tmp/cs && tar xJf .cute/cs_all.tar.xz -C /tmp/cs
  cute_path=":/tmp/cs:/tmp/cs/nvidia_cutlass_dsl/dsl_packages"
fi
triton_path=""
# $TRITON_BUNDLE names the folder when a warm machine holds more than one (an earlier call's)
bundle=$(ls ${TRITON_BUNDLE:-.t3*}/triton.tar.xz 2>/dev/null)
if [ "$(echo "$bundle" | grep -c .)" -gt 1 ]; then
  echo "several Triton bundles here ($bundle): set TRITON_BUNDLE" >&2; exit 2
fi
if [ -n "$bundle" ]; then
  rm -rf /tmp/tb && mkdir -p /tmp/tb && tar xJf "$bundle" -C /tmp/tb && triton_path="/tmp/tb:"
  # the bundles leave ptxas out (3.9 compiles sm_90 with its ptxas-blackwell); 3.7.1 runs the
  # image's Triton's, the same release (CUDA 12.8.93) as the one its wheel ships
  [ -e /tmp/tb/triton/backends/nvidia/bin/ptxas ] || export TRITON_PTXAS_PATH=$(python3 -c \
    "import os, triton; print(os.path.dirname(triton.__file__) + '/backends/nvidia/bin/ptxas')")
  # its backends from its own tree: the image's Triton also declares an AMD one, left out here
  export TRITON_BACKENDS_IN_TREE=1
fi
export PYTHONPATH=$triton_path$PWD:$PWD/.site$cute_path PYTHONUNBUFFERED=1 GRAPHRT_BENCH_DIR=$OUT
python3 -c "import triton, torch, graphrt.kernel_utils as k; print('triton', triton.__version__,
  triton.__file__, 'torch', torch.__version__, 'gluon kernels on:', k.ON_TESTED_TRITON)" \
  | tee "$OUT/versions.txt"
[ -n "${TRITON_PTXAS_PATH:-}" ] && "$TRITON_PTXAS_PATH" --version | tail -1 | tee -a "$OUT/versions.txt"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/smi.txt" 2>&1
# the JAX tests run on the image's jax with CUDA here, marked gpu or not: those not marked gpu
jax_tests() { python3 -m pytest -q -m "not gpu" tests/test_jax.py -p no:cacheprovider -W ignore::DeprecationWarning 2>&1 | tee "$OUT/gpu_jax_tests.log" | tail -5; }
# compute-sanitizer's tool $1 over scripts/sanitize.py into the log $2, then its summary line:
# only the kernels whose names hold $SANITIZE_KERNELS, when set; at most $SANITIZE_S seconds
sanitizer() {
  ${SANITIZE_S:+timeout $SANITIZE_S} compute-sanitizer --tool $1 \
    $([ $1 = memcheck ] && echo --report-api-errors no) \
    ${SANITIZE_KERNELS:+--kernel-name "kns=$SANITIZE_KERNELS"} python3 scripts/sanitize.py > "$2" 2>&1
  echo "$1 rc=$?: $(grep -E 'kernel at|ERROR SUMMARY|RACECHECK SUMMARY|sanitize run done' "$2" | tr '\n' ' ')"
}
steps=${*:-tests sanitize bench demo}
for step in $steps; do
  echo "=== $step"
  case $step in
    tests) python3 -m pytest -q -m gpu tests -p no:cacheprovider -W ignore::DeprecationWarning 2>&1 | tee "$OUT/gpu_tests.log" | tail -40
      jax_tests ;;
    jax_tests) jax_tests ;;
    sanitize) for tool in memcheck racecheck; do sanitizer $tool "$OUT/$tool.log"; done ;;
    fp8_tiles)   # the 1x128 kernel's tiles: times (fp8_unscaled --short), its direct GPU test
      timeout 290 python3 scripts/fp8_unscaled.py --short 2>&1 | tee "$OUT/fp8_unscaled.log"
      timeout 270 python3 -m pytest -q -m gpu tests/ops/test_grouped_gemm_fp8.py -k gluon_kernel_matches \
        -p no:cacheprovider -W ignore::DeprecationWarning -rf 2>&1 | tee "$OUT/gluon_test.log" | tail -8 ;;
    gluon_in_turn)   # the 1x128 kernel's configs in turn; then the 128 late-spread tests
      timeout 200 python3 scripts/gluon_configs_in_turn.py 2>&1 | tee "$OUT/gluon_in_turn.log"
      timeout 120 python3 -m pytest -q -m gpu tests/ops/test_grouped_gemm_fp8.py \
        -k "gluon_kernel_matches and 128-late" -p no:cacheprovider -rf 2>&1 | tail -4 ;;
    sanitize_gluon)   # compute-sanitizer over the 1x128 kernel at each config in $GLUON_CONFIGS,
      # at most $SANITIZE_S seconds a tool (150 when unset)
      for cfg in ${GLUON_CONFIGS:-192,4,240,1,1}; do
        for tool in memcheck racecheck; do
          echo -n "$cfg "
          GRAPHRT_SANITIZE_GLUON_CONFIG=$cfg SANITIZE_KERNELS=_wgrad_fp8_ws \
            SANITIZE_S=${SANITIZE_S:-150} sanitizer $tool "$OUT/$tool.$cfg.log"
        done
      done ;;
    memcheck) sanitizer memcheck "$OUT/memcheck.log" ;;   # sanitize's first tool alone
    sweep) python3 scripts/sweep_rmsnorm.py ${SWEEP_CASES:-} 2>&1 | tee "$OUT/sweep.log" ;;
    sweep_wgrad) python3 scripts/sweep_wgrad.py ${SWEEP_ARGS:-} 2>&1 | tee "$OUT/sweep_wgrad.log" ;;
    ragged_in_turn) python3 scripts/ragged_in_turn.py 2>&1 | tee "$OUT/ragged_in_turn.log" ;;
    trees_in_turn)   # $TURN_SCRIPT from .gpu/base (an earlier tree's graphrt/ and scripts/, carried
      # with .gpu: git archive REV graphrt scripts | tar -x -C .gpu/base) and from this tree,
      # one after the other, $TURN_ROUNDS times
      for round_ in $(seq ${TURN_ROUNDS:-2}); do
        for tree in .gpu/base .; do
          echo "--- round $round_, tree $tree"
          PYTHONPATH=$PWD/$tree:$PYTHONPATH python3 $tree/$TURN_SCRIPT 2>&1 \
            | tee -a "$OUT/trees_in_turn.log" | tail -${TURN_TAIL:-8}
        done
      done ;;
    sweep_mhc) python3 scripts/sweep_mhc.py ${SWEEP_CASES:-} 2>&1 | tee "$OUT/sweep_mhc.log" ;;
    ptests|suite)   # the ';'-separated groups of test paths in $TEST_GROUPS, in parallel processes
      # suite: every GPU test, in six groups of about equal time (about 200 s on an H100)
      [ "$step" = suite ] && TEST_GROUPS="tests/ops/test_grouped_gemm.py -k ragged;tests/ops/test_grouped_gemm.py -k 'not ragged';tests/ops/test_grouped_gemm_fp8.py;tests/ops/test_rmsnorm.py tests/ops/test_proj_rope.py tests/ops/test_adamw.py;tests/ops/test_hstu.py tests/ops/test_mhc.py tests/ops/test_library.py tests/nn tests/test_jax.py tests/test_core.py tests/test_cute_launch.py tests/test_errors.py tests/test_kernels_compile.py tests/test_properties.py tests/test_registry.py tests/test_bench_host.py tests/test_bench_hf.py tests/test_plot.py tests/test_reduction.py;tests/capture tests/hf tests/test_binding.py tests/test_launch_gpu.py tests/test_threads_gpu.py tests/test_arena_gpu.py"
      IFS=';' read -ra groups <<< "${TEST_GROUPS:-tests}"
      for i in "${!groups[@]}"; do   # each stops after $PTESTS_S seconds (one line a test)
        eval timeout "${PTESTS_S:-540}" python3 -m pytest -v -m gpu ${groups[$i]} \
            -p no:cacheprovider -W ignore::DeprecationWarning -rf > "$OUT/ptests_$i.log" 2>&1 &
      done
      wait
      for i in "${!groups[@]}"; do
        echo "--- ${groups[$i]}: $(grep -c ' PASSED' "$OUT/ptests_$i.log") passed"
        grep -E ' (FAILED|ERROR)|^(FAILED|ERROR) | passed| failed' "$OUT/ptests_$i.log" | head -12
      done ;;
    optests) python3 -m pytest -q -m gpu ${TEST_PATHS:-tests/ops} ${TEST_K:+-k "$TEST_K"} -p no:cacheprovider -W ignore::DeprecationWarning -rf 2>&1 | tee "$OUT/gpu_optests.log" | tail -15 ;;
    bench) python3 -m graphrt.cli bench rmsnorm 2>&1 | tee "$OUT/bench.log" | tail -52
           python3 -m graphrt.cli bench plan_store 2>&1 | tail -6 ;;
    proj) python3 -m graphrt.cli bench proj 2>&1 | tee "$OUT/bench_proj.log" | tail -12 ;;
    wgrad) python3 -m graphrt.cli bench wgrad 2>&1 | tee "$OUT/bench_wgrad.log" | tail -14 ;;
    lmsd) python3 -m graphrt.cli bench lmsd 2>&1 | tee "$OUT/bench_lmsd.log" | tail -22 ;;
    mhc) python3 -m graphrt.cli bench mhc 2>&1 | tee "$OUT/bench_mhc.log" | tail -10 ;;
    copy_ceiling) python3 scripts/tiled_copy_ceiling.py 2>&1 | tee "$OUT/copy_ceiling.log" | tail -52 ;;
    l2_ceiling) python3 scripts/l2_read_ceiling.py 2>&1 | tee "$OUT/l2_ceiling.log" | tail -12 ;;
    jax) python3 -m graphrt.cli bench jax 2>&1 | tee "$OUT/bench_jax.log" | tail -14 ;;
    plan_store) python3 -m graphrt.cli bench plan_store 2>&1 | tail -6 ;;
    capture) python3 -m graphrt.cli bench capture 2>&1 | tee "$OUT/bench_capture.log" | tail -12 ;;
    ddp) python3 -m graphrt.cli bench ddp 2>&1 | tee "$OUT/bench_ddp.log" | tail -8 ;;
    hf) python3 -m graphrt.cli bench hf 2>&1 | tee "$OUT/bench_hf.log" | tail -22 ;;
    examples) for e in deepseek_block hstu_block; do python3 examples/$e.py 2>&1 | tail -12; done ;;
    profile)
      python3 scripts/profile_kernels.py --copies 2>&1 | tee "$OUT/copies.log"
      ncu --clock-control none --profile-from-start off --section SpeedOfLight \
          --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
          --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis \
          python3 scripts/profile_kernels.py ${PROFILE_OPS:-} > "$OUT/ncu.txt" 2>&1
      echo "ncu rc=$?"; grep -E '^  [_a-z]|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy' "$OUT/ncu.txt" | head -80 ;;
    stalls)
      ncu --clock-control none --profile-from-start off --section WarpStateStats \
          --section SourceCounters --import-source no -k "regex:${PROFILE_KERNELS:-.}" \
          -o "$OUT/stalls" python3 scripts/profile_kernels.py ${PROFILE_OPS:-} > "$OUT/stalls.log" 2>&1
      echo "ncu rc=$?"
      ncu -i "$OUT/stalls.ncu-rep" --page raw --csv > "$OUT/stalls_raw.csv" 2>&1
      ncu -i "$OUT/stalls.ncu-rep" --page source --csv --print-source sass > "$OUT/stalls_sass.csv" 2>&1
      echo "source page rc=$? $(wc -c < "$OUT/stalls_sass.csv") bytes" ;;
    host) python3 -m graphrt.cli bench host 2>&1 | tee "$OUT/bench_host.log" ;;
    host_parts) python3 scripts/host_parts.py 2>&1 | tee "$OUT/host_parts.log" ;;
    autograd_split) python3 scripts/host_parts.py --autograd 2>&1 | tee "$OUT/autograd_split.log" ;;
    hstu_one_launch) python3 scripts/hstu_one_launch.py 2>&1 | tee "$OUT/hstu_one_launch.log" ;;
    host_profile) python3 -m graphrt.bench.host --profile "${PROFILE_CASE:-graphrt.nn.RMSNorm forward + backward}" 2>&1 | tee "$OUT/host_profile.log" | head -45 ;;
    host_trace) python3 -m graphrt.bench.host --trace "${PROFILE_CASE:-graphrt.nn.RMSNorm forward + backward}" 2>&1 | tee "$OUT/host_trace.log" | head -45 ;;
    demo) python3 -m graphrt.cli demo 2>&1 | tee "$OUT/demo.log" | tail -22 ;;
  esac
done
