#!/usr/bin/env bash
# benches/compare.sh: axhost client-service notifications vs Redis pub/sub vs NATS, point to
# point, same payload (200 B), same load tool (benches/load, `axhost-load`), same machine.
#
#   bash benches/compare.sh            # 3 reps x 10 s per case, medians
#   DURATION=2 REPS=1 bash benches/compare.sh   # smoke run
#   bash benches/compare.sh --long     # also: axhost RSS before/after a 60 s max-rate run
#
# Environment overrides: DURATION (s, default 10), REPS (3), WARMUP (s, 1), SYSTEMS
# ("axhost redis nats"), SHAPES ("1x1 1x16 16x16 64x64"), RATES ("10k 100k max"),
# SIZE (payload bytes, 200), SERVER_CPU (0), LOAD_CPU (1; a taskset list such as 1-3 on a larger
# machine), LOAD_THREADS (1; one per CPU in LOAD_CPU), LONG_SECONDS (60), OUT (result file),
# PROBE (1; 0 runs without the stall probe beside each run), MACHINE_CHECK (8: seconds per step
# of the busy-CPU pause check before and after the runs; 0 skips it), PACE (spin: the tool spins
# until each message is due and stamps it with its scheduled time; sleep: it sleeps and sends
# what is due in bursts, each stamped as it is built, so its CPU idles between bursts), SLEEP_MIN
# (1ms: the sleeping tool's shortest sleep, so its bursts are the rate times this; e.g. 100us),
# LOAD_BIN (another build of axhost-load instead of the one this script builds), MAX_BATCHES
# (frames per write for extra flat-out cases at every shape, e.g. "16"; 64→64 at 16 is always
# run when 64x64 and max are: it is a target row).
#
# Latency is reported twice: to the tool's read (what an application sees) and to the receiving
# socket (the kernel's receive timestamp, Linux): the second leaves out the time messages wait in
# the socket for the one-CPU tool to read them.
#
# Every server runs pinned to SERVER_CPU, the load tool to LOAD_CPU. Every run gets a fresh
# server, and the systems take turns case by case (order rotated), so a VM that drifts over
# the run weighs on all alike; every server this script starts is stopped on exit.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DURATION=${DURATION:-10}
REPS=${REPS:-3}
WARMUP=${WARMUP:-1}
SYSTEMS=${SYSTEMS:-"axhost redis nats"}
SHAPES=${SHAPES:-"1x1 1x16 16x16 64x64"}
RATES=${RATES:-"10k 100k max"}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
LOAD_THREADS=${LOAD_THREADS:-1}
LONG_SECONDS=${LONG_SECONDS:-60}
SIZE=${SIZE:-200}
PROBE=${PROBE:-1}
MACHINE_CHECK=${MACHINE_CHECK:-8}
PACE=${PACE:-spin}
SLEEP_MIN=${SLEEP_MIN:-1ms}
MAX_BATCHES=${MAX_BATCHES:-}
LONG=0

for arg in "$@"; do
    case "$arg" in
        --long) LONG=1 ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "compare.sh: unknown argument $arg (try --help)" >&2; exit 2 ;;
    esac
done

log() { echo "compare.sh: $*" >&2; }
die() { log "$*"; exit 1; }
case "$PACE" in spin|sleep) ;; *) die "PACE must be spin or sleep, not $PACE" ;; esac

# ---------------------------------------------------------------------------------------------
# Servers: install if missing, without leaving a distro-started one in the way.
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v nats-server >/dev/null 2>&1 || missing+=(nats-server)
command -v taskset >/dev/null 2>&1 || missing+=(util-linux)
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    # The packages may start their own service on the default ports; we use our own instances.
    for svc in redis-server nats-server; do
        if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
            $SUDO systemctl stop "$svc" || true
            $SUDO systemctl disable "$svc" >/dev/null 2>&1 || true
        elif command -v service >/dev/null 2>&1; then
            $SUDO service "$svc" stop >/dev/null 2>&1 || true
        fi
    done
