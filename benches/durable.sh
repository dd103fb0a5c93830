#!/usr/bin/env bash
# benches/durable.sh: durable writes and the request latency beside them (issue 31 §5), for one
# axhost binary or two side by side, with the real SQLite store (synchronous=FULL), loopback only.
#
#   bash benches/durable.sh OLD_BINARY NEW_BINARY
#   bash benches/durable.sh BINARY
#   DURATION=2 REPS=1 bash benches/durable.sh BINARY        # smoke run, under a minute
#   CONFIG_A=$'[tuning]\nwriter_spin_us = 0' bash benches/durable.sh BIN BIN   # one binary, two configs
#
# Configurations (axhost-durable, benches/load/src/bin/durable/): C = 1, 8, 64 writers, each on
# its own session dispatching closed-loop (chat/turnStarted, then chat/turnCancelled, each after
# the echo of the one before); a client-service request/response pair alone ("quiet"); the same
# pair beside 16 writers. Every run gets a fresh host on a fresh data directory. Each rep runs
# every configuration once per binary, the two binaries back to back, in an order that swaps
# from rep to rep, so a drifting machine weighs on both alike. The table gives the median over
# the reps of each figure, and the ratios the issue's targets use, from those medians.
#
# Before the first run and after the last, a probe times bare single-row SQLite commits (WAL,
# synchronous=FULL) in DATA_ROOT: the ceiling for one writer whose every change is its own
# commit. A C=1 rate well above it means changes were answered before they were durable, or the
# data directories are not on the disk that was probed.
#
# Environment: DURATION (s per run, 5), WARMUP (s, 1), REPS (3), DATA_ROOT (where the temporary
# data directories go: on the disk to measure, never tmpfs; default $TMPDIR or /tmp), HOST_CPU /
# LOAD_CPU (taskset CPU lists for the host and the load tool; unset: not pinned), REQUEST_GAP
# (the requester's wait after each response, e.g. 1ms; default 0s: back to back, which keeps the
# host awake), PROBE (0 skips the SQLite probe), OUT (also write the report to this file),
# CONFIG_A / CONFIG_B (lines appended to that side's axhost.toml).
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2; }
[ $# -ge 1 ] && [ $# -le 2 ] || usage
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DURATION=${DURATION:-5}
WARMUP=${WARMUP:-1}
REPS=${REPS:-3}
DATA_ROOT=${DATA_ROOT:-${TMPDIR:-/tmp}}
PROBE=${PROBE:-1}
HOST_CPU=${HOST_CPU:-}
LOAD_CPU=${LOAD_CPU:-}
REQUEST_GAP=${REQUEST_GAP:-0s}
COMMAND="$(printf '%q ' "DURATION=$DURATION" "WARMUP=$WARMUP" "REPS=$REPS" "DATA_ROOT=$DATA_ROOT" bash benches/durable.sh "$@")"
COMMAND=${COMMAND% }

BINS=()
for b in "$@"; do
    [ -x "$b" ] || { echo "durable.sh: $b is not an executable" >&2; exit 2; }
    BINS+=("$(cd "$(dirname "$b")" && pwd)/$(basename "$b")")
done
SIDES=(A B)
SIDES=("${SIDES[@]:0:${#BINS[@]}}")
CONFIGS=(w1 w8 w64 quiet loaded)
declare -A CONFIG_ARGS=(
    [w1]="--writers 1"
    [w8]="--writers 8"
    [w64]="--writers 64"
    [quiet]="--writers 0 --requests"
    [loaded]="--writers 16 --requests"
)
pin() { if [ -n "$1" ]; then echo "taskset -c $1"; fi; }

(cd "$ROOT" && cargo build --release --quiet -p axhost-load --bin axhost-durable)
TOOL="${CARGO_TARGET_DIR:-$ROOT/target}/release/axhost-durable"

mkdir -p "$DATA_ROOT"
WORK=$(mktemp -d "$DATA_ROOT/axhost-durable.XXXXXX")
HOST_PID=
cleanup() {
    if [ -n "$HOST_PID" ]; then
        kill "$HOST_PID" 2>/dev/null || true
        wait "$HOST_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fs_type=$(df -PT "$WORK" 2>/dev/null | awk 'NR == 2 { print $2 }')
[ -n "$fs_type" ] || fs_type=$(stat -f -c %T "$WORK")
if [ "$fs_type" = tmpfs ] || [ "$fs_type" = ramfs ]; then
    echo "durable.sh: DATA_ROOT=$DATA_ROOT is $fs_type: fsync costs nothing there; point DATA_ROOT at a disk" >&2
    exit 2
fi

stop_host() {
    local pid=$1
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    HOST_PID=
}

# one_run BIN CONFIG RESULT SIDE: writes the tool's JSON line to RESULT. (Not run in a command
# substitution: the host's pid must stay in this shell for the exit trap.)
RUN_N=0
one_run() {
    local bin=$1 config=$2 result=$3 side=$4 dir token addr out status extra
    RUN_N=$((RUN_N + 1))
    dir="$WORK/run-$RUN_N"
    mkdir -p "$dir"
    mkdir -m 700 "$dir/data"
    token=$("$bin" token add --data-dir "$dir/data" --id load --role maintainer 2>/dev/null | tail -n 1 | tr -d '[:space:]')
    [ -n "$token" ] || { echo "durable.sh: $bin token add printed no token" >&2; return 1; }
    extra="CONFIG_$side"
    if [ -n "${!extra:-}" ]; then
        printf '%s\n' "${!extra}" >>"$dir/data/axhost.toml"
    fi
    # shellcheck disable=SC2046
    RUST_LOG=warn $(pin "$HOST_CPU") "$bin" serve --listen 127.0.0.1:0 --data-dir "$dir/data" \
        >"$dir/out" 2>"$dir/log" </dev/null &
    HOST_PID=$!
    addr=
    for _ in $(seq 1 200); do
        addr=$(grep -m1 -o 'ws://127\.0\.0\.1:[0-9]*' "$dir/out" 2>/dev/null || true)
        [ -n "$addr" ] && break
        kill -0 "$HOST_PID" 2>/dev/null || break
        sleep 0.05
    done
    if [ -z "$addr" ]; then
        echo "durable.sh: $bin did not print a loopback listening line; its log:" >&2
        cat "$dir/out" "$dir/log" >&2
        stop_host "$HOST_PID"
        return 1
    fi
    addr=${addr#ws://}
    status=0
    # shellcheck disable=SC2046,SC2086
    out=$(AXHOST_TOKEN="$token" timeout $((WARMUP + DURATION + 60)) $(pin "$LOAD_CPU") "$TOOL" \
        --addr "$addr" ${CONFIG_ARGS[$config]} --duration "${DURATION}s" --warmup "${WARMUP}s" \
        --request-gap "$REQUEST_GAP" --json 2>"$dir/tool-err") || status=$?
    stop_host "$HOST_PID"
    if [ "$status" -ne 0 ]; then
        echo "durable.sh: axhost-durable failed ($status) on $bin, $config:" >&2
        cat "$dir/tool-err" >&2
        echo "host log:" >&2
        tail -n 20 "$dir/log" >&2
        return 1
    fi
    rm -rf "$dir"
    grep '^{' <<<"$out" >"$result"
}

probe() {
    "$TOOL" --sqlite-probe "$WORK" --warmup 0.5s --duration 3s --json | grep '^{'
}

# field JSON NAME: one member's value (a number, or null).
field() { grep -o "\"$2\":[^,}]*" <<<"$1" | head -n 1 | cut -d: -f2; }
# median of the numbers on stdin ("-" when there are none)
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
# fmt_us MICROSECONDS
fmt_us() {
    awk -v v="$1" 'BEGIN {
        if (v == "-" || v == "null") print "-";
        else if (v < 1000) printf "%.0f µs\n", v;
        else if (v < 10000) printf "%.2f ms\n", v / 1000;
        else printf "%.1f ms\n", v / 1000 }'
}
fmt_rate() { awk -v v="$1" 'BEGIN { if (v == "-") print "-"; else printf "%.0f\n", v }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-"; else printf "%.2f×\n", a / b }'; }

REPORT="$WORK/report.md"
RAW="$WORK/raw"
: >"$RAW"
{
    echo "# Durable writes: axhost-durable"
    echo
    echo "Command: \`$COMMAND\`"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- machine: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs, kernel $(uname -r)"
    echo "- data directories: $DATA_ROOT ($fs_type on $(df -P "$WORK" | awk 'NR == 2 { print $1 }'))"
    echo "- pinning: host ${HOST_CPU:-not pinned}, load tool ${LOAD_CPU:-not pinned}"
    if [ "$REQUEST_GAP" = 0s ]; then echo "- requests back to back"; else echo "- requests $REQUEST_GAP apart"; fi
    echo "- load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    for i in "${!BINS[@]}"; do
        extra="CONFIG_${SIDES[$i]}"
        [ -z "${!extra:-}" ] || echo "- ${SIDES[$i]} config: \`$(tr '\n' ' ' <<<"${!extra}")\`"
        echo "- ${SIDES[$i]}: \`${BINS[$i]}\` (sha256 $(sha256sum "${BINS[$i]}" | cut -c1-12), built $(date -u -r "${BINS[$i]}" '+%Y-%m-%d %H:%M UTC'))"
    done
    echo "- $DURATION s per run after $WARMUP s of warmup, $REPS reps; each run a fresh host on a fresh data directory"
} >"$REPORT"
cat "$REPORT"

probe_before=-
probe_after=-
if [ "$PROBE" != 0 ]; then
    p=$(probe)
    echo "probe before: $p" >>"$RAW"
    probe_before=$(field "$p" commits_per_s)
fi

for rep in $(seq 1 "$REPS"); do
    echo "rep $rep (load average $(cut -d' ' -f1-3 /proc/loadavg))" | tee -a "$RAW" >&2
    for config in "${CONFIGS[@]}"; do
        order=("${!BINS[@]}")
        if [ "${#BINS[@]}" -eq 2 ] && [ $((rep % 2)) -eq 0 ]; then order=(1 0); fi
        for i in "${order[@]}"; do
            one_run "${BINS[$i]}" "$config" "$WORK/line" "${SIDES[$i]}"
            line=$(cat "$WORK/line")
            echo "${SIDES[$i]} $config $line" | tee -a "$RAW" >&2
            echo "$line" >>"$WORK/${SIDES[$i]}.$config"
        done
    done
done

if [ "$PROBE" != 0 ]; then
    p=$(probe)
    echo "probe after: $p" >>"$RAW"
    probe_after=$(field "$p" commits_per_s)
fi

# med SIDE CONFIG FIELD: the median of FIELD over the reps.
med() { while read -r l; do field "$l" "$3"; done <"$WORK/$1.$2" | { grep -v null || true; } | median; }

{
    echo
    printf '| figure (median of %s reps) |' "$REPS"
    for s in "${SIDES[@]}"; do printf ' %s |' "$s"; done
    echo
    printf '|---|'
    for _ in "${SIDES[@]}"; do printf -- '---:|'; done
    echo
    for c in 1 8 64; do
        printf '| durable changes/s, C=%s |' "$c"
        for s in "${SIDES[@]}"; do printf ' %s |' "$(fmt_rate "$(med "$s" "w$c" changes_per_s)")"; done
        echo
        printf '| echo p50 / p99, C=%s |' "$c"
        for s in "${SIDES[@]}"; do
            printf ' %s / %s |' "$(fmt_us "$(med "$s" "w$c" echo_p50_us)")" "$(fmt_us "$(med "$s" "w$c" echo_p99_us)")"
        done
        echo
    done
    printf '| request p50 / p99, quiet |'
    for s in "${SIDES[@]}"; do
        printf ' %s / %s |' "$(fmt_us "$(med "$s" quiet request_p50_us)")" "$(fmt_us "$(med "$s" quiet request_p99_us)")"
    done
    echo
    printf '| request p50 / p99, beside 16 writers |'
    for s in "${SIDES[@]}"; do
        printf ' %s / %s |' "$(fmt_us "$(med "$s" loaded request_p50_us)")" "$(fmt_us "$(med "$s" loaded request_p99_us)")"
    done
    echo
    printf '| durable changes/s of those 16 writers |'
    for s in "${SIDES[@]}"; do printf ' %s |' "$(fmt_rate "$(med "$s" loaded changes_per_s)")"; done
    echo
    printf '| **rate at C=64 ÷ rate at C=1** (target ≥ 8×) |'
    for s in "${SIDES[@]}"; do
        printf ' %s |' "$(ratio "$(med "$s" w64 changes_per_s)" "$(med "$s" w1 changes_per_s)")"
    done
    echo
    printf '| **request p99 beside 16 writers ÷ quiet p99** (target ≤ 3×) |'
    for s in "${SIDES[@]}"; do
        printf ' %s |' "$(ratio "$(med "$s" loaded request_p99_us)" "$(med "$s" quiet request_p99_us)")"
    done
    echo
    if [ "$PROBE" != 0 ]; then
        echo
        echo "Bare SQLite commits in the data directories' file system (one 200-byte row each, WAL, synchronous=FULL):"
        echo "$(fmt_rate "$probe_before")/s before the first run, $(fmt_rate "$probe_after")/s after the last."
        for s in "${SIDES[@]}"; do
            awk -v r="$(med "$s" w1 changes_per_s)" -v p="$probe_before" -v q="$probe_after" -v s="$s" 'BEGIN {
                m = (p > q) ? p : q;
                if (r != "-" && m > 0 && r > 1.2 * m)
                    printf "**Warning:** %s at C=1 (%.0f changes/s) is over 1.2× the bare commit rate: changes answered before they were durable?\n", s, r }'
        done
    fi
    echo
    echo "- load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
    echo "Runs (side, configuration, the tool's JSON line):"
    echo
    echo '```'
    cat "$RAW"
    echo '```'
} >>"$REPORT"
sed -n '/^| figure/,$p' "$REPORT"
if [ -n "${OUT:-}" ]; then
    cp "$REPORT" "$OUT"
    echo "report written to $OUT" >&2
fi
