#!/usr/bin/env bash
# Runs every test: unit, storage (real PostgreSQL), interop (real kubectl, kube-rs) and
# end-to-end (real etcd + kube-apiserver + kube-controller-manager, client-go informers), and
# the scenarios on a real node (hack/node.sh: kubelet, containerd, kube-proxy, kube-router;
# needs root) whose Pods prove isolation by packets.
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

work=$(mktemp -d /tmp/mcp-access-test.XXXXXX)
tools_pid=
cleanup() {
  if [ -n "$tools_pid" ]; then kill "$tools_pid" 2>/dev/null || true; fi
  postgres_stop "$work/pg"
  rm -rf "$work"
}
trap cleanup EXIT
chmod 755 "$work"

# What the end-to-end tests run (kube-apiserver, etcd, the client-go programs, the
# NetworkPolicy analyzer, promtool; see hack/tools.sh), built beside the Rust compile below and
# awaited before anything is started. Cached outside the repository, so a warm run waits for
# nothing. The status is checked on its own: `eval "$(...)"` would hide a failed build.
hack/tools.sh >"$work/tools.env" &
tools_pid=$!
# nginx for the auth_request scenario (installed from Debian's packages when missing).
MCP_ACCESS_NGINX_BIN=$(hack/ensure-nginx.sh)
export MCP_ACCESS_NGINX_BIN
# Patroni for the PostgreSQL HA test (Debian's package, installed when missing).
MCP_ACCESS_PATRONI_BIN=$(hack/ensure-patroni.sh)
export MCP_ACCESS_PATRONI_BIN
# PgBouncer for the store-behind-a-pooler test (Debian's package, installed when missing).
MCP_ACCESS_PGBOUNCER_BIN=$(hack/ensure-pgbouncer.sh)
export MCP_ACCESS_PGBOUNCER_BIN
# The binaries the tests start. Without arguments the whole suite's compile builds them, with
# the same features as the tests (dependencies compile once: a `cargo build -p ...` first
# would resolve features differently and compile many of them twice); with arguments, only
# them.
if [ $# -eq 0 ]; then
  cargo test --workspace --all-targets --no-run
else
  cargo build -p apiserver --bin mcp-access-apiserver -p gateway --bin mcp-access-authz \
    --bin mcp-access-gateway --bin mcp-access-stdio-bridge -p controllers --bin mcp-access-controllers \
    -p kubectl-access --bin kubectl-access
fi
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
mkdir -p target/kubectl-plugins
ln -sf ../debug/kubectl-access target/kubectl-plugins/kubectl-access
export MCP_ACCESS_KUBECTL_ACCESS_BIN=$PWD/target/kubectl-plugins/kubectl-access
export PATH=$PWD/target/kubectl-plugins:$PATH

if ! wait "$tools_pid"; then
  tools_pid=
  echo "hack/test.sh: building the Go tools failed (hack/tools.sh, above)" >&2
  exit 1
fi
tools_pid=
# shellcheck disable=SC1091 # written by hack/tools.sh just now
. "$work/tools.env"
export KUBE_APISERVER KUBE_CONTROLLER_MANAGER ETCD MCP_ACCESS_INFORMER_BIN \
  MCP_ACCESS_GATEWAY_INFORMER_BIN MCP_ACCESS_NETPOL_ANALYZER_BIN MCP_ACCESS_PROMTOOL_BIN \
  KUBELET KUBE_PROXY KUBE_SCHEDULER CONTAINERD CONTAINERD_SHIM CTR RUNC KUBE_ROUTER COREDNS PAUSE

postgres_start "$work/pg"
echo "test PostgreSQL on 127.0.0.1:$PGPORT_STARTED" >&2
export MCP_TEST_DATABASE_URL=$PG_DSN

# With arguments, only what they select (`--workspace` would override `-p`).
if [ $# -gt 0 ]; then
  cargo test "$@"
  exit
fi

# The whole suite, in independent groups run side by side (most of the time is spent waiting
# on timeouts, watches and processes, not on the cores): the end-to-end scenarios split over
# MCP_ACCESS_E2E_SHARDS clusters of their own (default 2; e2e::harness::Shard) and every other
# test target. `--no-fail-fast` everywhere, so one failure shows them all. Each group's lines
# are prefixed with its name; a summary with each group's time and status ends the run.
shards=${MCP_ACCESS_E2E_SHARDS:-2}
if ! [[ $shards =~ ^[1-9][0-9]*$ ]]; then
  echo "hack/test.sh: MCP_ACCESS_E2E_SHARDS=$shards is not a positive number" >&2
  exit 2
fi
# e2e's test targets other than the cluster runner, found rather than listed, so a new one
# cannot be left out.
other_e2e=()
for f in e2e/tests/*.rs; do
  t=$(basename "$f" .rs)
  [ "$t" = cluster ] || other_e2e+=(--test "$t")
done
groups=() pids=()
run_group() { # NAME COMMAND...
  local name=$1 start=$SECONDS
  shift
  (
    # A failing group must still record its status: no errexit here.
    set +e
    "$@" 2>&1 | sed -u "s|^|[$name] |"
    status=${PIPESTATUS[0]}
    echo "$name $status $((SECONDS - start))" >"$work/group.${#groups[@]}"
    exit "$status"
  ) &
  groups+=("$name") pids+=($!)
}
run_group units cargo test --workspace --exclude e2e --all-targets --no-fail-fast
run_group e2e-other cargo test -p e2e --lib --bins --examples --benches "${other_e2e[@]}" --no-fail-fast
for ((i = 1; i <= shards; i++)); do
  run_group "e2e-$i/$shards" env MCP_ACCESS_E2E_SHARD="$i/$shards" cargo test -p e2e --test cluster
done
# The scenarios on the local node (hack/node.sh: root, one node per machine) are a group of
# their own, with a cluster of their own.
run_group e2e-node env MCP_ACCESS_E2E_NODE=1 cargo test -p e2e --test cluster
failed=0
for i in "${!groups[@]}"; do
  wait "${pids[$i]}" || failed=1
done
echo "hack/test.sh: test groups (ran side by side):"
for i in "${!groups[@]}"; do
  read -r name status secs <"$work/group.$i" || { name=${groups[$i]} status=? secs=?; }
  if [ "$status" = 0 ]; then
    echo "  $name: ok in ${secs}s"
  else
    echo "  $name: FAILED (status $status) after ${secs}s"
  fi
done
exit "$failed"
