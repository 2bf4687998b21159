#!/usr/bin/env bash
# Runs every test: unit, storage (real PostgreSQL), interop (real kubectl, kube-rs) and
# end-to-end (real etcd + kube-apiserver + kube-controller-manager, client-go informers).
# Starts its own PostgreSQL in a temporary directory and never touches any other database.
# Kubernetes binaries, the client-go programs and the NetworkPolicy analyzer (the oracle of
# controllers/tests/netpol_oracle.rs) are built once and cached outside the repository.
# Extra arguments go to `cargo test` (e.g. `-p apiserver --test kubectl`).
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib/postgres.sh
. hack/lib/prereqs.sh
. hack/lib/mcp-sdk.sh

# PostgreSQL 15, kubectl, python3, openssl, curl, Go and Rust: checked before anything else;
# what can be installed unattended is (see hack/lib/prereqs.sh), the rest is named.
prereqs_ensure

# What the end-to-end tests run, built before anything is started. A command substitution's
# status is lost inside `eval "$(...)"` (eval of an empty string succeeds), so the output is
# captured first: under `set -e` a failed build ends the script here.
kube_env=$(hack/build-kube.sh)
eval "$kube_env"
export KUBE_APISERVER KUBE_CONTROLLER_MANAGER ETCD
MCP_ACCESS_INFORMER_BIN=$(hack/build-informer.sh)
export MCP_ACCESS_INFORMER_BIN
MCP_ACCESS_GATEWAY_INFORMER_BIN=$(hack/build-informer.sh gateway-informer)
export MCP_ACCESS_GATEWAY_INFORMER_BIN
MCP_ACCESS_NETPOL_ANALYZER_BIN=$(hack/build-netpol-analyzer.sh)
export MCP_ACCESS_NETPOL_ANALYZER_BIN
# promtool checks deploy/monitoring's alerting rules (e2e scenario monitoring_*).
MCP_ACCESS_PROMTOOL_BIN=$(hack/build-promtool.sh)
export MCP_ACCESS_PROMTOOL_BIN
# nginx for the auth_request scenario (installed from Debian's packages when missing).
MCP_ACCESS_NGINX_BIN=$(hack/ensure-nginx.sh)
export MCP_ACCESS_NGINX_BIN
cargo build -p apiserver --bin mcp-access-apiserver -p gateway --bin mcp-access-authz \
  --bin mcp-access-gateway -p controllers --bin mcp-access-controllers
export MCP_ACCESS_APISERVER_BIN=$PWD/target/debug/mcp-access-apiserver
export MCP_ACCESS_AUTHZ_BIN=$PWD/target/debug/mcp-access-authz
export MCP_ACCESS_GATEWAY_BIN=$PWD/target/debug/mcp-access-gateway
# The official MCP SDKs the mcp_gateway_* scenarios drive (cached outside the repository);
# the TypeScript one only where node and npm are.
MCP_ACCESS_MCP_PYTHON=$(mcp_sdk_python)
export MCP_ACCESS_MCP_PYTHON
if MCP_ACCESS_MCP_NODE_DIR=$(mcp_sdk_node); then
  export MCP_ACCESS_MCP_NODE_DIR
else
  unset MCP_ACCESS_MCP_NODE_DIR
fi
export MCP_ACCESS_CONTROLLERS_BIN=$PWD/target/debug/mcp-access-controllers
# The kubectl plugin, in a directory of its own first on PATH: `kubectl access ...` finds it.
cargo build -p kubectl-access --bin kubectl-access
mkdir -p target/kubectl-plugins
ln -sf ../debug/kubectl-access target/kubectl-plugins/kubectl-access
export MCP_ACCESS_KUBECTL_ACCESS_BIN=$PWD/target/kubectl-plugins/kubectl-access
export PATH=$PWD/target/kubectl-plugins:$PATH

work=$(mktemp -d /tmp/mcp-access-test.XXXXXX)
cleanup() { postgres_stop "$work/pg"; rm -rf "$work"; }
trap cleanup EXIT
chmod 755 "$work"

postgres_start "$work/pg"
echo "test PostgreSQL on 127.0.0.1:$PGPORT_STARTED" >&2
export MCP_TEST_DATABASE_URL=$PG_DSN

# With arguments, only what they select (`--workspace` would override `-p`).
if [ $# -gt 0 ]; then
  cargo test "$@"
else
  cargo test --workspace --all-targets
fi
