#!/usr/bin/env bash
# The one prepared check for a machine with an NVIDIA GPU (written for the project's lent H200,
# which has CUDA, Python and 16 cores but no Rust toolchain and no network; must finish in about
# 8 minutes there: the 460 s budget below). Run from anywhere inside the repository:
#
#   bash scripts/gpu-check-bundle.sh     # FIRST, on a machine with cargo (no GPU needed): builds
#                                        # gpu-check-bundle/bundle.tar.xz for K3_CUDA_ARCHS (90a)
#   bash scripts/gpu-check.sh            # on the GPU machine; report in $OUT/gpu-check.json when
#                                        # OUT is set, else target/gpu-check/report.json; a table last
#
# Where the binaries come from: gpu-check-bundle/bundle.tar.xz when present (unpacked, nothing
# is compiled by cargo); else, when cargo exists, scripts/gpu-check-bundle.sh --into builds them
# for this card's arch; else the check stops with that reason.
#
# Steps (each bounded by what is left of a ${K3_GPU_CHECK_BUDGET_S:-460} s budget; a step that
# fails or times out is recorded and the script goes on):
#   1. fingerprint: nvidia-smi (card, driver, compute capability), nvcc, commits, date
#   2. binaries: unpack the bundle (or build with cargo)
#   3. nvcc_kernels: this machine's nvcc compiles every kernel of kernels/csrc for the card's arch;
#      embedded_cubins: k3 doctor with K3_CUDA_KERNELS=embedded, i.e. whether the bundle's cubins
#      (built by a possibly newer nvcc) load on this driver; the other steps use the default
#      `auto`, which falls back to this machine's NVRTC for a cubin the driver refuses
#   4. gpu_tests, conformance, graph: the CUDA backend's device tests (memory, kernel sets from
#      embedded cubins and NVRTC, launches, streams, cuBLASLt against a reference, the contract's
#      GEMM on both routes), the conformance suite on CUDA, the decode-step CUDA graph test
#   5. demo, doctor: k3 demo --backend cuda, k3 doctor --backend cuda --json
#   6. device_bench: k3-device-bench --backend cuda (every op family at K3 shapes; each row with
#      % of measured copy bandwidth and % of its speed-of-light floor on this card, the part
#      matched from the device name or K3_GPU_CHECK_HARDWARE; MLA decode also at KV pipeline
#      depths 2..7 side by side, rows `kv_stages=N`, to check the default depth)
#   7. copy_bandwidth: copy bandwidth and launch latency
#   8. fla_peer: FLA's chunk_kda / fused_recurrent_kda against kda_prefill / kda_decode on the same
#      inputs (benches/peer/fla_kda.py; the bundle's fla-core wheel, this machine's PyTorch)
# Safe to run twice: everything it writes lives under target/gpu-check (cleared at the start)
# and $OUT.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
WORK="$ROOT/target/gpu-check"
rm -rf "$WORK"
mkdir -p "$WORK/logs"
REPORT_DIR="${OUT:-$WORK}"
mkdir -p "$REPORT_DIR"
REPORT="$REPORT_DIR/gpu-check.json"
[ -n "${OUT:-}" ] || REPORT="$WORK/report.json"
START=$(date +%s)
BUDGET=${K3_GPU_CHECK_BUDGET_S:-460}
export CARGO_TERM_COLOR=never
export K3_KERNEL_CACHE_DIR="$WORK/kernel-cache"

# shellcheck source=scripts/check-lib.sh
. "$ROOT/scripts/check-lib.sh"

# ---- 1. fingerprint ------------------------------------------------------------------------
CARD=unknown DRIVER=unknown CC=unknown
if command -v nvidia-smi >/dev/null 2>&1; then
  Q=$(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>/dev/null | head -n 1)
  if [ -n "$Q" ]; then
    CARD=$(echo "$Q" | cut -d, -f1 | sed 's/^ *//;s/ *$//')
    DRIVER=$(echo "$Q" | cut -d, -f2 | sed 's/^ *//;s/ *$//')
    CC=$(echo "$Q" | cut -d, -f3 | sed 's/^ *//;s/ *$//')
  fi
fi
# 9.0 -> 90a (arch-specific SASS from Hopper on), 8.6 -> 86.
ARCH=""
if [[ "$CC" =~ ^([0-9]+)\.([0-9]+)$ ]]; then
  ARCH="${BASH_REMATCH[1]}${BASH_REMATCH[2]}"
  [ "${BASH_REMATCH[1]}" -ge 9 ] && ARCH="${ARCH}a"
