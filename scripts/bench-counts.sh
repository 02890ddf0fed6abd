#!/usr/bin/env bash
# Counts that scheduling noise cannot move, per acquire+release cycle on 5 local nodes:
# system calls (strace -c), user-space instructions (callgrind Ir) and heap allocations,
# for the `floor` client, the floor that decides its acquire at quorum, and quorumlock.
#
# Method: the client binary (`benches/compare.rs` in `--count-mode ROW N`) does a fixed
# setup and warm-up, then N cycles. Each row runs twice, with N1 and N2 cycles; the
# per-cycle figure is (count(N2) - count(N1)) / (N2 - N1), so setup and warm-up cancel.
# The 5 redis-server nodes are started here, before the traced process, and passed in
# COMPARE_PORTS: only the client is traced.
#
# How many waits a cycle takes depends on how replies interleave with the client's work,
# which the scheduler decides: that is the one thing that still moves the instruction
# count between runs. So, on a machine with 2 or more CPUs, the servers run on CPU 1 and
# the traced client on CPU 0 (PIN=0 turns this off), and each callgrind figure is the
# median of REPEAT pairs of runs, printed with its range.
#
# Usage: scripts/bench-counts.sh            (N1=2000, N2=4000, REPEAT=3)
#        N1=500 N2=1000 REPEAT=1 scripts/bench-counts.sh
#        COMPARE_BIN=/tmp/compare-old scripts/bench-counts.sh   (count a binary built elsewhere)
#        FEATURES=tls scripts/bench-counts.sh   (the same plain-TCP rows, built with `tls`)
#        FEATURES=tls ROWS=quorumlock-tls scripts/bench-counts.sh   (over TLS, on nodes the
#            client starts itself: its syscall figure includes theirs; read instructions)
set -euo pipefail

N1=${N1:-2000}
N2=${N2:-4000}
REPEAT=${REPEAT:-3}
ROWS=${ROWS:-"floor floor-quorum quorumlock"}
PIN=${PIN:-1}
SERVER_CPU=()
CLIENT_CPU=()
if [ "$PIN" = 1 ] && [ "$(nproc)" -ge 2 ] && command -v taskset >/dev/null 2>&1; then
    SERVER_CPU=(taskset -c 1)
    CLIENT_CPU=(taskset -c 0)
fi
cd "$(dirname "$0")/.."

need() {
    if ! command -v "$1" >/dev/null 2>&1; then
        echo "installing $2 ..." >&2
        apt-get install -y "$2" >/dev/null 2>&1 ||
            { apt-get update >/dev/null 2>&1 && apt-get install -y "$2" >/dev/null; }
    fi
}
need strace strace
need valgrind valgrind
need redis-server redis-server

if [ -n "${COMPARE_BIN:-}" ]; then
    # A bench binary built elsewhere (another commit, for an A/B in one machine state).
    BIN=$COMPARE_BIN
else
    echo "building the compare bench ..." >&2
    FEATURE_ARGS=()
    if [ -n "${FEATURES:-}" ]; then
        FEATURE_ARGS=(--features "$FEATURES")
    fi
    cargo bench --bench compare "${FEATURE_ARGS[@]}" --no-run >/dev/null 2>&1 ||
        cargo bench --bench compare "${FEATURE_ARGS[@]}" --no-run
    BIN=$(cargo bench --bench compare "${FEATURE_ARGS[@]}" --no-run --message-format=json 2>/dev/null |
        grep -o '"executable":"[^"]*"' | cut -d'"' -f4 | grep '/compare-' | tail -n1)
fi
[ -x "$BIN" ] || { echo "compare bench binary not found" >&2; exit 1; }

WORK=$(mktemp -d /tmp/quorumlock-counts.XXXXXX)
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do
        kill -CONT "$pid" 2>/dev/null || true
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

PORTS=()
for i in 0 1 2 3 4; do
    for attempt in 1 2 3 4 5; do
        port=$(free_port)
        mkdir -p "$WORK/n$i"
        "${SERVER_CPU[@]}" redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
            --daemonize no --dir "$WORK/n$i" --logfile "$WORK/n$i/redis.log" \
            --protected-mode no >/dev/null 2>&1 &
        pid=$!
        ok=0
        for _ in $(seq 1 200); do
            if redis-cli -p "$port" ping 2>/dev/null | grep -q PONG; then ok=1; break; fi
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.02
        done
        if [ "$ok" = 1 ]; then
            PIDS+=("$pid")
            PORTS+=("$port")
            break
        fi
        kill "$pid" 2>/dev/null || true
    done
