#!/usr/bin/env bash
# Revoke-to-deny benchmark: starts the local cluster once (PostgreSQL, etcd, kube-apiserver,
# kube-controller-manager, MCP Access behind its APIService), the real mcp-access-authz on the
# gateway sync listener with a Pod-bound token, and for each number of connected gateways
# (default 1 and 500; all but the sidecar are session caches in worker processes of at most
# 2,500 each, never in the process that drives the trials) measures over N trials the time from
# a completed `Revocation` write through kube-apiserver until the sidecar answers 401
# session_revoked, until its long-poll completes, and until every cache denies. Prints
# p50/p99/max, and last one line per count:
#   revoke-to-deny gateways=N p50_ms=… p99_ms=… max_ms=… late=K
# (K: caches still allowing after the 2 s lag bound, summed over the trials). Never run by CI
# or hack/test.sh.
#
#   hack/bench-revoke.sh [--trials 200] [--gateways 1,500]
# Release build (target/release), like every benchmark.
#   hack/bench-revoke.sh --trials 100 --gateways 1,1000,10000   # fleet scale (issue 30)
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
# N caches hold N watches and connections: the workers hold the client ends (2,500 each), the
# apiserver (a child of the bench) all N server ends: 10,000 caches need over 11,000
# descriptors in it. The limit is per process.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
most=500 gateways=
prev=
for arg in "$@"; do
  [[ $prev == --gateways ]] && gateways=$arg
  [[ $arg == --gateways=* ]] && gateways=${arg#--gateways=}
  prev=$arg
done
if [[ -n $gateways ]]; then
  most=1
  for n in ${gateways//,/ }; do [[ $n =~ ^[0-9]+$ ]] && (( n > most )) && most=$n; done
fi
if (( $(ulimit -n) < most + 1000 )); then
  echo "bench-revoke.sh: ulimit -n is $(ulimit -n); $most gateways need about $(( most + 1000 ))" >&2
  exit 1
fi
exec "target/$dir/examples/bench_revoke" "$@"
