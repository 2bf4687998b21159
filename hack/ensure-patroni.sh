#!/usr/bin/env bash
# Prints the path of a `patroni` executable, for the PostgreSQL HA test (a 3-member Patroni
# cluster with etcd as its store, hack/patroni.sh). One on PATH is used as it is. Otherwise, as
# root, Debian's package is installed unattended; its service is never started (the test runs
# its own members, in a temporary directory, on loopback).
#
#   MCP_ACCESS_PATRONI_BIN=$(hack/ensure-patroni.sh)
set -euo pipefail
. "$(dirname "$0")/lib/debian.sh"
debian_ensure ensure-patroni.sh patroni patroni