fi

# ---------------------------------------------------------------------------------------------
# Build.
log "building axhost and axhost-load (release)"
(cd "$ROOT" && cargo build --release --quiet -p axhost --bin axhost && cargo build --release --quiet -p axhost-load)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
AXHOST="$TARGET_DIR/release/axhost"
LOAD=${LOAD_BIN:-$TARGET_DIR/release/axhost-load}
PROBE_BIN="$TARGET_DIR/release/axhost-stall-probe"
[ -x "$AXHOST" ] && [ -x "$LOAD" ] && [ -x "$PROBE_BIN" ] || die "release binaries not found under $TARGET_DIR/release"

# The stall probe runs beside every run on the server's CPU and the (first) load CPU, at a
# real-time priority when the kernel allows it, so that a late wake is the machine's pause and
# not a busy server's turn. Without the priority it would mostly measure the server.
PROBE_SERVER_CPU=$SERVER_CPU
PROBE_LOAD_CPU=${LOAD_CPU%%[,-]*}
PROBE_PRIO=()
if [ "$PROBE" = 1 ]; then
    if chrt -f 50 true 2>/dev/null; then
        PROBE_PRIO=(chrt -f 50)
    elif $SUDO chrt -f 50 true 2>/dev/null; then
        PROBE_PRIO=($SUDO chrt -f 50)
    else
        log "chrt -f refused: no stall probe (set PROBE=0 to silence this)"
        PROBE=0
    fi
fi

