#!/usr/bin/env bash
# Builds, on a machine WITHOUT a GPU, everything scripts/gpu-check.sh runs on a GPU machine that
# has no Rust toolchain (the project's lent H200 has CUDA and Python but no cargo, and no network):
# release binaries with the op kernels compiled by nvcc for the card's arch and embedded as
# cubins, stripped and packed into gpu-check-bundle/bundle.tar.xz (git-ignored, about 18 MB with the fla-core wheel).
# Copy or carry that folder to the GPU machine; gpu-check.sh unpacks and runs it.
#
#   bash scripts/gpu-check-bundle.sh            # K3_CUDA_ARCHS defaults to 90a (H100 / H200)
#   bash scripts/gpu-check-bundle.sh --into DIR # DIR/bin + DIR/MANIFEST, not packed (gpu-check.sh
#                                               # on a GPU machine that has cargo)
#
# Needs nvcc (CUDA_HOME, NVCC or PATH; .ci/run installs one from the PyPI wheels). With
# K3_REQUIRE_DEVICE_COMPILE=0 a missing nvcc is allowed: the binaries then JIT-compile the
# kernels with the GPU machine's NVRTC. The embedded cubins are SASS (no PTX), which CUDA's
# minor-version compatibility lets an older 13.x driver load; the GPU check verifies that
# (step embedded_cubins) and falls back to the machine's NVRTC per file (BENCHMARKS.md, "CUDA
# 13.0 driver"). For cubins from the driver's own toolkit, point CUDA_HOME/NVCC at a 13.0 nvcc.
#
# Also bundled: the `fla-core` wheel (pure Python, FLA_CORE_VERSION, default 0.6.0) for the
# FLA side-by-side step; without network the bundle is made without it and that step skips.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUNDLE="$ROOT/gpu-check-bundle"
STAGE="$ROOT/target/gpu-check-bundle"
PACK=1
if [ "${1:-}" = "--into" ] && [ -n "${2:-}" ]; then
  STAGE=$2
  PACK=0
fi
export K3_CUDA_ARCHS="${K3_CUDA_ARCHS:-90a}"
export K3_REQUIRE_DEVICE_COMPILE="${K3_REQUIRE_DEVICE_COMPILE:-1}"
export CARGO_TERM_COLOR=never

rm -rf "$STAGE/bin"
mkdir -p "$STAGE/bin"

# shellcheck source=scripts/check-lib.sh
. "$ROOT/scripts/check-lib.sh"

echo "building for K3_CUDA_ARCHS=$K3_CUDA_ARCHS (release)"
pack "$STAGE" k3 build -p model-k3 --features cuda --bin k3
pack "$STAGE" k3-device-bench build -p k3-benches --features cuda --bin k3-device-bench
pack "$STAGE" copy_bandwidth build -p k3-backend-cuda --example copy_bandwidth
pack "$STAGE" cuda-gpu-tests test --no-run -p k3-backend-cuda --test gpu
pack "$STAGE" cuda-conformance test --no-run -p k3-backend-cuda --test conformance_cuda
pack "$STAGE" cuda-graph-test test --no-run -p model-k3 --features cuda --test cuda_graph
pack "$STAGE" k3-peer build -p k3-benches --features cuda --bin k3-peer

# FLA (fla-org/flash-linear-attention) for the GPU machine's Python 3.12; py3-none-any wheel.
FLA_CORE_VERSION="${FLA_CORE_VERSION:-0.6.0}"
rm -rf "$STAGE/wheels"
mkdir -p "$STAGE/wheels"
if python3 -m pip download -q --no-deps --python-version 3.12 --only-binary=:all: \
  --dest "$STAGE/wheels" "fla-core==$FLA_CORE_VERSION" >"$STAGE/pip-fla.log" 2>&1; then
  FLA_LINE="$(ls "$STAGE/wheels")"
else
  FLA_LINE="none (pip download fla-core==$FLA_CORE_VERSION failed: $(tail -n 1 "$STAGE/pip-fla.log" | cut -c1-160))"
fi
echo "  wheels: $FLA_LINE"

NVCC_LINE=$( (${NVCC:-nvcc} --version 2>/dev/null || "${CUDA_HOME:-/nonexistent}/bin/nvcc" --version 2>/dev/null) | grep -o 'release [0-9.]*, V[0-9.]*' | head -n 1 || true)
{
  echo "commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo +dirty || true)"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cuda_archs=$K3_CUDA_ARCHS"
  echo "nvcc=${NVCC_LINE:-none (kernels JIT-compiled by NVRTC on the GPU machine)}"
  echo "rustc=$(rustc --version 2>/dev/null || echo unknown)"
  echo "fla_core=$FLA_LINE"
} >"$STAGE/MANIFEST"
[ $PACK -eq 1 ] || exit 0
mkdir -p "$BUNDLE"
cp "$STAGE/MANIFEST" "$BUNDLE/MANIFEST"
XZ_OPT="-6 -T0" tar -C "$STAGE" -cJf "$BUNDLE/bundle.tar.xz.tmp" bin wheels MANIFEST
mv "$BUNDLE/bundle.tar.xz.tmp" "$BUNDLE/bundle.tar.xz"
echo "bundle: $BUNDLE/bundle.tar.xz ($(du -h "$BUNDLE/bundle.tar.xz" | cut -f1)); manifest:"
sed 's/^/  /' "$BUNDLE/MANIFEST"
