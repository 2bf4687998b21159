#!/usr/bin/env bash
# Runs every test: unit, storage (real PostgreSQL), interop (real kubectl, kube-rs) and
# end-to-end (real etcd + kube-apiserver + kube-controller-manager, a client-go informer).
# Starts its own PostgreSQL in a temporary directory and never touches any other database.
# Kubernetes binaries and the informer are built once and cached outside the repository.
# Extra arguments go to `cargo test` (e.g. `-p apiserver --test kubectl`).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib/postgres.sh

work=$(mktemp -d /tmp/mcp-access-test.XXXXXX)
cleanup() { postgres_stop "$work/pg"; rm -rf "$work"; }
trap cleanup EXIT
chmod 755 "$work"

postgres_start "$work/pg"
echo "test PostgreSQL on 127.0.0.1:$PGPORT_STARTED" >&2
export MCP_TEST_DATABASE_URL=$PG_DSN

# What the end-to-end tests run.
eval "$(hack/build-kube.sh)"
export KUBE_APISERVER KUBE_CONTROLLER_MANAGER ETCD
export MCP_ACCESS_INFORMER_BIN
MCP_ACCESS_INFORMER_BIN=$(hack/build-informer.sh)
cargo build -p apiserver --bin mcp-access-apiserver
export MCP_ACCESS_APISERVER_BIN=$PWD/target/debug/mcp-access-apiserver

cargo test --workspace --all-targets "$@"
