#!/usr/bin/env bash
# mcp-access-gateway against the MCP server direct and against nginx proxy_pass to the same
# server (request p50/p99, sequential and concurrent, and the differences and ratios), and
# revoke -> stream cut with 1 and 500 open SSE streams, from one run (e2e/examples/bench_gateway.rs).
# Starts the local cluster once (PostgreSQL, etcd, kube-apiserver, kube-controller-manager, MCP
# Access behind its APIService) and mcp-access-controllers; the gateway runs with a token bound to
# the Pod of the Deployment they make. Release build. Never run by CI or hack/test.sh.
#
#   hack/bench-gateway.sh
#   hack/bench-gateway.sh --requests 5000 --concurrency 16 --streams 1,500 --trials 20
#   hack/bench-gateway.sh --requests 200 --streams 500 --breakdown   # where the cut time goes
set -euo pipefail
cd "$(dirname "$0")/.."

kube_env=$(hack/build-kube.sh)
eval "$kube_env"
export KUBE_APISERVER KUBE_CONTROLLER_MANAGER ETCD
MCP_ACCESS_NGINX_BIN=$(hack/ensure-nginx.sh)
export MCP_ACCESS_NGINX_BIN
cargo build --release -p apiserver --bin mcp-access-apiserver -p gateway --bin mcp-access-gateway \
  -p controllers --bin mcp-access-controllers -p e2e --example bench_gateway
export MCP_ACCESS_APISERVER_BIN=$PWD/target/release/mcp-access-apiserver
export MCP_ACCESS_GATEWAY_BIN=$PWD/target/release/mcp-access-gateway
export MCP_ACCESS_CONTROLLERS_BIN=$PWD/target/release/mcp-access-controllers
# 500 streams hold 1,000 connections (client and gateway sides) in these processes.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
exec target/release/examples/bench_gateway "$@"
