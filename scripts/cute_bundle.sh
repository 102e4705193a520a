#!/usr/bin/env bash
# Packs nvidia-cutlass-dsl (CuTe DSL) for the device machine, whose image lacks it and which has
# no network: the contents of its wheels (and protobuf's) in one xz tarball, .cute/cs_all.tar.xz
# (.cute/ is git-ignored). The cu12 wheel alone is 92 MB, over the 64 MiB a device call may
# carry; unpacked, without the optional IKET tracing package, and recompressed with xz -9e, the
# bundle fits when it travels alone: carry [".cute"] without ".whl" (64.9 MB for 4.8.1, so the
# tree may hold about 2.1 MB beside it).
# CuTe DSL also compiles here without a GPU (python3.11: download the cp311 wheels instead).
#
# Here:  bash scripts/cute_bundle.sh                      (about 3 minutes of xz on 2 cores)
# There: mkdir -p /tmp/cs && tar xJf .cute/cs_all.tar.xz -C /tmp/cs &&
#        export PYTHONPATH=/tmp/cs:/tmp/cs/nvidia_cutlass_dsl/dsl_packages &&
#        python3 scripts/cute_smoke.py
set -euo pipefail
VERSION=4.8.1
cd "$(dirname "$0")/.."
grep -qx '/.cute/' .git/info/exclude 2>/dev/null || echo /.cute/ >> .git/info/exclude
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$work/wheels" \
    nvidia-cutlass-dsl==$VERSION nvidia-cutlass-dsl-libs-base==$VERSION \
    nvidia-cutlass-dsl-libs-core==$VERSION nvidia-cutlass-dsl-libs-cu12==$VERSION protobuf==7.36.2
mkdir -p "$work/site" .cute
for wheel in "$work"/wheels/*.whl; do unzip -q -o "$wheel" -d "$work/site"; done
# IKET (in-kernel event tracing) is optional: cute.experimental stands a stub in for it
rm -rf "$work/site/nvidia_cutlass_dsl/dsl_packages/iket"
echo "packing $(du -sh "$work/site" | cut -f1) with xz -9e" >&2
tar cf - -C "$work/site" . | xz -9e -T2 > .cute/cs_all.tar.xz
cp .whl/cachetools-*.whl .cute/ 2>/dev/null || true   # graphrt's one missing dependency there
ls -la .cute/
