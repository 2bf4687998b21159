#!/usr/bin/env bash
# Revoke-to-deny benchmark: starts the local cluster once (PostgreSQL, etcd, kube-apiserver,
# kube-controller-manager, MCP Access behind its APIService), the real mcp-access-authz on the
# gateway sync listener with a Pod-bound token, and measures, over N trials each with 1 and
# with 500 connected cache instances, the time from a completed `Revocation` write through
# kube-apiserver until the sidecar answers 401 session_revoked, and until its long-poll
# subscription completes. Prints p50/p99/max. Never run by CI or hack/test.sh.
#
#   hack/bench-revoke.sh [--trials 200] [--gateways 1,500]
# Release build (target/release), like every benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=release

kube_env=$(hack/build-kube.sh)
eval "$kube_env"
export KUBE_APISERVER KUBE_CONTROLLER_MANAGER ETCD
cargo build --release -p apiserver --bin mcp-access-apiserver \
  -p gateway --bin mcp-access-authz --example bench_revoke
export MCP_ACCESS_APISERVER_BIN=$PWD/target/$dir/mcp-access-apiserver
export MCP_ACCESS_AUTHZ_BIN=$PWD/target/$dir/mcp-access-authz
# 500 caches hold 500 watches and connections from this one process.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
exec "target/$dir/examples/bench_revoke" "$@"
