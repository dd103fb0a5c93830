#!/usr/bin/env bash
# benches/ab.sh: A/B two axhost binaries on one load shape, alternating runs, and report the
# host's CPU time per delivered message beside the delivered rate.
#
#   bash benches/ab.sh OLD_BINARY NEW_BINARY            # 64->64, flat out, 16 frames per write
#   RUNS=5 SHAPE="1 1 max 1" bash benches/ab.sh A B     # senders receivers rate batch
#   CONFIG_B='busy_poll_us = 0' SHAPE="1 1 100k 1" bash benches/ab.sh BIN BIN   # one binary, two configs
#
# Why CPU per message: on a small shared VM the delivered rate of one flat-out run moves by
# 20-30% from run to run (the load tool and the server compete with the hypervisor), while the
# host's user and system time per delivered message moves far less, and it is what an
# optimisation changes. The host runs on CPU 0 and the load tool on CPU 1, as in compare.sh;
# CPU time is read from /proc/PID/stat over seconds 2-4 of each run.
#
# Each line also gives the run's latency p50 / p99 (µs, from the sender's stamp: the scheduled send
# time when spinning, the write when sleeping), for
# A/Bs at a fixed rate, where the CPU figures matter less than the tail, and the p99 at the
# receiving socket (the kernel's receive timestamp: without the load tool's wait before reading).
#
# Environment: RUNS (3), DURATION (s, 5), SHAPE ("64 64 max 16"), PACE (spin or sleep, the load
# tool's pace at a fixed rate; spin), SERVER_CPU (0), LOAD_CPU (1), CONFIG_A / CONFIG_B (lines of
# axhost.toml for that side's host, e.g. 'busy_poll_us = 0').
set -euo pipefail

[ $# -eq 2 ] || { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=${RUNS:-3}
DURATION=${DURATION:-5}
read -r SENDERS RECEIVERS RATE BATCH <<<"${SHAPE:-64 64 max 16}"
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
PACE=${PACE:-spin}
(( DURATION >= 5 )) || { echo "ab.sh: DURATION must be at least 5 (CPU is sampled over seconds 2-4)" >&2; exit 2; }

(cd "$ROOT" && cargo build --release --quiet -p axhost-load)
LOAD="${CARGO_TARGET_DIR:-$ROOT/target}/release/axhost-load"
TICK=$(getconf CLK_TCK)

one_run() {
    local bin=$1 config=$2 tmp pid line addr token out a b rate p50 p99 sp99
    tmp=$(mktemp -d -t axhost-ab.XXXXXX)
    mkdir -m 700 "$tmp/data"
    token=$("$bin" token add --data-dir "$tmp/data" --id load --role maintainer 2>/dev/null | tail -n 1 | tr -d '[:space:]')
    if [ -n "$config" ]; then
        # Top-level keys go before the file's first table.
        { printf '%s\n' "$config"; cat "$tmp/data/axhost.toml"; } >"$tmp/config"
        cat "$tmp/config" >"$tmp/data/axhost.toml" # rewritten in place: keeps the file's mode
    fi
    RUST_LOG=warn taskset -c "$SERVER_CPU" "$bin" serve --listen 127.0.0.1:0 --data-dir "$tmp/data" \
        >"$tmp/out" 2>"$tmp/log" &
    pid=$!
    for _ in $(seq 1 200); do
        line=$(grep -m1 -o 'ws://[0-9.]*:[0-9]*' "$tmp/out" 2>/dev/null || true)
        [ -n "$line" ] && break
        sleep 0.05
    done
    addr=${line#ws://}
    ( sleep 2; awk '{print $14, $15}' "/proc/$pid/stat" >"$tmp/a"; sleep 2; awk '{print $14, $15}' "/proc/$pid/stat" >"$tmp/b" ) &
    out=$(AXHOST_TOKEN="$token" taskset -c "$LOAD_CPU" "$LOAD" --target axhost --addr "$addr" \
        --senders "$SENDERS" --receivers "$RECEIVERS" --rate "$RATE" --batch "$BATCH" --pace "$PACE" \
        --duration "${DURATION}s" --warmup 1s)
    wait %2 2>/dev/null || true
    kill "$pid"; wait "$pid" 2>/dev/null || true
    rate=$(grep -o 'delivered [0-9]*' <<<"$out" | awk '{print $2}')
    p50=$(grep -o 'p50 [0-9.]*' <<<"$out" | head -n 1 | awk '{print $2}')
    p99=$(grep -o 'p99 [0-9.]*' <<<"$out" | head -n 1 | awk '{print $2}')
    sp99=$(grep -o 'at the socket p50 [0-9.]* µs p99 [0-9.]*' <<<"$out" | awk '{print $NF}')
    read -r ua sa <"$tmp/a"; read -r ub sb <"$tmp/b"
    rm -rf "$tmp"
    # user and system nanoseconds per delivered message over the 2 s window, and the rate
    awk -v u=$((ub - ua)) -v s=$((sb - sa)) -v r="$rate" -v t="$TICK" -v p50="$p50" -v p99="$p99" -v sp99="${sp99:--}" 'BEGIN {
        un = u / t / 2 * 1e9 / r; sn = s / t / 2 * 1e9 / r;
        printf "%.3f M/s  user %4.0f ns/msg  sys %4.0f ns/msg  total %4.0f ns/msg  cpu %3.0f%%  p50 %s µs  p99 %s µs  socket p99 %s µs\n", r / 1e6, un, sn, un + sn, (u + s) / t / 2 * 100, p50, p99, sp99 }'
}

echo "shape: $SENDERS->$RECEIVERS rate=$RATE batch=$BATCH pace=$PACE, $RUNS runs each, alternating"
[ -z "${CONFIG_A:-}" ] || echo "A config: $CONFIG_A"
[ -z "${CONFIG_B:-}" ] || echo "B config: $CONFIG_B"
for run in $(seq 1 "$RUNS"); do
    for side in A B; do
        if [ "$side" = A ]; then
            bin=$1 config=${CONFIG_A:-}
        else
            bin=$2 config=${CONFIG_B:-}
        fi
        printf '%s run %d: ' "$side" "$run"
        one_run "$bin" "$config"
    done
done
