#!/usr/bin/env bash
# Idle watches at gateway scale: starts the local cluster once (PostgreSQL, etcd,
# kube-apiserver, kube-controller-manager, MCP Access behind its APIService), opens 5,000
# idle watches on MCP Access's API port (front-proxy client certificate, as the aggregator
# connects) and 5,000 on its gateway sync listener (a Pod-bound gateway token) in one
# apiserver process, and prints its VmRSS before and after (KiB per watch); then 5,000 more on
# the API port multiplexed over HTTP/2 (100 per connection, as the aggregator and client-go
# hold them) and what they added, side by side; and how long one session takes to reach all of
# them. Never run by CI or hack/test.sh.
#
#   hack/bench-watches.sh [--api 5000] [--sync 5000] [--h2 5000] [--h2-streams 100] [--settle 10]
# Release build (target/release), like every benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."

kube_env=$(hack/build-kube.sh)
eval "$kube_env"
export KUBE_APISERVER KUBE_CONTROLLER_MANAGER ETCD
cargo build --release -p apiserver --bin mcp-access-apiserver
export MCP_ACCESS_APISERVER_BIN=$PWD/target/release/mcp-access-apiserver
# 10,000 connections: this process holds their client ends and the apiserver (its child,
# which inherits the limit) their server ends.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
need=12000
if (( $(ulimit -n) < need )); then
  echo "bench-watches.sh: ulimit -n is $(ulimit -n); 10,000 watches need about $need" >&2
  exit 1
fi
export MCP_BENCH_WATCHES=1
exec cargo bench -p apiserver --bench idle_watches -- "$@"
