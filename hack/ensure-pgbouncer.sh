#!/usr/bin/env bash
# Prints the path of a `pgbouncer` executable, for the test of the store behind PgBouncer in
# session pooling mode (apiserver/tests/pgbouncer.rs). One on PATH (or in /usr/sbin) is used as
# it is. Otherwise, as root, Debian's package is installed unattended; its service is never
# started (the test runs its own PgBouncer, in a temporary directory, on loopback).
#
#   MCP_ACCESS_PGBOUNCER_BIN=$(hack/ensure-pgbouncer.sh)
set -euo pipefail
. "$(dirname "$0")/lib/debian.sh"
debian_ensure ensure-pgbouncer.sh pgbouncer pgbouncer
