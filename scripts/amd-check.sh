#!/usr/bin/env bash
# The one prepared check for a machine with an AMD Instinct GPU (MI300X = gfx942, MI355X =
# gfx950), like scripts/gpu-check.sh for NVIDIA. Must finish within 6 minutes there.
#
# *** NEVER RUN ON AMD HARDWARE. *** No AMD GPU has been available to this project. The script
# was written from the ROCm documentation and dry-run end to end only against the emulator-backed
# HIP stand-in (`eval "$(bash scripts/standin-env.sh rocm gfx942)"` first; the report then says
# `"standin": true`). Expect the first real run to find things to fix.
#
#   bash scripts/amd-check-bundle.sh     # FIRST, on a machine with cargo (no GPU needed): builds
#                                        # amd-check-bundle/bundle.tar.xz for gfx942 and gfx950
#   bash scripts/amd-check.sh            # on the AMD machine; report in $OUT/amd-check.json when
#                                        # OUT is set, else target/amd-check/report.json; a table last
#
# Where the binaries come from: amd-check-bundle/bundle.tar.xz when present (unpacked, nothing is
# compiled by cargo); else, when cargo exists, scripts/amd-check-bundle.sh --into builds them
# with this machine's ROCm clang ($ROCM_PATH/llvm/bin/clang) for the card's arch; else the check
# stops with that reason.
#
# Steps (each bounded by what is left of a ${K3_AMD_CHECK_BUDGET_S:-340} s budget; a step that
# fails or times out is recorded and the script goes on):
#   1. fingerprint: rocminfo (card, gfx target), ROCm version, the HIP runtime library, commits
#   2. binaries: unpack the bundle (or build with cargo)
#   3. hip_kernels: this machine's ROCm clang compiles every kernel of kernels/csrc for the
#      card's processor (code objects, as build-support does)
#   4. conformance, known_gaps, graph, model: the conformance suite on ROCm, the K3-on-ROCm gap
#      tests (fp8 KV cache on both MLA variants in the device's flavour, fp32 router bias, 12
#      heads), the decode-step hipGraph test, the tiny model's fp8-cache and router-bias tests
#   5. demo, doctor: k3 demo --backend rocm (tiny model parity against the CPU reference),
#      k3 doctor --backend rocm --json
#   6. device_bench: k3-device-bench --backend rocm (every op family at K3 shapes, each row's
#      bandwidth as % of the device-to-device copy bandwidth it measures first)
# Safe to run twice: everything it writes lives under target/amd-check (cleared at the start)
# and $OUT.
set -u -o pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
WORK="$ROOT/target/amd-check"
rm -rf "$WORK"
mkdir -p "$WORK/logs"
REPORT_DIR="${OUT:-$WORK}"
mkdir -p "$REPORT_DIR"
REPORT="$REPORT_DIR/amd-check.json"
[ -n "${OUT:-}" ] || REPORT="$WORK/report.json"
START=$(date +%s)
BUDGET=${K3_AMD_CHECK_BUDGET_S:-340}
export CARGO_TERM_COLOR=never
export K3_KERNEL_CACHE_DIR="$WORK/kernel-cache"
# shellcheck source=scripts/check-lib.sh
. "$ROOT/scripts/check-lib.sh"

# ---- 1. fingerprint ------------------------------------------------------------------------
ROCM="${ROCM_PATH:-${HIP_PATH:-/opt/rocm}}"
CARD=unknown ARCH="" ROCM_VERSION=unknown
ROCMINFO=$(command -v rocminfo 2>/dev/null || { [ -x "$ROCM/bin/rocminfo" ] && echo "$ROCM/bin/rocminfo"; })
if [ -n "$ROCMINFO" ]; then
  INFO=$("$ROCMINFO" 2>/dev/null)
  # The first GPU agent: its gfx name and marketing name (CPU agents come first in rocminfo and
  # are AMD too, so the name must be an Instinct or Radeon part).
  ARCH=$(echo "$INFO" | grep -o -m1 'gfx[0-9a-f]\+' || true)
  CARD=$(echo "$INFO" | grep -m1 'Marketing Name:.*\(Instinct\|Radeon\)' | sed 's/.*Marketing Name: *//;s/ *$//' || true)
  [ -n "$CARD" ] || CARD=unknown
fi
for f in "$ROCM/.info/version" "$ROCM/.info/version-dev"; do
  [ -f "$f" ] && { ROCM_VERSION=$(head -n 1 "$f"); break; }
done
STANDIN=false
case "${K3_HIP_LIBRARY:-}" in *k3_standin_hip*) STANDIN=true ;; esac
if [ "$STANDIN" = true ]; then
  ARCH=${K3_STANDIN_ARCH:-gfx942}
  CARD="emulator-backed stand-in ($ARCH)"
fi
ROCM_CLANG=""
for c in "${K3_HIP_CLANG:-}" "$ROCM/llvm/bin/clang" "$ROCM/lib/llvm/bin/clang"; do
  if [ -n "$c" ] && [ -x "$c" ]; then ROCM_CLANG=$c; break; fi
