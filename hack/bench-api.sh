#!/usr/bin/env bash
# API figures (watch latency at 1/100/1,000 watchers, list of 10,000, memory per watch)
# against the real apiserver binary over a throwaway PostgreSQL. `cargo bench` builds the bench
# and the binary it starts with the bench profile (the release settings, target/release).
# MCP_BENCH_ONLY=list runs the lists alone.
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib/postgres.sh

work=$(mktemp -d /tmp/mcp-access-bench.XXXXXX)
cleanup() { postgres_stop "$work/pg"; rm -rf "$work"; }
trap cleanup EXIT
chmod 755 "$work"

postgres_start "$work/pg"
export MCP_BENCH_DATABASE_URL=$PG_DSN
cargo bench -p apiserver --bench api
