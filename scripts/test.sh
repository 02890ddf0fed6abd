#!/usr/bin/env bash
# The whole test suite. Installs what it needs (redis-server; cargo-fuzz for the bounded
# fuzz session), every test starts and stops its own redis-server processes.
#   FUZZ_SECONDS=N   length of the bounded fuzz session per target (default 30; 0 skips it)
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n==> %s\n' "$*"; }

step "redis-server"
scripts/ensure-redis.sh

step "format, lints, docs"
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet

step "unit, integration, fault, hostile-server, torture and doc tests (corpus replay included)"
cargo test --quiet

step "bounded fuzz session"
if [ "${FUZZ_SECONDS:-30}" != 0 ]; then
  fuzz/run.sh "${FUZZ_SECONDS:-30}"
fi

step "no redis-server left behind by the tests"
left=$(pgrep -f "quorumlock-test-" || true)
if [ -n "$left" ]; then
  echo "processes left running: $left" >&2
  exit 1
fi
echo "all green"
