#!/usr/bin/env bash
# Runs every test. Starts its own PostgreSQL in a temporary directory and never touches
# any other database. Extra arguments go to `cargo test` (e.g. a test name filter).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib/postgres.sh

work=$(mktemp -d /tmp/mcp-access-test.XXXXXX)
cleanup() { postgres_stop "$work/pg"; rm -rf "$work"; }
trap cleanup EXIT
chmod 755 "$work"

postgres_start "$work/pg"
echo "test PostgreSQL on 127.0.0.1:$PGPORT_STARTED"
export MCP_TEST_DATABASE_URL=$PG_DSN

cargo test --workspace --all-targets "$@"
