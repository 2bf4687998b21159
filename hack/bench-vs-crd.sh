#!/usr/bin/env bash
# AccessSession served by MCP Access vs the same kind as a CRD (its schema generated from the
# same Rust type), through one kube-apiserver: starts the local cluster once (PostgreSQL, etcd,
# kube-apiserver, kube-controller-manager, MCP Access behind its APIService), installs the CRD
# beside it, and runs the same requests against both: creates with 1 and 8 clients, full and
# paged (limit 500) lists at 1,000 / 10,000 / 50,000 objects, watch delivery latency with
# 1 / 100 / 1,000 watchers, and the memory of kube-apiserver + etcd vs mcp-access-apiserver +
# PostgreSQL. Prints one table (figure, ours, CRD, ours/CRD). Release build. Never run by CI or
# hack/test.sh; docs/performance.md records the figures.
#
#   hack/bench-vs-crd.sh            # the full run (4-15 minutes on 2 cores, after the build)
#   hack/bench-vs-crd.sh --quick    # 1,000 objects, 1 and 100 watchers, 5 events
#   hack/bench-vs-crd.sh --levels 1000,10000 --watchers 1,100 --trials 20 --rounds 5
set -euo pipefail
cd "$(dirname "$0")/.."

kube_env=$(hack/build-kube.sh)
eval "$kube_env"
export KUBE_APISERVER KUBE_CONTROLLER_MANAGER ETCD
cargo build --release -p apiserver --bin mcp-access-apiserver -p e2e --example bench_vs_crd
export MCP_ACCESS_APISERVER_BIN=$PWD/target/release/mcp-access-apiserver
# 1,000 watchers hold 1,000 connections from this one process.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
exec target/release/examples/bench_vs_crd "$@"
