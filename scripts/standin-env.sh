#!/usr/bin/env bash
# Builds the emulator-backed driver stand-ins when needed and prints the `export` lines that
# select them (and nothing else on stdout):
#
#   eval "$(bash scripts/standin-env.sh cuda sm_90a)"    # or sm_100a, sm_103a
#   cargo run --features cuda --bin k3 -- demo --backend cuda
#   eval "$(bash scripts/standin-env.sh rocm gfx942)"    # or gfx950
#
# cuda: K3_CUDA_DRIVER_LIBRARY (libk3_standin_cuda.so, soname libcuda.so) and K3_CUBLASLT_LIBRARY
# (libk3_standin_cublaslt.so, soname libcublasLt.so); rocm: K3_HIP_LIBRARY and
# K3_HIPBLASLT_LIBRARY (libk3_standin_hip.so and a libk3_standin_hipblaslt.so link to it: one
# library serves both, sharing memory and streams). K3_STANDIN_ARCH picks the personality.
# The libraries are only ever used through these variables; see standin/README.md.
#
# Build output goes to stderr. Cargo's own target directory is used (CARGO_TARGET_DIR works);
# K3_STANDIN_PROFILE (default `test`, the profile `cargo test` builds with, so CI reuses what
# its test run built) selects the cargo profile.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "usage: bash scripts/standin-env.sh cuda sm_90a|sm_100a|sm_103a" >&2
  echo "       bash scripts/standin-env.sh rocm gfx942|gfx950" >&2
  exit 2
}

vendor=${1:-}
arch=${2:-}
case "$vendor:$arch" in
  cuda:sm_90a | cuda:sm_100a | cuda:sm_103a) packages=(-p k3-standin-cuda -p k3-standin-cublaslt) ;;
  rocm:gfx942 | rocm:gfx950) packages=(-p k3-standin-hip) ;;
  *) usage ;;
esac

profile=${K3_STANDIN_PROFILE:-test}
# JSON messages on stdout (parsed for the artifact paths), rendered diagnostics on stderr.
messages=$(cargo build --profile "$profile" "${packages[@]}" --message-format=json-render-diagnostics)

# The path of the cdylib `lib$1.so` this build produced.
artifact() {
  local path
  path=$(grep -o "\"[^\"]*/lib$1\\.so\"" <<<"$messages" | tail -n 1 | tr -d '"')
  if [ -z "$path" ] || [ ! -f "$path" ]; then
    echo "standin-env.sh: cargo did not report lib$1.so" >&2
    exit 1
  fi
  printf '%s' "$path"
}

printf 'export K3_STANDIN_ARCH=%q\n' "$arch"
if [ "$vendor" = cuda ]; then
  printf 'export K3_CUDA_DRIVER_LIBRARY=%q\n' "$(artifact k3_standin_cuda)"
  printf 'export K3_CUBLASLT_LIBRARY=%q\n' "$(artifact k3_standin_cublaslt)"
else
  hip=$(artifact k3_standin_hip)
  blas="$(dirname "$hip")/libk3_standin_hipblaslt.so"
  ln -sf "$(basename "$hip")" "$blas"
  printf 'export K3_HIP_LIBRARY=%q\n' "$hip"
  printf 'export K3_HIPBLASLT_LIBRARY=%q\n' "$blas"
fi
