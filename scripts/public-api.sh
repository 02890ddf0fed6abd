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
target=${CARGO_TARGET_DIR:-target}
listing=public-api.txt
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

render() { # $1: output file, then cargo feature arguments
    local out=$1
    shift
    RUSTC_BOOTSTRAP=1 cargo rustdoc --lib --quiet "$@" -- \
        -Z unstable-options --output-format json
    python3 scripts/public-api.py "$target/doc/quorumlock.json" >"$out"
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
    echo "The public API differs from $listing (lines with - are in the listing, + in the code)." >&2
    echo "If the change is deliberate, regenerate the listing and commit it with the change:" >&2
    echo "    scripts/public-api.sh --update" >&2
    exit 1
fi
echo "public API: matches $listing ($(wc -l <"$listing") lines)"