TMP=$(mktemp -d -t axhost-compare.XXXXXX)
SERVER_PID=""
PROBE_PIDS=()
cleanup() {
    local pid
    for pid in "${PROBE_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    SERVER_PID=""
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

stop_server() {
    if [ -n "$SERVER_PID" ]; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
    fi
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# A port below the kernel's ephemeral range: the load tool's own sockets (and the thousands it
# leaves in TIME_WAIT over a full run) take their local ports from that range, and a server
# asked to listen on one of those fails to bind.
free_port() {
    local p low
    low=$(awk '{print $1}' /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
    [ "$low" -gt 11024 ] || die "ephemeral port range starts at $low: no room below it for servers"
    for _ in $(seq 1 200); do
        p=$((10000 + RANDOM % (low - 10000)))
        if ! port_open "$p"; then echo "$p"; return 0; fi
    done
    die "no free port found"
}

# wait_port PORT: 0 once the server listens on PORT, 1 if it exited first; dies after 10 s.
wait_port() {
    local port=$1
    for _ in $(seq 1 200); do
        port_open "$port" && return 0
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            wait "$SERVER_PID" 2>/dev/null || true
            SERVER_PID=""
            return 1
        fi
        sleep 0.05
    done
    die "server did not listen on $port within 10 s"
}

ADDR=""
TOKEN=""
start_axhost() {
    local data="$TMP/axhost-data"
    rm -rf "$data"
    mkdir -m 700 -p "$data"
    TOKEN=$("$AXHOST" token add --data-dir "$data" --id load --role maintainer | tail -n 1 | tr -d '[:space:]')
    [ -n "$TOKEN" ] || die "axhost token add printed no token"
    RUST_LOG=${AXHOST_RUST_LOG:-warn} taskset -c "$SERVER_CPU" "$AXHOST" serve --listen 127.0.0.1:0 \
        --data-dir "$data" >"$TMP/axhost.out" 2>"$TMP/axhost.log" &
    SERVER_PID=$!
    local line=""
    for _ in $(seq 1 200); do
        line=$(grep -m1 -o 'ws://[0-9.]*:[0-9]*' "$TMP/axhost.out" 2>/dev/null || true)
        [ -n "$line" ] && break
        kill -0 "$SERVER_PID" 2>/dev/null || die "axhost exited at start: $(tail -n 5 "$TMP/axhost.log")"
        sleep 0.05
    done
    [ -n "$line" ] || die "axhost printed no listening line within 10 s"
    ADDR=${line#ws://}
}

# start_listening NAME COMMAND...: starts a server whose command line ends in its port (the
# literal word PORT is replaced), pinned to SERVER_CPU; a start that fails (a port taken between
# the check and the bind) is retried on another port.
start_listening() {
    local name=$1 port attempt
    shift
    for attempt in 1 2 3; do
        port=$(free_port)
        taskset -c "$SERVER_CPU" "${@/#PORT/$port}" >"$TMP/$name.log" 2>&1 &
        SERVER_PID=$!
        if wait_port "$port"; then
            ADDR="127.0.0.1:$port"
            return 0
        fi
        log "$name exited at start on port $port (attempt $attempt): $(tail -n 2 "$TMP/$name.log")"
    done
    die "$name would not start"
}

start_redis() {
    start_listening redis redis-server --port PORT --bind 127.0.0.1 --save '' --appendonly no \
        --daemonize no --logfile ""
}

start_nats() {
    start_listening nats nats-server -a 127.0.0.1 -p PORT
}

# ---------------------------------------------------------------------------------------------
# Cases: "SENDERSxRECEIVERS RATE BATCH".
CASES=()
for shape in $SHAPES; do
    for rate in $RATES; do CASES+=("$shape $rate 1"); done
done
case " $SHAPES " in *" 64x64 "*) case " $RATES " in *" max "*) CASES+=("64x64 max 16") ;; esac ;; esac
# Flat out with batching senders: the tool's cost per write (one syscall per message, the whole
# loopback path on its CPU) caps one-frame-per-write runs near the same rate for every server.
case " $RATES " in
    *" max "*)
        for batch in $MAX_BATCHES; do
            [[ "$batch" =~ ^[1-9][0-9]*$ ]] || die "MAX_BATCHES: $batch is not a frame count"
            for shape in $SHAPES; do
                [ "$batch" = 1 ] || [ "$shape $batch" = "64x64 16" ] || CASES+=("$shape max $batch")
            done
        done
        ;;
esac

# system case rep sent_per_s delivered_per_s p50 p99 p999 max lost lag_p99 steal_ms
# stall_server_ms stall_load_ms socket_p50 socket_p99 slowed_server_ms slowed_load_ms
RESULTS="$TMP/results.tsv"
: >"$RESULTS"

# CPU time the hypervisor gave to other guests (steal), both CPUs, in ms since boot. A stall of
# a few ms on either CPU delays every message in flight, so each run records how much it saw.
steal_ms() { awk -v hz="$(getconf CLK_TCK)" '/^cpu / {print int($9 * 1000 / hz)}' /proc/stat; }

# Reads one field of the tool's flat JSON line.
jfield() { sed -n "s/.*\"$1\":\"\{0,1\}\([^,\"}]*\).*/\1/p" <<<"$2"; }
# A latency to the socket: "-" where the kernel gave no receive timestamps (null).
socket_us() { local v; v=$(jfield "$1" "$2"); [ -n "$v" ] && [ "$v" != null ] && echo "$v" || echo "-"; }

# start_probes SECONDS: one stall probe on the server's CPU and one on the load tool's, in the
# background, each writing its JSON line to $TMP/probe.CPU. stalled_ms CPU: what that probe
# measured ("-" without one).
start_probes() {
    [ "$PROBE" = 1 ] || return 0
    local cpu
    for cpu in "$PROBE_SERVER_CPU" "$PROBE_LOAD_CPU"; do
        taskset -c "$cpu" "${PROBE_PRIO[@]}" "$PROBE_BIN" --duration-us "$(($1 * 1000000))" \
            >"$TMP/probe.$cpu" 2>/dev/null &
        PROBE_PIDS+=($!)
    done
}
wait_probes() {
    local pid
    for pid in "${PROBE_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    PROBE_PIDS=()
}
stalled_ms() {
    local v=""
    [ "$PROBE" = 1 ] && v=$(jfield stalled_ms "$(cat "$TMP/probe.$1" 2>/dev/null)")
    echo "${v:--}"
}
# slowed_ms CPU: how long that probe found the CPU running at under half speed (its work units
# took over twice their median; sampled once per tick), "-" without one.
slowed_ms() {
    local v=""
    [ "$PROBE" = 1 ] && v=$(jfield slowed_ms "$(cat "$TMP/probe.$1" 2>/dev/null)")
    echo "${v:--}"
}

# machine_check LABEL: how long the machine pauses a CPU kept busy (`--spin`), first the
# server's CPU alone, then the load CPU alone, then both at once. On the VM the published results
# come from, two busy vCPUs lost ~10x the time one did, and a run at 100k/s keeps both busy
# (the tool paces by spinning; a server at that rate is mostly busy too), so the report carries
# this beside the runs. Normal priority: a real-time task that never sleeps is throttled by the
# kernel, which would read as a pause. Appends one line per step to $TMP/machine.
machine_check() {
    [ "$MACHINE_CHECK" -gt 0 ] 2>/dev/null || return 0
    local label=$1 us=$((MACHINE_CHECK * 1000000)) a b
    log "machine check ($label): ${MACHINE_CHECK} s per step"
    # A failed step reads "failed" in the report; it does not stop the comparison.
    taskset -c "$PROBE_SERVER_CPU" "$PROBE_BIN" --spin --duration-us "$us" >"$TMP/check.a" || true
    taskset -c "$PROBE_LOAD_CPU" "$PROBE_BIN" --spin --duration-us "$us" >"$TMP/check.b" || true
    echo "$label|CPU $PROBE_SERVER_CPU busy alone|$(check_cell "$TMP/check.a")" >>"$TMP/machine"
    echo "$label|CPU $PROBE_LOAD_CPU busy alone|$(check_cell "$TMP/check.b")" >>"$TMP/machine"
    taskset -c "$PROBE_SERVER_CPU" "$PROBE_BIN" --spin --duration-us "$us" >"$TMP/check.a" &
    a=$!
    taskset -c "$PROBE_LOAD_CPU" "$PROBE_BIN" --spin --duration-us "$us" >"$TMP/check.b" &
    b=$!
    # Known to cleanup, so an interrupted check does not leave two CPUs spinning.
    PROBE_PIDS+=("$a" "$b")
    wait "$a" || true
    wait "$b" || true
    PROBE_PIDS=()
    echo "$label|CPUs $PROBE_SERVER_CPU and $PROBE_LOAD_CPU busy at once|$(check_cell "$TMP/check.a") / $(check_cell "$TMP/check.b")" >>"$TMP/machine"
    log "  $(tail -n 3 "$TMP/machine" | cut -d'|' -f2- | paste -sd ';')"
}
check_cell() {
    local j
    j=$(cat "$1" 2>/dev/null)
    [ -n "$(jfield stalled_ms "$j")" ] || { echo "failed"; return 0; }
    echo "$(jfield stalled_ms "$j") ms (pauses: $(jfield stalls_over_500us "$j"), worst $(awk -v v="$(jfield max_us "$j")" 'BEGIN { printf "%.1f", v / 1000 }') ms; under half speed $(jfield slowed_ms "$j") ms)"
}

run_case() {
    local system=$1 shape=$2 rate=$3 batch=$4 rep=$5 duration=$6
    local senders=${shape%x*} receivers=${shape#*x}
    local out json steal0 load_ok=1
    steal0=$(steal_ms)
    # The probes cover warmup and window; the tool's setup before them is short.
    start_probes $((WARMUP + duration))
    if ! out=$(AXHOST_TOKEN="$TOKEN" taskset -c "$LOAD_CPU" "$LOAD" --target "$system" --addr "$ADDR" \
        --senders "$senders" --receivers "$receivers" --rate "$rate" --batch "$batch" --size "$SIZE" \
        --pace "$PACE" --sleep-min "$SLEEP_MIN" --threads "$LOAD_THREADS" --duration "${duration}s" --warmup "${WARMUP}s" --json 2>"$TMP/load.err"); then
        load_ok=0
    fi
    wait_probes
    if [ "$load_ok" = 0 ]; then
        log "  $system $shape rate=$rate batch=$batch rep $rep FAILED: $(tail -n 3 "$TMP/load.err")"
        printf '%s\t%s\t%s\tERR\tERR\tERR\tERR\tERR\tERR\tERR\tERR\tERR\tERR\tERR\tERR\tERR\tERR\tERR\n' "$system" "$shape/$rate/$batch" "$rep" >>"$RESULTS"
        return 0
    fi
    log "  $(head -n 1 <<<"$out")"
    json=$(grep '^{' <<<"$out" | tail -n 1)
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$system" "$shape/$rate/$batch" "$rep" \
        "$(jfield sent_per_s "$json")" "$(jfield delivered_per_s "$json")" "$(jfield p50_us "$json")" \
        "$(jfield p99_us "$json")" "$(jfield p999_us "$json")" "$(jfield max_us "$json")" \
        "$(jfield lost "$json")" "$(jfield lag_p99_us "$json")" "$(( $(steal_ms) - steal0 ))" \
        "$(stalled_ms "$PROBE_SERVER_CPU")" "$(stalled_ms "$PROBE_LOAD_CPU")" \
        "$(socket_us socket_p50_us "$json")" "$(socket_us socket_p99_us "$json")" \
        "$(slowed_ms "$PROBE_SERVER_CPU")" "$(slowed_ms "$PROBE_LOAD_CPU")" >>"$RESULTS"
}

# Every run gets a fresh server, so nothing a case leaves behind (queued bytes, grown buffers,
# heap) reaches the next one. The systems take turns case by case, and the order rotates with
# the case and the rep, so each system goes first equally often: on a shared VM whose speed
# drifts over the minutes a full run takes, the drift weighs on all three alike instead of on
# whichever system ran last.
read -r -a SYSTEM_LIST <<<"$SYSTEMS"
for system in "${SYSTEM_LIST[@]}"; do
    declare -F "start_$system" >/dev/null || die "unknown system $system (axhost, redis, nats)"
done
n_systems=${#SYSTEM_LIST[@]}
machine_check before
for rep in $(seq 1 "$REPS"); do
    for i in "${!CASES[@]}"; do
        read -r shape rate batch <<<"${CASES[$i]}"
        for k in $(seq 0 $((n_systems - 1))); do
            system=${SYSTEM_LIST[$(((rep - 1 + i + k) % n_systems))]}
            "start_$system"
            run_case "$system" "$shape" "$rate" "$batch" "$rep" "$DURATION"
            stop_server
        done
    done
done

RSS_LINE=""
if [ "$LONG" = 1 ] && [[ " $SYSTEMS " == *" axhost "* ]]; then
    start_axhost
    rss_before=$(awk '/^VmRSS/ {print $2}' "/proc/$SERVER_PID/status")
    log "axhost long run: ${LONG_SECONDS}s 64x64 max batch 16, RSS before ${rss_before} kB"
    run_case axhost 64x64 max 16 long "$LONG_SECONDS"
    rss_after=$(awk '/^VmRSS/ {print $2}' "/proc/$SERVER_PID/status")
    rss_peak=$(awk '/^VmHWM/ {print $2}' "/proc/$SERVER_PID/status")
    RSS_LINE="axhost RSS around a ${LONG_SECONDS} s 64→64 max-rate run (batch 16): before ${rss_before} kB, after ${rss_after} kB, peak ${rss_peak} kB"
    log "$RSS_LINE"
    stop_server
fi

machine_check after

# ---------------------------------------------------------------------------------------------
# Medians (each metric separately, over the reps that succeeded).
# The median of the numbers on stdin, one per line; "-" when there are none.
median_of() {
    sort -g | awk '{v[NR]=$1} END { if (NR==0) print "-"; else if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2 }'
}
# A quiet run: neither stall probe woke more than 500 µs late (columns 13 and 14).
QUIET='$13=="0.0" && $14=="0.0"'
median() { # system case column [quiet: only the quiet runs]
    local only=1
    [ "${4:-}" = quiet ] && only=$QUIET
    awk -F'\t' -v s="$1" -v c="$2" -v col="$3" \
        '$1==s && $2==c && $3!="long" && $col!="ERR" && $col!="-" && ('"$only"') {print $col}' "$RESULTS" |
        median_of
}
fmt_rate() { awk -v v="$1" 'BEGIN { if (v=="-") print "fail"; else if (v>=1e6) printf "%.2fM", v/1e6; else if (v>=1e3) printf "%.1fk", v/1e3; else printf "%.0f", v }'; }
fmt_us() { awk -v v="$1" 'BEGIN { if (v=="-") print "-"; else if (v>=1000) printf "%.0f", v; else printf "%.1f", v }'; }

# md_table HEAD CELLS [fixed]: a Markdown table, one row per case (only fixed-rate cases when
# the third argument is "fixed"), with the columns `HEAD SYSTEM` names for each system, filled
# by `CELLS SYSTEM CASE-KEY` ("| a | b |"-style cells, one trailing "|" each).
md_table() {
    local head=$1 cells=$2 fixed=${3:-} header="| shape | offered |" sep="|---|---|"
    [ "$fixed" = fixed ] || { header+=" batch |"; sep+="---|"; }
    for system in $SYSTEMS; do
        local h
        h=$($head "$system")
        header+=" $h"
        sep+=$(sed 's/[^|]*|/---:|/g' <<<"$h")
    done
    echo "$header"
    echo "$sep"
    for c in "${CASES[@]}"; do
        read -r shape rate batch <<<"$c"
        [ "$fixed" = fixed ] && [ "$rate" = max ] && continue
        local key="$shape/$rate/$batch" row="| ${shape/x/→} | $rate |"
        [ "$fixed" = fixed ] || row+=" $batch |"
        for system in $SYSTEMS; do
            row+=" $($cells "$system" "$key")"
        done
        echo "$row"
    done
}

result_head() { echo "$1 msg/s | $1 p50 / p99 / p99.9 µs | $1 lost |"; }
result_cells() {
    echo "$(fmt_rate "$(median "$1" "$2" 5)") |" \
        "$(fmt_us "$(median "$1" "$2" 6)") / $(fmt_us "$(median "$1" "$2" 7)") / $(fmt_us "$(median "$1" "$2" 8)") |" \
        "$(median "$1" "$2" 10) |"
}

# Fixed-rate cases: how late the load tool itself sent (p99 of build time minus scheduled time),
# how much CPU the hypervisor stole during the run, and how long the stall probes found each CPU
# paused. A latency close to the tool's lag is the tool's; a p99 of milliseconds in a run whose
# CPUs paused for tens of ms is the machine's.
context_head() { echo "$1 tool lag p99 µs | $1 steal ms | $1 stalled ms (server / load CPU) | $1 slowed ms (server / load CPU) |"; }
context_cells() {
    echo "$(fmt_us "$(median "$1" "$2" 11)") | $(median "$1" "$2" 12) |" \
        "$(median "$1" "$2" 13) / $(median "$1" "$2" 14) |" \
        "$(median "$1" "$2" 17) / $(median "$1" "$2" 18) |"
}

# Latency to the receiving socket: from the sender's stamp to the kernel's receive timestamp of
# the read that completed the message (the last segment it consumed, so never early). Beside the
# latency to the tool's read, it shows how much of that was the tool's own wait to read.
socket_head() { echo "$1 p50 / p99 µs to the read | $1 p50 / p99 µs to the socket |"; }
socket_cells() {
    echo "$(fmt_us "$(median "$1" "$2" 6)") / $(fmt_us "$(median "$1" "$2" 7)") |" \
        "$(fmt_us "$(median "$1" "$2" 15)") / $(fmt_us "$(median "$1" "$2" 16)") |"
}

# The same latencies over the quiet runs only: those in which neither probe woke more than
# 500 µs late. Not a replacement for the medians above, which count every run; it shows what
# each server does when the machine does not pause it.
quiet_runs() { # system case
    awk -F'\t' -v s="$1" -v c="$2" \
        '$1==s && $2==c && $3!="long" && $5!="ERR" { n++; if ('"$QUIET"') q++ } END { printf "%d of %d", q, n }' \
        "$RESULTS"
}
quiet_head() { echo "$1 quiet runs | $1 p50 / p99 µs |"; }
quiet_cells() {
    echo "$(quiet_runs "$1" "$2") |" \
        "$(fmt_us "$(median "$1" "$2" 6 quiet)") / $(fmt_us "$(median "$1" "$2" 7 quiet)") |"
}

ratio() { # numerator-system denominator-system case
    local a b
    a=$(median "$1" "$3" 5)
    b=$(median "$2" "$3" 5)
    awk -v a="$a" -v b="$b" 'BEGIN { if (a=="-" || b=="-" || b==0) print "n/a"; else printf "%.2f", a/b }'
}

# Reps of a case whose p50 was over 1 ms, as "k of n". Flat out at one frame per write, a run
# settles in one of two regimes ("Flat out with one frame per write", docs/performance.md): the
# server keeps up and each of the tool's writes costs it a whole loopback send, or the server
# falls a socket buffer behind and the tool's writes only queue. A p50 in milliseconds marks the
# second.
bulk_reps() { # system case
    awk -F'\t' -v s="$1" -v c="$2" '
        $1==s && $2==c && $3!="long" && $6!="ERR" && $6!="-" { n++; if ($6 > 1000) k++ }
        END { printf "%d of %d", k, n }' "$RESULTS"
}

# Per-rep ratios: within a rep the systems' runs of one case go back to back, so their ratio is
# less exposed to the VM's drift than the ratio of medians. Prints "r1, r2, ... (median m)".
paired() { # numerator-system denominator-system case
    local ratios
    ratios=$(awk -F'\t' -v a="$1" -v b="$2" -v c="$3" '
        $2==c && $3!="long" && $5!="ERR" { if ($1==a) num[$3]=$5; if ($1==b) den[$3]=$5 }
        END { for (r in num) if ((r in den) && den[r] > 0) printf "%.2f\n", num[r] / den[r] }' "$RESULTS" |
        sort -g)
    [ -n "$ratios" ] || { echo "n/a"; return 0; }
    echo "$(paste -sd, <<<"$ratios" | sed 's/,/, /g') (median $(median_of <<<"$ratios"))"
}

mkdir -p "$ROOT/benches/results"
OUT=${OUT:-$ROOT/benches/results/compare-$(date +%F).md}
{
    echo "# axhost vs Redis vs NATS: point-to-point notifications"
    echo
    echo "$(date -u +%FT%TZ), ${REPS} rep(s) × ${DURATION} s (+${WARMUP} s warmup) per case, medians."
    echo "Payload ${SIZE} B; sender i sends its k-th message to receiver (i+k) mod M; servers on CPU"
    echo "$SERVER_CPU, \`axhost-load\` ($LOAD_THREADS thread(s)) on CPU $LOAD_CPU; a fresh server per run, the systems taking"
    echo "turns case by case in a rotating order; the tool's pace at fixed rates: $PACE$([ "$PACE" = sleep ] && echo " (shortest sleep $SLEEP_MIN)"). msg/s = delivered at receivers in the"
    echo "window; lost = sent − received after the drain (axhost drops notifications above its 1 MiB"
    echo "per-connection soft queue)."
    echo
    md_table result_head result_cells
    echo
    echo "The load tool's own lateness, the CPU steal and the CPUs' pauses (\`axhost-stall-probe\`:"
    echo "a 1 ms real-time tick on each CPU; summed lateness of wakes more than 500 µs late; and the"
    echo "time it found the CPU under half speed: the ticks whose ~5 µs unit of work took over twice"
    echo "the run's median, times the tick) in the fixed-rate runs (medians):"
    echo
    md_table context_head context_cells fixed
    echo
    echo "Latency to the tool's read (as above) and to the receiving socket (the kernel's receive"
    echo "timestamp: without the time a message waited in the socket for the tool to read it),"
    echo "fixed rates, medians:"
    echo
    md_table socket_head socket_cells fixed
    echo
    if [ "$PROBE" = 1 ]; then
        echo "Latency medians over the quiet runs only (neither probe woke more than 500 µs late);"
        echo "the medians above count every run:"
        echo
        md_table quiet_head quiet_cells fixed
        echo
    fi
    if [[ " $SYSTEMS " == *" axhost "* ]]; then
        for other in redis nats; do
            [[ " $SYSTEMS " == *" $other "* ]] || continue
            for c in "${CASES[@]}"; do
                read -r shape rate batch <<<"$c"
                [ "$shape $rate" = "1x1 max" ] || continue
                key_1x1="1x1/max/$batch"
                echo "- axhost/$other delivered msg/s, 1→1 max, $batch frame(s) per write: $(ratio axhost "$other" "$key_1x1") (ratio of medians); per rep, sorted: $(paired axhost "$other" "$key_1x1")"
            done
        done
    fi
    regimes=()
    for c in "${CASES[@]}"; do
        read -r shape rate batch <<<"$c"
        [ "$rate $batch" = "max 1" ] || continue
        per_system=()
        for system in $SYSTEMS; do per_system+=("$system $(bulk_reps "$system" "$shape/max/1")"); done
        regimes+=("${shape/x/→} $(printf '%s, ' "${per_system[@]}" | sed 's/, $//')")
    done
    if [ ${#regimes[@]} -gt 0 ]; then
        echo "- flat out at one frame per write, reps with a p50 over 1 ms (the tool's writes queued behind a full socket): $(printf '%s; ' "${regimes[@]}" | sed 's/; $//')"
    fi
    [ -n "$RSS_LINE" ] && echo "- $RSS_LINE"
    echo
    echo "## Machine"
    echo "- CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1) ($(nproc) CPUs)"
    echo "- kernel: $(uname -sr)"
    echo "- $(redis-server --version | head -n 1)"
    echo "- $(nats-server --version 2>&1 | head -n 1)"
    echo "- $(rustc --version)"
    echo "- axhost commit: $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)$(cd "$ROOT" && git diff --quiet HEAD 2>/dev/null || echo ' (dirty)')"
    echo
    if [ -s "$TMP/machine" ]; then
        echo "Pauses of a busy CPU (\`axhost-stall-probe --spin\`, ${MACHINE_CHECK} s per step: the summed"
        echo "gaps over 500 µs between two clock reads of a busy loop, their number and the worst; and"
        echo "the summed time of its ~5 µs work units that took over twice their median), before and"
        echo "after the runs:"
        echo
        echo "| when | CPUs busy | paused |"
        echo "| --- | --- | --- |"
        awk -F'|' '{ printf "| %s | %s | %s |\n", $1, $2, $3 }' "$TMP/machine"
        echo
    fi
    echo "## Raw runs"
    echo
    echo '```'
    printf 'system\tcase\trep\tsent/s\tdelivered/s\tp50\tp99\tp99.9\tmax\tlost\tlag_p99\tsteal_ms\tstall_srv_ms\tstall_load_ms\tsocket_p50\tsocket_p99\tslow_srv_ms\tslow_load_ms\n'
    cat "$RESULTS"
    echo '```'
} >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
cat "$OUT"
log "written to $OUT"
