#!/usr/bin/env bash
# The demo: starts 5 local Redis nodes, shows 4 workers contending for one lock as it
# happens (who holds it, who is refused and why, extends, releases), freezes two nodes
# midway and thaws them, prints a summary table, and stops the nodes (also on Ctrl-C).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/ensure-redis.sh
echo "building the demo (release mode; the first build takes a minute or two) ..."
exec cargo run --release --quiet --example demo