fi
NVCC_BIN=""
for c in "${NVCC:-}" "${CUDA_HOME:+$CUDA_HOME/bin/nvcc}" "${CUDA_PATH:+$CUDA_PATH/bin/nvcc}" /usr/local/cuda/bin/nvcc "$(command -v nvcc 2>/dev/null)"; do
  if [ -n "$c" ] && [ -x "$c" ]; then NVCC_BIN=$c; break; fi
done
NVCC_VERSION=none
if [ -n "$NVCC_BIN" ]; then
  NVCC_VERSION=$("$NVCC_BIN" --version 2>/dev/null | grep -o 'release [0-9.]*' | head -n 1)
  # The toolkit root: NVRTC and cuBLASLt are looked up under $CUDA_HOME/lib64 at run time.
  export CUDA_HOME="${CUDA_HOME:-$(cd "$(dirname "$NVCC_BIN")/.." && pwd)}"
  export NVCC="$NVCC_BIN"
  export K3_REQUIRE_DEVICE_COMPILE=1
fi
[ -n "$ARCH" ] && export K3_CUDA_ARCHS="$ARCH"
# NVRTC and cuBLASLt: the toolkit's lib64, else the pip wheels' folders (PyTorch brings them).
LIBDIRS=""
for d in "${CUDA_HOME:-/nonexistent}/lib64" "${CUDA_HOME:-/nonexistent}/lib" \
  $(python3 - 2>/dev/null <<'PY'
import importlib.util, os
spec = importlib.util.find_spec("nvidia")
for base in (spec.submodule_search_locations or []) if spec else []:
    for root, _, files in os.walk(base):
        if any(f.startswith(("libnvrtc.so", "libcublasLt.so")) for f in files):
            print(root)
PY
  ); do
  if ls "$d"/libnvrtc.so* >/dev/null 2>&1 || ls "$d"/libcublasLt.so* >/dev/null 2>&1; then LIBDIRS="$LIBDIRS:$d"; fi
done
[ -n "$LIBDIRS" ] && export LD_LIBRARY_PATH="${LIBDIRS#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
DIRTY=$(git status --porcelain 2>/dev/null | grep -q . && echo "+dirty" || true)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
BUNDLE="$ROOT/gpu-check-bundle/bundle.tar.xz"
record fingerprint pass 0 "card=$CARD driver=$DRIVER cc=$CC arch=${ARCH:-?} nvcc=$NVCC_VERSION tree=$COMMIT$DIRTY libs=${LIBDIRS#:}"

# ---- 2. binaries -----------------------------------------------------------------------------
BIN="$WORK/bin"
unpack() {
  mkdir -p "$WORK" && { tar -C "$WORK" -xJf "$BUNDLE" 2>/dev/null || python3 -m tarfile -e "$BUNDLE" "$WORK"; }
}
export -f unpack
export WORK BUNDLE ROOT NVCC_BIN ARCH
if [ -f "$BUNDLE" ]; then
  run_step binaries 60 bash -c unpack
elif command -v cargo >/dev/null 2>&1; then
  # Offline machines: use what is in the local cargo cache when the registry cannot be reached.
  timeout 60 cargo fetch >"$WORK/logs/fetch.log" 2>&1 || export CARGO_NET_OFFLINE=true
  run_step binaries 300 bash "$ROOT/scripts/gpu-check-bundle.sh" --into "$WORK"
else
  record binaries fail 0 "no gpu-check-bundle/bundle.tar.xz and no cargo: run scripts/gpu-check-bundle.sh on a machine with cargo and bring gpu-check-bundle/ here"
