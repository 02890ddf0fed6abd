#!/usr/bin/env bash
# Installs redis-server (Debian package) when it is missing. Tests and the demo start
# their own servers on free loopback ports; this only makes sure the binary exists.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
  exit 0
fi
echo "redis-server not found: installing it with apt-get" >&2
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server >/dev/null
# The package may start a system-wide server on 6379; nothing here uses it.
command -v redis-server >/dev/null
redis-server --version
