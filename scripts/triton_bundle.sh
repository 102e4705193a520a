#!/usr/bin/env bash
# Packs a Triton release for the device image's Python into .tXY/triton.tar.xz (.t39 for 3.9.0,
# .t37 for 3.7.1: torch 2.13's CUDA wheels pin that one), small enough to carry to the GPU
# machine (gpu_session.sh unpacks it ahead of the image's Triton): the wheel
# without the AMD backend, CUPTI, the profiler library, the tools Triton 3.9 does not run for
# sm_90 and libtriton's debug sections. 3.7.1 does run ptxas for sm_90 (3.9 runs ptxas-blackwell):
# gpu_session.sh then points it at the image's Triton's, the same CUDA 12.8.93 release.
# Usage: bash scripts/triton_bundle.sh [version (3.9.0)] [python version (3.12)]
set -euo pipefail
version=${1:-3.9.0}
py=${2:-3.12}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q "triton==$version" --python-version "$py" --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --no-deps -d "$work"
mkdir "$work/x"
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
    "$work"/triton-*.whl "$work/x"
cd "$work/x"
rm -rf triton/backends/amd triton/backends/nvidia/lib/cupti* triton/_C/libproton.so \
       triton/backends/nvidia/bin/{ptxas,cuobjdump,nvdisasm}
chmod +x triton/backends/nvidia/bin/*
strip --strip-debug triton/_C/libtriton.so
out="$OLDPWD/.t$(echo "$version" | cut -d. -f1,2 | tr -d .)"
mkdir -p "$out"
grep -qx "/$(basename "$out")/" "$OLDPWD/.git/info/exclude" 2>/dev/null \
    || echo "/$(basename "$out")/" >> "$OLDPWD/.git/info/exclude"
tar -cf - triton triton-*.dist-info | xz -9e -T2 > "$out/triton.tar.xz"
ls -la "$out/triton.tar.xz"