done
# The runtime libraries the binaries will load (hiprtc, hipBLASLt beside libamdhip64).
[ -d "$ROCM/lib" ] && [ "$STANDIN" = false ] && export LD_LIBRARY_PATH="$ROCM/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
COMMIT=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
DIRTY=$(git status --porcelain 2>/dev/null | grep -q . && echo "+dirty" || true)
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
BUNDLE="$ROOT/amd-check-bundle/bundle.tar.xz"
record fingerprint pass 0 "card=$CARD arch=${ARCH:-?} rocm=$ROCM_VERSION clang=${ROCM_CLANG:-none} hip_library=${K3_HIP_LIBRARY:-search} tree=$COMMIT$DIRTY"

# ---- 2. binaries -----------------------------------------------------------------------------
BIN="$WORK/bin"
unpack() {
  mkdir -p "$WORK" && { tar -C "$WORK" -xJf "$BUNDLE" 2>/dev/null || python3 -m tarfile -e "$BUNDLE" "$WORK"; }
}
export -f unpack
export WORK BUNDLE ROOT ARCH ROCM_CLANG
if [ -f "$BUNDLE" ]; then
  run_step binaries 60 bash -c unpack
elif command -v cargo >/dev/null 2>&1; then
  timeout 60 cargo fetch >"$WORK/logs/fetch.log" 2>&1 || export CARGO_NET_OFFLINE=true
  # This machine's clang knows its own processor; the stand-in dry run builds both.
  if [ -n "$ROCM_CLANG" ] && [ -n "$ARCH" ] && [ "$STANDIN" = false ]; then
    export K3_HIP_CLANG="$ROCM_CLANG" K3_HIP_ARCHS="$ARCH"
  fi
  run_step binaries 300 bash "$ROOT/scripts/amd-check-bundle.sh" --into "$WORK"
else
  record binaries fail 0 "no amd-check-bundle/bundle.tar.xz and no cargo: run scripts/amd-check-bundle.sh on a machine with cargo and bring amd-check-bundle/ here"
