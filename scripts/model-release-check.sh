#!/usr/bin/env bash
# Before each release (docs/MODEL-CHECKING.md): CI's model set (scripts/test.sh's
# model step) with the explorer's own claims tested everywhere, which CI only samples or
# leaves out for time: the independence relation the sleep sets rest on, on every state
# (MODEL_CHECK_INDEPENDENCE=1; CI: one state in 64), and the fingerprints, on every
# transition (MODEL_CHECK_FINGERPRINTS=1: two different whole states with one fingerprint
# fail; CI: one configuration). Several times CI's time.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL_CHECK_INDEPENDENCE=1 MODEL_CHECK_FINGERPRINTS=1 \
  cargo test --profile model --test model -- --nocapture
# The caught faults as CI runs them (a violation of the explorer's own tests there would
# pass for a caught fault).
cargo test --profile model --features model-faults --test model_faults -- --nocapture
echo "model release check: passed"
