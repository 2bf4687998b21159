#!/usr/bin/env bash
# Store write throughput beside pgbench on the same throwaway PostgreSQL.
# BENCH_SECONDS (default 3) and BENCH_ROUNDS (default 5) set the interleaved rounds.
# `cargo bench` builds with the bench profile (the release settings, target/release).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib/postgres.sh

work=$(mktemp -d /tmp/mcp-access-bench.XXXXXX)
cleanup() { postgres_stop "$work/pg"; rm -rf "$work"; }
trap cleanup EXIT
chmod 755 "$work"

postgres_start "$work/pg"
export MCP_BENCH_DATABASE_URL=$PG_DSN
cargo bench -p apiserver --bench store_throughput
