#!/usr/bin/env bash
# Builds (or finds cached) every Go tool the tests run, the independent ones side by side:
#   hack/build-kube.sh              kube-apiserver, kube-controller-manager, etcd
#   hack/build-informer.sh [NAME]   the client-go informer and the Go gateway recipe
#   hack/build-netpol-analyzer.sh   np-guard's analyzer (the NetworkPolicy oracle)
#   hack/build-promtool.sh          promtool (deploy/monitoring's alerting rules)
#   hack/build-node.sh              the local node: kubelet, kube-proxy, kube-scheduler, containerd,
#                                   runc, kube-router, CoreDNS, pause (hack/node.sh)
# Each is cached outside the repository by version and source hash, so a warm run is instant
# and a cold one costs the longest build, not the sum. kube-apiserver and
# kube-controller-manager share most packages, so they stay one job (Go's build cache makes the
# second one cheap); the others build beside them.
#
# Stdout is only NAME=/abs/path lines for `env=$(hack/tools.sh); eval "$env"`:
#   KUBE_APISERVER KUBE_CONTROLLER_MANAGER ETCD MCP_ACCESS_INFORMER_BIN
#   MCP_ACCESS_GATEWAY_INFORMER_BIN MCP_ACCESS_NETPOL_ANALYZER_BIN MCP_ACCESS_PROMTOOL_BIN
#   and hack/build-node.sh's KUBELET KUBE_PROXY KUBE_SCHEDULER CONTAINERD CONTAINERD_SHIM CTR RUNC
#   KUBE_ROUTER COREDNS PAUSE
# A failed build prints its log and fails the script (after the others have finished).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
work=$(mktemp -d "${TMPDIR:-/tmp}/mcp-access-tools.XXXXXX")
trap 'rm -rf "$work"' EXIT

jobs=(kube node informer gateway-informer netpol promtool)
run() { # JOB
  case $1 in
    kube) "$here/build-kube.sh" ;;
    node) "$here/build-node.sh" ;;
    informer) printf 'MCP_ACCESS_INFORMER_BIN=%q\n' "$("$here/build-informer.sh")" ;;
    gateway-informer) printf 'MCP_ACCESS_GATEWAY_INFORMER_BIN=%q\n' "$("$here/build-informer.sh" gateway-informer)" ;;
    netpol) printf 'MCP_ACCESS_NETPOL_ANALYZER_BIN=%q\n' "$("$here/build-netpol-analyzer.sh")" ;;
    promtool) printf 'MCP_ACCESS_PROMTOOL_BIN=%q\n' "$("$here/build-promtool.sh")" ;;
  esac
}

start=$SECONDS
pids=()
for job in "${jobs[@]}"; do
  run "$job" >"$work/$job.env" 2>"$work/$job.log" &
  pids+=($!)
done
failed=()
for i in "${!jobs[@]}"; do
  if ! wait "${pids[$i]}"; then
    failed+=("${jobs[$i]}")
  fi
done
for job in "${jobs[@]}"; do
  # What each build said (a cached tool says little or nothing), named by job.
  sed "s/^/tools: $job: /" "$work/$job.log" >&2
done
if ((${#failed[@]})); then
  echo "tools: failed: ${failed[*]}" >&2
  exit 1
fi
for job in "${jobs[@]}"; do cat "$work/$job.env"; done
echo "tools: ready in $((SECONDS - start))s" >&2
