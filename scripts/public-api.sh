#!/usr/bin/env bash
# The public API, one line per item with its signature (scripts/public-api.py renders
# rustdoc's JSON output), compared with the checked-in public-api.txt: any change to the
# surface fails until the listing is updated in the same commit, so it shows in review.
# Default features and `tls`: a line only the `tls` feature adds starts with "[tls] ".
# (The test-only `model-faults` feature is not part of the API and not listed.)
#   scripts/public-api.sh           compare (what scripts/test.sh runs)
#   scripts/public-api.sh --update  rewrite public-api.txt
# rustdoc's JSON output is unstable: RUSTC_BOOTSTRAP=1 lets the stable toolchain (1.95,
# JSON format 57) write it; the renderer says so if the format moves.
set -euo pipefail
cd "$(dirname "$0")/.."
listing=public-api.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The renderer needs python3 (standard library only); a slim Debian+Rust image may lack
# it: install it with apt-get, as scripts/ensure-redis.sh does redis-server.
if ! command -v python3 >/dev/null 2>&1; then
    echo "python3 not found: installing it with apt-get" >&2
    sudo=""
    if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3 >/dev/null
    command -v python3 >/dev/null
fi
# Wherever cargo puts its output (CARGO_TARGET_DIR, build.target-dir in a config file).
target=$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
json=$target/doc/quorumlock.json

render() { # $1: output file, then cargo feature arguments
    local out=$1
    shift
    rm -f "$json" # never render the other feature set's JSON left from before
    RUSTC_BOOTSTRAP=1 cargo rustdoc --lib --quiet "$@" -- \
        -Z unstable-options --output-format json
    python3 scripts/public-api.py "$json" >"$out"
}
render "$tmp/default"
render "$tmp/tls" --features tls
{
    comm -12 "$tmp/default" "$tmp/tls"
    comm -13 "$tmp/default" "$tmp/tls" | sed 's/^/[tls] /'
    # Features are additive: anything tls takes away is a finding of its own.
    comm -23 "$tmp/default" "$tmp/tls" | sed 's/^/[without tls only] /'
} | LC_ALL=C sort >"$tmp/now"

if [ "${1:-}" = "--update" ]; then
    cp "$tmp/now" "$listing"
    echo "public API: wrote $listing ($(wc -l <"$listing") lines)"
    exit 0
fi
if ! diff -u --label "$listing (checked in)" --label "public API (this tree)" \
    "$listing" "$tmp/now" >&2; then
    echo >&2
    echo "The public API differs from $listing (lines with - are in the listing, + in the code;" >&2
    echo "\"[tls] \" marks what only the tls feature adds)." >&2
    echo "If the change is deliberate, regenerate the listing and commit it with the change," >&2
    echo "so that review sees it (and note it in CHANGELOG.md):" >&2
    echo "    scripts/public-api.sh --update && git add $listing" >&2
    echo "If it is not, undo the change the diff points at." >&2
    exit 1
fi
echo "public API: matches $listing ($(wc -l <"$listing") lines)"
