#!/usr/bin/env bash
# Prints the path of a `patroni` executable, for the PostgreSQL HA test (a 3-member Patroni
# cluster with etcd as its store, hack/patroni.sh). One on PATH is used as it is. Otherwise, as
# root, Debian's package is installed unattended; its service is never started (the test runs
# its own members, in a temporary directory, on loopback).
#
#   MCP_ACCESS_PATRONI_BIN=$(hack/ensure-patroni.sh)
set -euo pipefail

if command -v patroni 2>/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "ensure-patroni.sh: patroni is not installed and this is not root; install it with" >&2
  echo "  apt-get install -y --no-install-recommends patroni" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "ensure-patroni.sh: patroni is not installed and there is no apt-get; put patroni on PATH" >&2
  exit 1
fi

. "$(dirname "$0")/lib/debian.sh"
echo "ensure-patroni.sh: patroni not found; installing Debian's patroni" >&2
debian_install patroni
if ! command -v patroni; then
  echo "ensure-patroni.sh: the package installed, but no patroni executable was found" >&2
  exit 1
fi
