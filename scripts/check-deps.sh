#!/usr/bin/env bash
# The runtime dependency tree (`cargo tree -e normal`, this machine's target), both ways:
# - without features: exactly quorumlock, mio, bytes, memchr, fastrand and libc (libc for
#   the command-line tool, and as mio's own);
# - with `--features tls`: only rustls and crates rustls itself depends on are added
#   (its ring provider and the pki types), and never its `log` feature nor aws-lc.
set -euo pipefail
cd "$(dirname "$0")/.."

crates() { # crate names in the normal-dependency tree, sorted, one per line
    cargo tree -e normal --prefix none --format '{p}' "$@" 2>/dev/null |
        awk '{print $1}' | sort -u
}

plain=$(crates)
expected=$(printf '%s\n' bytes fastrand libc memchr mio quorumlock | sort -u)
if [ "$plain" != "$expected" ]; then
    echo "runtime dependencies without features changed:" >&2
    diff <(echo "$expected") <(echo "$plain") >&2 || true
    exit 1
fi

with_tls=$(crates --features tls)
added=$(comm -13 <(echo "$plain") <(echo "$with_tls"))
# rustls' subtree: what rustls (as this crate enables it) depends on.
of_rustls=$(cargo tree -e normal --prefix depth --format '{p}' --features tls 2>/dev/null |
    awk 'match($0, /^[0-9]+/) {
            depth = substr($0, 1, RLENGTH) + 0; name = substr($1, RLENGTH + 1)
            if (depth == 1) inside = (name == "rustls")
            if (inside) print name
         }' | sort -u)
stray=$(comm -23 <(echo "$added") <(echo "$of_rustls"))
if [ -n "$stray" ]; then
    echo "the tls feature adds crates that rustls does not depend on:" >&2
    echo "$stray" >&2
    exit 1
fi
if ! grep -qx rustls <<<"$added"; then
    echo "the tls feature does not add rustls?" >&2
    exit 1
fi
for banned in log aws-lc-rs aws-lc-sys rustls-pemfile webpki-roots rustls-native-certs; do
    if grep -qx "$banned" <<<"$with_tls"; then
        echo "the tls feature pulls in $banned" >&2
        exit 1
    fi
done
echo "runtime dependencies: $(echo $plain | tr ' ' ' '); tls adds: $(echo $added)"