done
[ "${#PORTS[@]}" = 5 ] || { echo "could not start 5 redis-server nodes" >&2; exit 1; }
export COMPARE_PORTS
COMPARE_PORTS=$(IFS=,; echo "${PORTS[*]}")
echo "nodes on ports $COMPARE_PORTS (pids ${PIDS[*]})" >&2

# strace -c summary -> "total_calls name=calls ..." (one line)
strace_counts() { # row n
    local out="$WORK/strace.$1.$2"
    "${CLIENT_CPU[@]}" strace -f -c -o "$out" "$BIN" --count-mode "$1" "$2" >"$WORK/stdout.strace.$1.$2"
    # Lines: "% time seconds usecs/call calls [errors] syscall"; the last field is the name.
    awk '/^-/ {next} /^ *[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9]+/ {print $NF, $4}' "$out"
}

callgrind_ir() { # row n
    local out="$WORK/callgrind.$1.$2"
    "${CLIENT_CPU[@]}" valgrind --tool=callgrind --callgrind-out-file="$out" \
        "$BIN" --count-mode "$1" "$2" >"$WORK/stdout.cg.$1.$2" 2>"$WORK/cg.log.$1.$2"
    # "summary: <Ir>" (older valgrind) or "totals: <Ir>".
    awk '/^(summary|totals):/ {print $2; exit}' "$out"
}

allocs_of() { # stdout file -> allocations in the measured phase
    sed -n 's/.*allocs=\([0-9]*\).*/\1/p' "$1"
}

declare -A SYS IR RANGE ALLOC BREAK
D=$((N2 - N1))
for row in $ROWS; do
    echo "row $row: strace N=$N1,$N2 ..." >&2
    strace_counts "$row" "$N1" >"$WORK/s1"
    strace_counts "$row" "$N2" >"$WORK/s2"
    SYS[$row]=$(awk -v d="$D" 'NR==FNR {a[$1]=$2; next} $1=="total" {printf "%.2f", ($2-a["total"])/d}' \
        "$WORK/s1" "$WORK/s2")
    BREAK[$row]=$(awk -v d="$D" 'NR==FNR {a[$1]=$2; next} $1!="total" {
            v=($2-a[$1])/d; if (v >= 0.05) printf "%s %.2f, ", $1, v }' "$WORK/s1" "$WORK/s2" |
        sed 's/, $//')
    per=()
    for rep in $(seq 1 "$REPEAT"); do
        echo "row $row: callgrind N=$N1,$N2 ($rep/$REPEAT) ..." >&2
        i1=$(callgrind_ir "$row" "$N1")
        i2=$(callgrind_ir "$row" "$N2")
        per+=("$(awk -v a="$i1" -v b="$i2" -v d="$D" 'BEGIN {printf "%.0f", (b-a)/d}')")
    done
    IR[$row]=$(printf '%s\n' "${per[@]}" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
    RANGE[$row]=$(printf '%s\n' "${per[@]}" | sort -n | awk 'NR==1 {lo=$1} {hi=$1} END {print lo "-" hi}')
    a1=$(allocs_of "$WORK/stdout.cg.$row.$N1")
    a2=$(allocs_of "$WORK/stdout.cg.$row.$N2")
    ALLOC[$row]=$(awk -v a="$a1" -v b="$a2" -v n1="$N1" -v n2="$N2" \
        'BEGIN {printf "%.2f (%s/%d, %s/%d)", (b-a)/(n2-n1), a, n1, b, n2}')
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a/b; else print "n/a" }'; }

echo
echo "### Per-cycle counts (acquire + release, 5 nodes; difference of N=$N1 and N=$N2 runs)"
echo
echo "Machine: nproc=$(nproc); $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'); $(redis-server --version | cut -d' ' -f1-3); $(strace -V | head -n1); $(valgrind --version)"
if [ "${#CLIENT_CPU[@]}" -gt 0 ]; then
    echo "Pinned: servers on CPU 1, traced client on CPU 0. Instructions: median of $REPEAT (range)."
else
    echo "Not pinned. Instructions: median of $REPEAT (range)."
fi
echo
echo "| row | syscalls/cycle | vs floor | instructions/cycle (user, callgrind Ir) | vs floor | allocations/cycle |"
echo "|---|---:|---:|---:|---:|---:|"
for row in $ROWS; do
    echo "| $row | ${SYS[$row]} | $(ratio "${SYS[$row]}" "${SYS[floor]}") | ${IR[$row]} (${RANGE[$row]}) | $(ratio "${IR[$row]}" "${IR[floor]}") | ${ALLOC[$row]} |"
done
echo
echo "Syscall breakdown per cycle (strace -c -f, only calls with >= 0.05/cycle):"
echo
for row in $ROWS; do
    echo "- $row: ${BREAK[$row]}"
done
