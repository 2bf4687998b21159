#!/usr/bin/env bash
# Builds a client-go program of the end-to-end tests from the Go module proxy, cached outside
# the repository by the hash of its sources. Prints the binary's path.
#   hack/build-informer.sh                    e2e/informer: an informer through kube-apiserver
#   hack/build-informer.sh gateway-informer   e2e/gateway-informer: the Go gateway recipe (8085)
set -euo pipefail
name=${1:-informer}
case $name in
  informer | gateway-informer) ;;
  *) echo "build-informer.sh: unknown program '$name' (informer, gateway-informer)" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../e2e/$name"
cache=${MCP_ACCESS_CACHE:-$HOME/.cache/mcp-access}
hash=$(cat go.mod go.sum main.go | sha256sum | cut -c1-16)
out="$cache/bin/$name-$hash"
if [ ! -x "$out" ]; then
  mkdir -p "$cache/bin"
  echo "building the client-go $name..." >&2
  tmp=$(mktemp "$cache/bin/.$name.XXXXXX")
  CGO_ENABLED=0 go build -trimpath -o "$tmp" . >&2
  mv -f "$tmp" "$out"
fi
echo "$out"
