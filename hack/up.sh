#!/usr/bin/env bash
# MCP Access on this machine: etcd, kube-apiserver and kube-controller-manager (built once from
# the Go module proxy and cached), PostgreSQL, and mcp-access-apiserver behind its APIService
# with RBAC on, and mcp-access-controllers (one replica, log in .local/logs/). As root, also a
# real node (hack/node.sh: containerd, kubelet, kube-proxy, kube-router, CoreDNS) and on it the
# demo: an MCPServer behind mcp-access-gateway, a Host and its Context, a session token, and
# how to call a tool through the gateway (printed on stderr). Prints
# GATEWAY_SYNC_URL=<url> and GATEWAY_SYNC_CA=<path> (the gateway sync
# listener, see the README), HOST_API_URL=<url> and HOST_API_CA=<path> (the Host API,
# docs/hosts.md) and KUBECONFIG=<path> when ready; runs until interrupted.
# The release build (target/release; the first build takes a while); hack/test.sh tests the
# debug build.
# State lives in .local/ (MCP_ACCESS_LOCAL_DIR to change); running it again reuses it.
set -euo pipefail
cd "$(dirname "$0")/.."

. hack/lib/prereqs.sh
# PostgreSQL 15, kubectl, python3, openssl, curl, Go and Rust: checked before anything else;
# what can be installed unattended is (see hack/lib/prereqs.sh), the rest is named.
prereqs_ensure

dir=${MCP_ACCESS_LOCAL_DIR:-$(pwd -P)/.local}
hack/build-kube.sh >/dev/null
cargo build --release -p apiserver --bin mcp-access-apiserver \
  -p controllers --bin mcp-access-controllers -p gateway --bin mcp-access-gateway --bin mcp-access-stdio-bridge \
  -p e2e --bin mcp-access-local >&2
# The node (and the demo on it) needs root; MCP_ACCESS_LOCAL_NODE=0 leaves it out.
node=()
if [ "${MCP_ACCESS_LOCAL_NODE:-1}" = 0 ]; then
  echo "up.sh: MCP_ACCESS_LOCAL_NODE=0: no node, Pods stay Pending" >&2
elif [ "$(id -u)" != 0 ]; then
  echo "up.sh: not root, so no node (kubelet, containerd and iptables need root): Pods stay Pending" >&2
else
  hack/build-node.sh >/dev/null
  # The demo images and the printed command hold the official MCP Python SDK's venv.
  . hack/lib/mcp-sdk.sh
  MCP_ACCESS_MCP_PYTHON=$(mcp_sdk_python)
  export MCP_ACCESS_MCP_PYTHON
  node=(--node --gateway-bin target/release/mcp-access-gateway)
fi
exec target/release/mcp-access-local --dir "$dir" \
  --apiserver-bin target/release/mcp-access-apiserver \
  --controllers-bin target/release/mcp-access-controllers "${node[@]}"