fi
BIN_OK=1
[ -x "$BIN/cuda-conformance" ] || BIN_OK=0
BUILT=$(grep -s -E '^(commit|cuda_archs|nvcc)=' "$WORK/MANIFEST" | tr '\n' ' ')
[ $BIN_OK -eq 1 ] && STEP_NOTE[${#STEP_NOTE[@]}-1]="built: $BUILT; ${STEP_NOTE[${#STEP_NOTE[@]}-1]}"

# ---- 3. this machine's nvcc on every kernel -------------------------------------------------------
nvcc_kernels() {
  mkdir -p "$WORK/nvcc"
  find "$ROOT/kernels/csrc" -name '*.cu' -not -path '*/k3/*' | sort |
    xargs -P "$(nproc 2>/dev/null || echo 4)" -I{} sh -c \
      'out="$1/$(echo "$2" | tr / _).cubin"; "$3" -cubin -std=c++17 -O3 -arch=sm_$4 -I"$5" "$2" -o "$out" || { echo "FAILED: $2"; exit 255; }' \
      _ "$WORK/nvcc" {} "$NVCC_BIN" "$ARCH" "$ROOT/kernels/csrc"
  echo "$(ls "$WORK/nvcc" | wc -l) cubins for sm_$ARCH"
}
export -f nvcc_kernels
if [ -n "$NVCC_BIN" ] && [ -n "$ARCH" ]; then
  run_step nvcc_kernels 90 bash -c nvcc_kernels
else
  record nvcc_kernels skipped 0 "no nvcc or no arch on this machine"
fi
if [ $BIN_OK -eq 1 ]; then
  # Fails (and says why) when this driver refuses a bundled cubin; the rest then runs on NVRTC.
  run_step embedded_cubins 60 env K3_CUDA_KERNELS=embedded "$BIN/k3" doctor --backend cuda
else
  record embedded_cubins skipped 0 "no binaries"
fi

# ---- 4. CUDA device tests ------------------------------------------------------------------------
TESTS_PASSED=0 TESTS_FAILED=0 TESTS_SKIPPED=0
count_tests() { # adds a test log's counts; a GPU seen by nvidia-smi but not by the tests is a failure
  local log="$WORK/logs/$1.log"
  [ -f "$log" ] || return 0
  TESTS_PASSED=$((TESTS_PASSED + $(grep -o '[0-9]* passed' "$log" | awk '{s+=$1} END {print s+0}')))
  TESTS_FAILED=$((TESTS_FAILED + $(grep -o '[0-9]* failed' "$log" | awk '{s+=$1} END {print s+0}')))
  TESTS_SKIPPED=$((TESTS_SKIPPED + $(grep -c 'skipped: ' "$log")))
  if grep -q 'skipped: no CUDA device' "$log" && [ "$CARD" != unknown ]; then
    STEP_STATUS[${#STEP_STATUS[@]}-1]=fail
    STEP_NOTE[${#STEP_NOTE[@]}-1]="nvidia-smi sees $CARD but the tests found no device: $(grep -m1 'skipped: no CUDA device' "$log" | cut -c1-300)"
  fi
}
if [ $BIN_OK -eq 1 ]; then
  run_step gpu_tests 90 "$BIN/cuda-gpu-tests" --test-threads=1 --nocapture
  count_tests gpu_tests
  run_step conformance 120 "$BIN/cuda-conformance" --test-threads=4 --nocapture
  count_tests conformance
  run_step graph 60 "$BIN/cuda-graph-test" --test-threads=1 --nocapture
  count_tests graph
else
  for s in gpu_tests conformance graph; do record $s skipped 0 "no binaries"; done
fi

# ---- 5. k3 demo / doctor -----------------------------------------------------------------------
if [ $BIN_OK -eq 1 ]; then
  run_step demo 60 "$BIN/k3" demo --backend cuda --model "$WORK/tiny-k3"
  # stdout alone is the JSON; stderr goes to the step's log.
  run_step doctor 60 sh -c '"$1" doctor --backend cuda --json >"$2"' _ "$BIN/k3" "$WORK/doctor.json"
else
  record demo skipped 0 "no binaries"
  record doctor skipped 0 "no binaries"
fi

# ---- 6. device benches ---------------------------------------------------------------------------
# Rows {op, shape, dtype, us, tflops, gbs, bytes, flops, pct_copy, floor_us, pct_floor, bound};
# the JSON is rewritten after every case, so a step cut short by the budget still reports the
# cases it finished.
BENCH_JSON="$WORK/device-bench.json"
if [ $BIN_OK -eq 1 ]; then
  run_step device_bench 150 "$BIN/k3-device-bench" --backend cuda --json "$BENCH_JSON" ${K3_GPU_CHECK_HARDWARE:+--hardware "$K3_GPU_CHECK_HARDWARE"}
else
  record device_bench skipped 0 "no binaries"
fi

# ---- 7. copy bandwidth and launch latency ------------------------------------------------------
BW_JSON=""
if [ $BIN_OK -eq 1 ]; then
  run_step copy_bandwidth 60 "$BIN/copy_bandwidth" 1024 20
  BW_JSON=$(grep -s -m1 '^{' "$WORK/logs/copy_bandwidth.log")
else
  record copy_bandwidth skipped 0 "no binaries"
fi

# ---- 8. FLA side by side -------------------------------------------------------------------------
FLA_JSON="$WORK/fla-peer.json"
fla_peer() {
  set -e
  local py=python3 pylib="$WORK/pylib"
  mkdir -p "$pylib"
  "$py" -m pip install -q --no-index --no-deps --no-compile --target "$pylib" "$WORK"/wheels/fla_core-*.whl
  "$py" "$ROOT/benches/peer/fla_kda.py" make --dir "$WORK/fla"
  "$BIN/k3-peer" --backend cuda --dir "$WORK/fla" --warmup 3 --iters 10
  PYTHONPATH="$pylib${PYTHONPATH:+:$PYTHONPATH}" "$py" "$ROOT/benches/peer/fla_kda.py" peer --dir "$WORK/fla" --warmup 3 --iters 10
  "$py" "$ROOT/benches/peer/fla_kda.py" compare --dir "$WORK/fla" --json "$FLA_JSON"
  rm -rf "$WORK/fla" # ~3 GB of inputs and outputs
}
export -f fla_peer
export BIN
if [ $BIN_OK -ne 1 ] || [ ! -x "$BIN/k3-peer" ]; then
  record fla_peer skipped 0 "no k3-peer binary"
elif ! ls "$WORK"/wheels/fla_core-*.whl >/dev/null 2>&1; then
  record fla_peer skipped 0 "no fla-core wheel in the bundle ($(grep -s '^fla_core=' "$WORK/MANIFEST" | cut -c1-200))"
elif ! python3 -c 'import torch, triton; assert torch.cuda.is_available()' >/dev/null 2>&1; then
  record fla_peer skipped 0 "python3 has no CUDA PyTorch + Triton"
else
  run_step fla_peer 180 bash -c fla_peer
fi

# ---- report ------------------------------------------------------------------------------------
{
  printf '{\n'
  printf '  "schema": "k3-gpu-check/1",\n'
  printf '  "date": %s,\n' "$(json_str "$DATE")"
  printf '  "commit": %s,\n' "$(json_str "$COMMIT$DIRTY")"
  printf '  "binaries": %s,\n' "$(json_str "${BUILT:-none}")"
  printf '  "card": %s,\n' "$(json_str "$CARD")"
  printf '  "gpu_seen": %s,\n' "$([ "$CARD" != unknown ] && echo true || echo false)"
  printf '  "driver": %s,\n' "$(json_str "$DRIVER")"
  printf '  "compute_capability": %s,\n' "$(json_str "$CC")"
  printf '  "cuda_archs": %s,\n' "$(json_str "${K3_CUDA_ARCHS:-default}")"
  printf '  "nvcc": %s,\n' "$(json_str "$NVCC_VERSION")"
  printf '  "wall_s": %d,\n' "$(($(date +%s) - START))"
  printf '  "tests": {"passed": %d, "failed": %d, "skipped": %d},\n' "$TESTS_PASSED" "$TESTS_FAILED" "$TESTS_SKIPPED"
  printf '  "copy_bandwidth": %s,\n' "$(raw_or_null "$BW_JSON")"
  printf '  "device_bench": %s,\n' "$(raw_or_null "$(cat "$BENCH_JSON" 2>/dev/null)")"
  printf '  "fla_peer": %s,\n' "$(raw_or_null "$(cat "$FLA_JSON" 2>/dev/null)")"
  printf '  "doctor": %s,\n' "$(raw_or_null "$(cat "$WORK/doctor.json" 2>/dev/null)")"
  steps_json
  printf '}\n'
} >"$REPORT"
[ -n "${OUT:-}" ] && cp -r "$WORK/logs" "$OUT/gpu-check-logs" 2>/dev/null

# The short table, last.
echo
echo "gpu-check: $CARD (cc $CC, driver $DRIVER, nvcc $NVCC_VERSION), commit $COMMIT$DIRTY, $(($(date +%s) - START)) s"
steps_table
echo "tests: $TESTS_PASSED passed, $TESTS_FAILED failed, $TESTS_SKIPPED skip notes"
# The bench table with % of copy bandwidth and % of floor, from the report (k3-device-bench
# --table: the view every check script prints), then the FLA side by side.
[ -s "$BENCH_JSON" ] && [ -x "$BIN/k3-device-bench" ] && "$BIN/k3-device-bench" --table "$BENCH_JSON" ${K3_GPU_CHECK_HARDWARE:+--hardware "$K3_GPU_CHECK_HARDWARE"}
[ -s "$FLA_JSON" ] && sed -n '/^case /,$p' "$WORK/logs/fla_peer.log"
[ -n "$BW_JSON" ] && echo "bandwidth: $(echo "$BW_JSON" | grep -o '"d2d_copy_gbs": [0-9.]*\|"h2d_gbs": [0-9.]*\|"d2h_gbs": [0-9.]*\|"launch_us": [0-9.]*' | tr '\n' ' ')"
echo "report: $REPORT"
steps_exit_status
