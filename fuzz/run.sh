#!/usr/bin/env bash
# Fuzzes every target for SECONDS each (default 600) on the stable toolchain, then prints the
# executions per target. Usage: fuzz/run.sh [SECONDS] [TARGET...]
#
# New inputs go to fuzz/work/<target> (git-ignored), seeded from the committed fuzz/corpus/<target>,
# so a run never rewrites the committed corpus; crashes land in fuzz/artifacts/<target>.
# Needs a C++ compiler (libfuzzer-sys builds libFuzzer). Installs cargo-fuzz when missing.
set -uo pipefail
cd "$(dirname "$0")"
seconds="${1:-600}"
shift || true
source ./setup.sh "$@"

status=0
summary=()
for target in "${targets[@]}"; do
  mkdir -p "work/$target" "corpus/$target"
  log="work/$target.log"
  echo "== $target: ${seconds}s (sanitizer: $sanitizer)"
  cargo fuzz run -s "$sanitizer" "$target" "work/$target" "corpus/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=4096 -timeout=10 \
    -print_final_stats=1 >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  if [ "$rc" -ne 0 ]; then
    status=1
    summary+=("$target: FAILED after ${execs:-?} executions (see fuzz/$log and fuzz/artifacts/$target)")
    tail -40 "$log" >&2
  else
    summary+=("$target: ${execs:-?} executions in ${seconds}s, no crash")
  fi
done

echo "== summary"
printf '%s\n' "${summary[@]}"
exit "$status"
