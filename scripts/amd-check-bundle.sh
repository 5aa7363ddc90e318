#!/usr/bin/env bash
# Builds, on a machine WITHOUT an AMD GPU, everything scripts/amd-check.sh runs on an MI300X /
# MI355X machine that has no Rust toolchain: release binaries with the op kernels compiled for
# gfx942 and gfx950 (clang-19 and zig clang, as CI does) and embedded as HSA code objects,
# stripped and packed into amd-check-bundle/bundle.tar.xz (git-ignored).
#
#   bash scripts/amd-check-bundle.sh            # K3_HIP_ARCHS defaults to gfx942,gfx950
#   bash scripts/amd-check-bundle.sh --into DIR # DIR/bin + DIR/MANIFEST, not packed (amd-check.sh
#                                               # on an AMD machine that has cargo)
#
# Needs clang-19 (gfx942) and the ziglang wheel (K3_ZIG, gfx950), or any clang >= 20 through
# K3_HIP_CLANG; on an AMD machine, K3_HIP_CLANG=$ROCM_PATH/llvm/bin/clang serves both. With
# K3_REQUIRE_DEVICE_COMPILE=0 a missing compiler is allowed: the binaries then compile the
# kernels with the AMD machine's hiprtc.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
BUNDLE="$ROOT/amd-check-bundle"
STAGE="$ROOT/target/amd-check-bundle"
PACK=1
if [ "${1:-}" = "--into" ] && [ -n "${2:-}" ]; then
  STAGE=$2
  PACK=0
fi
export K3_HIP_ARCHS="${K3_HIP_ARCHS:-gfx942,gfx950}"
export K3_REQUIRE_DEVICE_COMPILE="${K3_REQUIRE_DEVICE_COMPILE:-1}"
export CARGO_TERM_COLOR=never
# shellcheck source=scripts/check-lib.sh
. "$ROOT/scripts/check-lib.sh"

rm -rf "$STAGE/bin"
mkdir -p "$STAGE/bin"

echo "building for K3_HIP_ARCHS=$K3_HIP_ARCHS (release)"
# k3-benches without its default `cuda`: the same kernel-api features as the k3 build, so the
# two share artifacts.
pack "$STAGE" k3 build -p model-k3 --features rocm --bin k3
pack "$STAGE" k3-device-bench build -p k3-benches --no-default-features --features rocm --bin k3-device-bench
pack "$STAGE" rocm-conformance test --no-run -p k3-backend-rocm --test conformance_rocm
pack "$STAGE" rocm-known-gaps test --no-run -p k3-backend-rocm --test known_gaps
pack "$STAGE" rocm-standin-tests test --no-run -p k3-backend-rocm --test standin
pack "$STAGE" rocm-graph-test test --no-run -p model-k3 --features rocm --test rocm_graph
pack "$STAGE" rocm-model-test test --no-run -p model-k3 --features rocm --test rocm

{
  echo "commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(git status --porcelain 2>/dev/null | grep -q . && echo +dirty || true)"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "hip_archs=$K3_HIP_ARCHS"
  echo "rustc=$(rustc --version 2>/dev/null || echo unknown)"
} >"$STAGE/MANIFEST"
[ $PACK -eq 1 ] || exit 0
mkdir -p "$BUNDLE"
cp "$STAGE/MANIFEST" "$BUNDLE/MANIFEST"
XZ_OPT="-6 -T0" tar -C "$STAGE" -cJf "$BUNDLE/bundle.tar.xz.tmp" bin MANIFEST
mv "$BUNDLE/bundle.tar.xz.tmp" "$BUNDLE/bundle.tar.xz"
echo "bundle: $BUNDLE/bundle.tar.xz ($(du -h "$BUNDLE/bundle.tar.xz" | cut -f1)); manifest:"
sed 's/^/  /' "$BUNDLE/MANIFEST"
