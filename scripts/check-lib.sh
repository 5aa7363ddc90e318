# Shared by the prepared device checks (scripts/gpu-check.sh, scripts/amd-check.sh): timed steps
# within a budget, their records, and the JSON / table report. Source it after setting
#   WORK (logs go to $WORK/logs), START (epoch seconds) and BUDGET (seconds).
# Bash only; no side effects when sourced.

STEP_NAMES=()
STEP_STATUS=()
STEP_SECS=()
STEP_NOTE=()

json_str() { # a JSON string literal of $1
  local s
  s=$(printf '%s' "$1" | tr -d '\000-\010\013\014\016-\037')
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\t'/\\t}
  s=${s//$'\r'/}
  printf '"%s"' "$s"
}

record() { # name status seconds note
  STEP_NAMES+=("$1")
  STEP_STATUS+=("$2")
  STEP_SECS+=("$3")
  STEP_NOTE+=("$4")
}

left() { echo $((BUDGET - ($(date +%s) - START))); }

# run_step NAME CAP_SECONDS CMD...: runs CMD with a timeout of min(CAP, budget left), output in
# logs/NAME.log; records pass/fail/timeout. Returns the command's status.
run_step() {
  local name=$1 cap=$2
  shift 2
  local budget_left
  budget_left=$(left)
  if [ "$budget_left" -lt 10 ]; then
    record "$name" skipped 0 "time budget used up"
    return 99
  fi
  [ "$cap" -gt "$budget_left" ] && cap=$budget_left
  local t0 rc
  t0=$(date +%s)
  timeout --kill-after=10 "$cap" "$@" >"$WORK/logs/$name.log" 2>&1
  rc=$?
  local secs=$(($(date +%s) - t0))
  local note
  note=$(grep -v '^\s*$' "$WORK/logs/$name.log" | tail -n 3 | cut -c1-300)
  if [ $rc -eq 0 ]; then
    record "$name" pass "$secs" "$note"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    record "$name" timeout "$secs" "timed out after ${cap}s; $note"
  else
    record "$name" fail "$secs" "exit $rc; $note"
  fi
  return $rc
}

raw_or_null() { # a JSON value from a file/string when it looks like one
  if [ -n "$1" ] && [ "${1:0:1}" = "{" ]; then printf '%s' "$1"; else printf 'null'; fi
}

steps_json() { # the "steps" array of the report
  printf '  "steps": [\n'
  local i sep
  for i in "${!STEP_NAMES[@]}"; do
    sep=","
    [ "$i" -eq $((${#STEP_NAMES[@]} - 1)) ] && sep=""
    printf '    {"step": %s, "status": %s, "seconds": %d, "note": %s}%s\n' \
      "$(json_str "${STEP_NAMES[$i]}")" "$(json_str "${STEP_STATUS[$i]}")" "${STEP_SECS[$i]}" "$(json_str "${STEP_NOTE[$i]}")" "$sep"
  done
  printf '  ]\n'
}

steps_table() { # the short table printed last
  printf '%-16s %-10s %6s  %s\n' step status secs note
  local i
  for i in "${!STEP_NAMES[@]}"; do
    printf '%-16s %-10s %6s  %s\n' "${STEP_NAMES[$i]}" "${STEP_STATUS[$i]}" "${STEP_SECS[$i]}" "$(echo "${STEP_NOTE[$i]}" | tail -n 1 | cut -c1-110)"
  done
}

steps_exit_status() { # non-zero when any step failed or timed out (skipped is not a failure)
  local s
  for s in "${STEP_STATUS[@]}"; do
    case "$s" in fail | timeout) return 1 ;; esac
  done
  return 0
}

# `cargo <args> --release --message-format=json` -> the executables it built, one per line: test
# harnesses for `cargo test`, binaries and examples otherwise (`cargo test` also builds bins).
executables() {
  local want_test=0
  [ "$1" = test ] && want_test=1
  cargo "$@" --release --message-format=json-render-diagnostics |
    python3 -c 'import json, sys
want_test = sys.argv[1] == "1"
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"] == want_test:
        print(m["executable"])' "$want_test"
}

# pack STAGE NAME CARGO-ARGS...: builds exactly one executable and puts it, stripped, at
# STAGE/bin/NAME.
pack() {
  local stage=$1 name=$2
  shift 2
  local exe
  exe=$(executables "$@" | tail -n 1)
  if [ -z "$exe" ] || [ ! -x "$exe" ]; then
    echo "pack: cargo $* built no executable" >&2
    exit 1
  fi
  strip -o "$stage/bin/$name" "$exe" 2>/dev/null || cp "$exe" "$stage/bin/$name"
  echo "  $name <- $exe"
}
