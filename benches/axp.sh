#!/usr/bin/env bash
# benches/axp.sh: the AXP exchange at scale (issue 32, "At scale"), through the real axhost
# binary with its SQLite store (synchronous=FULL, the default), loopback only.
#
#   bash benches/axp.sh                                   # N=1000 R=10 V=2, 60 s
#   N=20 DURATION=5 bash benches/axp.sh                   # smoke run
#   SWEEP="250 500 1000 2000" DURATION=30 bash benches/axp.sh   # the largest N sustained
#
# For each N (the one N, or each of SWEEP in order) a fresh host on a fresh data directory under
# DATA_ROOT, with a maintainer and a contributor token (`axhost token add`), then axhost-axp
# (benches/load/src/bin/axp/): N sessions, each with its own executor holding a lease and
# streaming _axp/emit at R per second, V viewers per session, renewals every third of the lease,
# a settle and the next turn every SETTLE_EVERY emits. The report gives per run: emits per second
# sustained, emit reply p50/p99, emit→subscriber p50/p99/max, leases lost, errors by code, host
# RSS before setup, after setup and after the run, host and tool CPU and stolen time in the
# window, and the database's size after the run. A run is sustained when no invariant broke (no
# lease lost, no error answer, every acknowledged emit delivered to every viewer, every request
# answered), at least 95% of the offered emits were answered in the window, and the p99
# emit→subscriber latency is within P99_TARGET_MS. A sweep stops at its first run that is not
# sustained (SWEEP_ALL=1 runs them all) and names the largest N that was.
#
# Environment: N (1000), R (10), V (2), DURATION (s, 60), WARMUP (s, 2), BATCH (actions per emit,
# 1), SETTLE_EVERY (K, 50), CYCLE (start | queue), LEASE_MS (30000), P99_TARGET_MS (50), SWEEP,
# SWEEP_ALL, DATA_ROOT (where data directories go: on the disk to measure, never tmpfs; default
# /var/tmp), AXHOST (a host binary; default: build target/release/axhost), HOST_CPU / LOAD_CPU
# (taskset CPU lists; unset: not pinned), EXTRA (more axhost-axp arguments), OUT (also write the
# report to this file), KEEP=1 (keep the data directories).
# Exit status: 0 when every run held its invariants (a sweep: when some N was sustained).
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2; }
[ $# -eq 0 ] || usage
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
N=${N:-1000}
R=${R:-10}
V=${V:-2}
DURATION=${DURATION:-60}
WARMUP=${WARMUP:-2}
BATCH=${BATCH:-1}
SETTLE_EVERY=${SETTLE_EVERY:-50}
CYCLE=${CYCLE:-start}
LEASE_MS=${LEASE_MS:-30000}
P99_TARGET_MS=${P99_TARGET_MS:-50}
SWEEP=${SWEEP:-}
SWEEP_ALL=${SWEEP_ALL:-0}
DATA_ROOT=${DATA_ROOT:-/var/tmp}
HOST_CPU=${HOST_CPU:-}
LOAD_CPU=${LOAD_CPU:-}
EXTRA=${EXTRA:-}
KEEP=${KEEP:-0}
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"

vars=(N="$N" R="$R" V="$V" DURATION="$DURATION")
[ -n "$SWEEP" ] && vars=(SWEEP="$SWEEP" R="$R" V="$V" DURATION="$DURATION")
[ "$WARMUP" != 2 ] && vars+=(WARMUP="$WARMUP")
[ "$BATCH" != 1 ] && vars+=(BATCH="$BATCH")
[ "$SETTLE_EVERY" != 50 ] && vars+=(SETTLE_EVERY="$SETTLE_EVERY")
[ "$CYCLE" != start ] && vars+=(CYCLE="$CYCLE")
[ "$LEASE_MS" != 30000 ] && vars+=(LEASE_MS="$LEASE_MS")
[ -n "$EXTRA" ] && vars+=(EXTRA="$EXTRA")
COMMAND="$(printf '%q ' "${vars[@]}" bash benches/axp.sh)"
COMMAND=${COMMAND% }
pin() { if [ -n "$1" ]; then echo "taskset -c $1"; fi; }

(cd "$ROOT" && cargo build --release --quiet -p axhost-load --bin axhost-axp)
TOOL="$TARGET/release/axhost-axp"
if [ -z "${AXHOST:-}" ]; then
    (cd "$ROOT" && cargo build --release --quiet --bin axhost)
    AXHOST="$TARGET/release/axhost"
fi
[ -x "$AXHOST" ] || { echo "axp.sh: $AXHOST is not an executable" >&2; exit 2; }
AXHOST="$(cd "$(dirname "$AXHOST")" && pwd)/$(basename "$AXHOST")"

mkdir -p "$DATA_ROOT"
WORK=$(mktemp -d "$DATA_ROOT/axhost-axp.XXXXXX")
HOST_PID=
cleanup() {
    if [ -n "$HOST_PID" ]; then
        kill "$HOST_PID" 2>/dev/null || true
        wait "$HOST_PID" 2>/dev/null || true
    fi
    if [ "$KEEP" = 1 ]; then echo "axp.sh: kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
fs_type=$(df -PT "$WORK" 2>/dev/null | awk 'NR == 2 { print $2 }')
[ -n "$fs_type" ] || fs_type=$(stat -f -c %T "$WORK")
if [ "$fs_type" = tmpfs ] || [ "$fs_type" = ramfs ]; then
    echo "axp.sh: DATA_ROOT=$DATA_ROOT is $fs_type: fsync costs nothing there; point DATA_ROOT at a disk" >&2
    exit 2
fi
# One descriptor per connection on each side, and a few more.
need=$((N + 64))
for n in $SWEEP; do [ $((n + 64)) -gt "$need" ] && need=$((n + 64)); done
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
    ulimit -n "$need" 2>/dev/null || echo "axp.sh: warning: ulimit -n is $(ulimit -n), under $need" >&2
fi

stop_host() {
    local pid=$1
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 200); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    HOST_PID=
}

# field JSON NAME: one member's value (a number, a bool, or null).
field() { grep -o "\"$2\":[^,}]*" <<<"$1" | head -n 1 | cut -d: -f2- | tr -d '"'; }
ms() { awk -v v="$1" 'BEGIN { if (v == "" || v == "null") print "-"; else if (v < 10) printf "%.2f\n", v; else printf "%.1f\n", v }'; }
mib() { awk -v v="$1" 'BEGIN { if (v == "" || v == "null") print "-"; else printf "%.0f\n", v / 1024 }'; }

RAW="$WORK/raw"
ROWS="$WORK/rows"
: >"$RAW"
: >"$ROWS"
BEST=
ANY_BROKEN=0

# one_run N: a fresh host and data directory, one run of the tool; appends a table row.
RUN_N=0
one_run() {
    local n=$1 dir mtok ctok addr status json rss db errs sustained broken host_log_errors
    RUN_N=$((RUN_N + 1))
    dir="$WORK/run-$RUN_N"
    mkdir -p "$dir"
    mkdir -m 700 "$dir/data"
    mtok=$("$AXHOST" token add --data-dir "$dir/data" --id bench-maintainer --role maintainer 2>/dev/null | tail -n 1 | tr -d '[:space:]')
    ctok=$("$AXHOST" token add --data-dir "$dir/data" --id bench-contributor --role contributor 2>/dev/null | tail -n 1 | tr -d '[:space:]')
    [ -n "$mtok" ] && [ -n "$ctok" ] || { echo "axp.sh: axhost token add printed no token" >&2; return 1; }
    # shellcheck disable=SC2046
    RUST_LOG=warn $(pin "$HOST_CPU") "$AXHOST" serve --listen 127.0.0.1:0 --data-dir "$dir/data" \
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
        echo "axp.sh: $AXHOST did not print a loopback listening line; its log:" >&2
        cat "$dir/out" "$dir/log" >&2
        stop_host "$HOST_PID"
        return 1
    fi
    addr=${addr#ws://}
    echo "run $RUN_N: N=$n R=$R V=$V, ${DURATION}s (load average $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    status=0
    # shellcheck disable=SC2046,SC2086
    AXHOST_MAINTAINER_TOKEN="$mtok" AXHOST_CONTRIBUTOR_TOKEN="$ctok" \
        timeout $((WARMUP + DURATION + 600)) $(pin "$LOAD_CPU") "$TOOL" --addr "$addr" \
        --host-pid "$HOST_PID" --sessions "$n" --rate "$R" --viewers "$V" \
        --duration "${DURATION}s" --warmup "${WARMUP}s" --batch "$BATCH" \
        --settle-every "$SETTLE_EVERY" --cycle "$CYCLE" --lease-ms "$LEASE_MS" \
        --p99-target "${P99_TARGET_MS}ms" --json $EXTRA >"$dir/tool-out" 2>"$dir/tool-err" || status=$?
    host_alive=yes
    kill -0 "$HOST_PID" 2>/dev/null || host_alive="no (exited during the run)"
    stop_host "$HOST_PID"
    db=$(du -sk "$dir/data" | cut -f1)
    host_log_errors=$(grep -c -E 'ERROR|panicked' "$dir/log" || true)
    {
        echo "### run $RUN_N: N=$n (tool exit status $status, host alive at the end: $host_alive, data directory $((db / 1024)) MiB, host log: $host_log_errors ERROR/panic lines)"
        echo
        echo '```'
        grep -v '^{' "$dir/tool-out" || true
        cat "$dir/tool-err"
        if [ "$host_log_errors" -gt 0 ]; then
            echo "-- host log (first ERROR/panic lines) --"
            grep -m 10 -E 'ERROR|panicked' "$dir/log" || true
        fi
        echo '```'
        echo
    } >>"$RAW"
    json=$(grep '^{' "$dir/tool-out" || true)
    if [ -z "$json" ]; then
        echo "axp.sh: the run at N=$n failed (status $status):" >&2
        cat "$dir/tool-err" >&2
        tail -n 20 "$dir/log" >&2
        printf '| %s | failed: %s | | | | | | | | | | |\n' "$n" "$(tr '|\n' '/ ' <"$dir/tool-err" | cut -c1-200)" >>"$ROWS"
        ANY_BROKEN=1
        [ "$KEEP" = 1 ] || rm -rf "$dir"
        return 2
    fi
    echo "$json" >>"$WORK/json"
    errs=$(field "$json" error_answers)
    sustained=$(field "$json" sustained)
    broken=$(field "$json" invariants_hold)
    [ "$broken" = true ] || ANY_BROKEN=1
    printf '| %s | %s | %s / %s | %s / %s | %s / %s / %s | %s | %s | %s / %s / %s | %s / %s | %s | %s | %s |\n' \
        "$n" "$(field "$json" exec_conns)+$(field "$json" viewer_conns)+1" \
        "$(awk -v v="$(field "$json" emits_per_s)" 'BEGIN { printf "%.0f", v }')" \
        "$(awk -v v="$(field "$json" offered_per_s)" 'BEGIN { printf "%.0f", v }')" \
        "$(ms "$(field "$json" emit_reply_p50_ms)")" "$(ms "$(field "$json" emit_reply_p99_ms)")" \
        "$(ms "$(field "$json" deliver_p50_ms)")" "$(ms "$(field "$json" deliver_p99_ms)")" "$(ms "$(field "$json" deliver_max_ms)")" \
        "$(field "$json" leases_lost)" "$errs" \
        "$(mib "$(field "$json" rss_before_kib)")" "$(mib "$(field "$json" rss_setup_kib)")" "$(mib "$(field "$json" rss_after_kib)")" \
        "$(field "$json" host_cpu_pct)" "$(field "$json" tool_cpu_pct)" "$(field "$json" steal_ms)" \
        "$((db / 1024))" \
        "$([ "$sustained" = true ] && echo yes || { [ "$broken" = true ] && echo "no (p99 or rate)" || echo "no (broken)"; })" >>"$ROWS"
    [ "$KEEP" = 1 ] || rm -rf "$dir"
    [ "$sustained" = true ] && return 0
    return 3
}

commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')
dirty=$(git -C "$ROOT" status --porcelain 2>/dev/null | grep -qv '^??' && echo ' (uncommitted changes)' || true)
REPORT="$WORK/report.md"
{
    echo "# AXP exchange at scale: axhost-axp"
    echo
    echo "Command: \`$COMMAND\`"
    echo
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "- machine: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//'), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo) RAM, kernel $(uname -r)"
    echo "- axhost: \`$AXHOST\` (sha256 $(sha256sum "$AXHOST" | cut -c1-12)), tree $commit$dirty"
    echo "- data directories: $DATA_ROOT ($fs_type on $(df -P "$WORK" | awk 'NR == 2 { print $1 }')), SQLite synchronous=FULL (the host's default)"
    echo "- pinning: host ${HOST_CPU:-not pinned}, load tool ${LOAD_CPU:-not pinned}"
    echo "- per run: a fresh host and data directory; R=$R emits/s per executor, V=$V viewers per session, $BATCH action(s) per emit, a settle every $SETTLE_EVERY emits (cycle: $CYCLE), lease $LEASE_MS ms (renewed every third), $WARMUP s warmup then $DURATION s measured"
    echo "- load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$REPORT"
cat "$REPORT"

if [ -n "$SWEEP" ]; then
    for n in $SWEEP; do
        rc=0
        one_run "$n" || rc=$?
        if [ "$rc" -eq 0 ]; then
            BEST=$n
        elif [ "$SWEEP_ALL" != 1 ]; then
            break
        fi
    done
else
    rc=0
    one_run "$N" || rc=$?
    [ "$rc" -eq 0 ] && BEST=$N
fi

{
    echo
    echo "| N | connections (exec+view+maint) | emits/s sustained / offered | emit reply p50 / p99 (ms) | emit→subscriber p50 / p99 / max (ms) | leases lost | error answers | host RSS before / after setup / after run (MiB) | CPU % host / tool | stolen (ms) | data dir (MiB) | sustained |"
    echo "|---:|---|---|---|---|---:|---:|---|---|---:|---:|---|"
    cat "$ROWS"
    echo
    if [ -n "$SWEEP" ]; then
        echo "**Largest N sustained** (no invariant broken, ≥ 95% of offered emits, p99 emit→subscriber ≤ $P99_TARGET_MS ms): ${BEST:-none}."
        echo
    fi
    echo "- load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
    echo "## Runs"
    echo
    cat "$RAW"
    echo "JSON lines:"
    echo
    echo '```'
    cat "$WORK/json" 2>/dev/null || true
    echo '```'
} >>"$REPORT"
sed -n '/^| N |/,$p' "$REPORT"
if [ -n "${OUT:-}" ]; then
    mkdir -p "$(dirname "$OUT")"
    cp "$REPORT" "$OUT"
    echo "report written to $OUT" >&2
fi
if [ -n "$SWEEP" ]; then
    [ -n "$BEST" ]
else
    [ "$ANY_BROKEN" = 0 ]
fi
