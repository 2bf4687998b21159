#!/usr/bin/env bash
# Prints the path of a `pgbouncer` executable, for the test of the store behind PgBouncer in
# session pooling mode (apiserver/tests/pgbouncer.rs). One on PATH (or in /usr/sbin) is used as
# it is. Otherwise, as root, Debian's package is installed unattended; its service is never
# started (the test runs its own PgBouncer, in a temporary directory, on loopback).
#
#   MCP_ACCESS_PGBOUNCER_BIN=$(hack/ensure-pgbouncer.sh)
set -euo pipefail

find_pgbouncer() {
  command -v pgbouncer 2>/dev/null && return 0
  [ -x /usr/sbin/pgbouncer ] && echo /usr/sbin/pgbouncer && return 0
  return 1
}

if find_pgbouncer; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "ensure-pgbouncer.sh: pgbouncer is not installed and this is not root; install it with" >&2
  echo "  apt-get install -y --no-install-recommends pgbouncer" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "ensure-pgbouncer.sh: pgbouncer is not installed and there is no apt-get; put pgbouncer on PATH" >&2
  exit 1
fi

. "$(dirname "$0")/lib/debian.sh"
echo "ensure-pgbouncer.sh: pgbouncer not found; installing Debian's pgbouncer" >&2
debian_install pgbouncer
if ! find_pgbouncer; then
  echo "ensure-pgbouncer.sh: the package installed, but no pgbouncer executable was found" >&2
  exit 1
fi