fi
BIN_OK=1
[ -x "$BIN/rocm-conformance" ] || BIN_OK=0
BUILT=$(grep -s -E '^(commit|hip_archs)=' "$WORK/MANIFEST" | tr '\n' ' ')
[ $BIN_OK -eq 1 ] && STEP_NOTE[${#STEP_NOTE[@]}-1]="built: $BUILT; ${STEP_NOTE[${#STEP_NOTE[@]}-1]}"

# ---- 3. this machine's clang on every kernel --------------------------------------------------
hip_kernels() {
  mkdir -p "$WORK/hsaco"
  find "$ROOT/kernels/csrc" -name '*.cu' -not -path '*/k3/*' | sort |
    xargs -P "$(nproc 2>/dev/null || echo 4)" -I{} sh -c \
      'out="$1/$(echo "$2" | tr / _).hsaco"; "$3" -x hip -std=c++17 --offload-arch="$4" --cuda-device-only --no-gpu-bundle-output -nogpulib -nogpuinc -O3 -mcode-object-version=5 -I"$5" "$2" -o "$out" || { echo "FAILED: $2"; exit 255; }' \
      _ "$WORK/hsaco" {} "$ROCM_CLANG" "$ARCH" "$ROOT/kernels/csrc"
  echo "$(ls "$WORK/hsaco" | wc -l) code objects for $ARCH with $("$ROCM_CLANG" --version | head -n 1)"
}
export -f hip_kernels
if [ -n "$ROCM_CLANG" ] && [ -n "$ARCH" ]; then
  run_step hip_kernels 90 bash -c hip_kernels
else
  record hip_kernels skipped 0 "no ROCm clang (K3_HIP_CLANG, \$ROCM_PATH/llvm/bin/clang) or no gfx target on this machine"
fi

# ---- 4. ROCm device tests ------------------------------------------------------------------------
TESTS_PASSED=0 TESTS_FAILED=0 TESTS_SKIPPED=0
count_tests() { # adds a test log's counts; a GPU seen by rocminfo but not by the tests is a failure
  local log="$WORK/logs/$1.log"
  [ -f "$log" ] || return 0
  TESTS_PASSED=$((TESTS_PASSED + $(grep -o '[0-9]* passed' "$log" | awk '{s+=$1} END {print s+0}')))
  TESTS_FAILED=$((TESTS_FAILED + $(grep -o '[0-9]* failed' "$log" | awk '{s+=$1} END {print s+0}')))
  TESTS_SKIPPED=$((TESTS_SKIPPED + $(grep -c 'skipped: ' "$log")))
  if grep -q 'skipped: no HIP device' "$log" && [ "$CARD" != unknown ]; then
    STEP_STATUS[${#STEP_STATUS[@]}-1]=fail
    STEP_NOTE[${#STEP_NOTE[@]}-1]="rocminfo sees $CARD but the tests found no device: $(grep -m1 'skipped: no HIP device' "$log" | cut -c1-300)"
  fi
}
if [ $BIN_OK -eq 1 ]; then
  run_step conformance 120 "$BIN/rocm-conformance" --test-threads=4 --nocapture
  count_tests conformance
  run_step known_gaps 60 "$BIN/rocm-known-gaps" --test-threads=1 --nocapture
  count_tests known_gaps
  run_step graph 60 "$BIN/rocm-graph-test" --test-threads=1 --nocapture
  count_tests graph
  run_step model 60 "$BIN/rocm-model-test" --test-threads=1 --nocapture
  count_tests model
  if [ "$STANDIN" = true ]; then
    run_step standin 60 "$BIN/rocm-standin-tests" --test-threads=1 --nocapture
    count_tests standin
  fi
else
  for s in conformance known_gaps graph model; do record $s skipped 0 "no binaries"; done
fi

# ---- 5. k3 demo / doctor -----------------------------------------------------------------------
if [ $BIN_OK -eq 1 ]; then
  run_step demo 60 "$BIN/k3" demo --backend rocm --model "$WORK/tiny-k3"
  # stdout alone is the JSON; stderr goes to the step's log.
  run_step doctor 90 sh -c '"$1" doctor --backend rocm --json >"$2"' _ "$BIN/k3" "$WORK/doctor.json"
else
  record demo skipped 0 "no binaries"
  record doctor skipped 0 "no binaries"
fi
PARITY=$(grep -s -m1 'parity:' "$WORK/logs/demo.log" | sed 's/^ *//')

# ---- 6. device benches ---------------------------------------------------------------------------
# Rows {op, shape, dtype, us, tflops, gbs, bytes, flops, pct_copy}; the JSON is rewritten after
# every case, so a step cut short by the budget still reports the cases it finished. The
# emulator-backed stand-in runs the smoke shapes (its times mean nothing).
BENCH_JSON="$WORK/device-bench.json"
BENCH_ARGS=(--backend rocm --json "$BENCH_JSON")
[ "$STANDIN" = true ] && BENCH_ARGS+=(--smoke)
if [ $BIN_OK -eq 1 ]; then
  run_step device_bench 150 "$BIN/k3-device-bench" "${BENCH_ARGS[@]}"
else
  record device_bench skipped 0 "no binaries"
fi

# ---- report ------------------------------------------------------------------------------------
{
  printf '{\n'
  printf '  "schema": "k3-amd-check/1",\n'
  printf '  "never_run_on_amd_hardware_before": true,\n'
  printf '  "standin": %s,\n' "$STANDIN"
  printf '  "date": %s,\n' "$(json_str "$DATE")"
  printf '  "commit": %s,\n' "$(json_str "$COMMIT$DIRTY")"
  printf '  "binaries": %s,\n' "$(json_str "${BUILT:-none}")"
  printf '  "card": %s,\n' "$(json_str "$CARD")"
  printf '  "gpu_seen": %s,\n' "$([ "$CARD" != unknown ] && [ "$STANDIN" = false ] && echo true || echo false)"
  printf '  "arch": %s,\n' "$(json_str "${ARCH:-unknown}")"
  printf '  "rocm": %s,\n' "$(json_str "$ROCM_VERSION")"
  printf '  "clang": %s,\n' "$(json_str "${ROCM_CLANG:-none}")"
  printf '  "wall_s": %d,\n' "$(($(date +%s) - START))"
  printf '  "tests": {"passed": %d, "failed": %d, "skipped": %d},\n' "$TESTS_PASSED" "$TESTS_FAILED" "$TESTS_SKIPPED"
  printf '  "demo_parity": %s,\n' "$(json_str "${PARITY:-none}")"
  printf '  "device_bench": %s,\n' "$(raw_or_null "$(cat "$BENCH_JSON" 2>/dev/null)")"
  printf '  "doctor": %s,\n' "$(raw_or_null "$(cat "$WORK/doctor.json" 2>/dev/null)")"
  steps_json
  printf '}\n'
} >"$REPORT"
[ -n "${OUT:-}" ] && cp -r "$WORK/logs" "$OUT/amd-check-logs" 2>/dev/null

# The short table, last.
echo
echo "amd-check (never run on AMD hardware before): $CARD ($ARCH, ROCm $ROCM_VERSION), commit $COMMIT$DIRTY, $(($(date +%s) - START)) s"
steps_table
echo "tests: $TESTS_PASSED passed, $TESTS_FAILED failed, $TESTS_SKIPPED skip notes"
[ -n "$PARITY" ] && echo "demo $PARITY"
[ -f "$BENCH_JSON" ] && echo "copy bandwidth: $(grep -o '"copy_gbs": [0-9.]*' "$BENCH_JSON" | head -n 1)"
echo "report: $REPORT"
steps_exit_status
