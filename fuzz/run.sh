#!/usr/bin/env bash
# A bounded fuzz session of every fuzz target (the RESP2 codec's three, `session`, one
# node's protocol state machine, and `notice`, one subscriber connection's), for CI or by
# hand.
#
#   fuzz/run.sh [SECONDS]     (default 30 seconds per target)
#
# Each target runs with debug assertions (overflow checks) on a copy of the committed
# corpus in a temporary directory, so the checkout stays clean. `resp_parse` runs without
# AddressSanitizer: quorumlock is `#![forbid(unsafe_code)]`, so ASan only watches std and
# memchr there, and costs that target ~3x its speed (~35k instead of >100k executions/s).
# `resp_split` and `resp_roundtrip` keep it, so memchr's SIMD code still runs under ASan;
# so do `session` and `notice`, whose outboxes are `bytes::BytesMut` (unsafe code inside
# `bytes`).
# Exits non-zero if a target finds a crash (the input is kept under
# fuzz/artifacts/<target>/, which is git-ignored). Uses a `cargo fuzz` already on PATH;
# otherwise installs cargo-fuzz into fuzz/.tools/ (git-ignored; a few minutes, once),
# never into ~/.cargo/bin. If it cannot be installed, says so and exits 0.
set -euo pipefail

SECONDS_PER_TARGET="${1:-30}"
case "$SECONDS_PER_TARGET" in
    '' | *[!0-9]*)
        echo "usage: $0 [SECONDS]" >&2
        exit 2
        ;;
esac
# target:sanitizer
TARGETS=(resp_parse:none resp_split:address resp_roundtrip:address session:address notice:address)
FUZZ_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$FUZZ_DIR"

# cargo-fuzz: one already on PATH, else this project's own copy under fuzz/.tools/.
TOOLS="$FUZZ_DIR/.tools"
if ! cargo fuzz --version >/dev/null 2>&1; then
    export PATH="$TOOLS/bin:$PATH"
    if ! cargo fuzz --version >/dev/null 2>&1; then
        echo "cargo-fuzz not found: installing it into $TOOLS (not ~/.cargo/bin)"
        if ! cargo install cargo-fuzz --locked --root "$TOOLS" ||
            ! cargo fuzz --version >/dev/null 2>&1; then
            echo "cargo-fuzz could not be installed: skipping the bounded fuzz session"
            exit 0
        fi
    fi
fi
echo "using $(cargo fuzz --version) ($(command -v cargo-fuzz || echo "cargo's own search path"))"

# libFuzzer needs nightly flags; RUSTC_BOOTSTRAP lets the stable toolchain accept them.
export RUSTC_BOOTSTRAP=1

WORK="$(mktemp -d "${TMPDIR:-/tmp}/quorumlock-fuzz.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

status=0
summary=()
for entry in "${TARGETS[@]}"; do
    target="${entry%%:*}"
    sanitizer="${entry#*:}"
    corpus="$WORK/corpus/$target"
    mkdir -p "$corpus"
    if [ -d "corpus/$target" ]; then
        cp -R "corpus/$target/." "$corpus/"
    fi
    log="$WORK/$target.log"
    echo "== $target (sanitizer: $sanitizer): ${SECONDS_PER_TARGET}s on a copy of corpus/$target ($(find "$corpus" -type f | wc -l) files)"
    set +e
    cargo fuzz run "$target" --sanitizer "$sanitizer" --debug-assertions "$corpus" -- \
        -max_total_time="$SECONDS_PER_TARGET" -print_final_stats=1 >"$log" 2>&1
    rc=$?
    set -e
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)"
    if [ -z "$execs" ]; then
        execs="$(sed -n 's/^#\([0-9][0-9]*\)[[:space:]]*DONE.*/\1/p' "$log" | tail -n 1)"
    fi
    per_second=""
    if [ -n "$execs" ] && [ "$SECONDS_PER_TARGET" -gt 0 ]; then
        per_second=" ($((execs / SECONDS_PER_TARGET))/s)"
    fi
    if [ "$rc" -ne 0 ]; then
        status=1
        echo "!! $target FAILED (exit $rc) after ${execs:-?} executions; end of its log:"
        tail -n 60 "$log"
        summary+=("$target: FAILED after ${execs:-?} executions")
    else
        echo "   $target: ${execs:-?} executions${per_second}, no crash"
        summary+=("$target: ${execs:-?} executions${per_second}, no crash")
    fi
done

echo "== summary"
printf '   %s\n' "${summary[@]}"
exit "$status"
