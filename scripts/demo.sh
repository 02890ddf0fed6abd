#!/usr/bin/env bash
# The demo: starts 5 local Redis nodes, shows 4 threads contending for one lock
# (acquire, extend, release, two nodes frozen midway), prints a summary, stops the nodes.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-redis.sh
exec cargo run --release --quiet --example demo
