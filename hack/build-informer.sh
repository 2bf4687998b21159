#!/usr/bin/env bash
# Builds the client-go informer of the end-to-end tests (e2e/informer) from the Go module
# proxy, cached outside the repository by the hash of its sources. Prints the binary's path.
set -euo pipefail
cd "$(dirname "$0")/../e2e/informer"
cache=${MCP_ACCESS_CACHE:-$HOME/.cache/mcp-access}
hash=$(cat go.mod go.sum main.go | sha256sum | cut -c1-16)
out="$cache/bin/informer-$hash"
if [ ! -x "$out" ]; then
  mkdir -p "$cache/bin"
  echo "building the client-go informer..." >&2
  tmp=$(mktemp "$cache/bin/.informer.XXXXXX")
  CGO_ENABLED=0 go build -trimpath -o "$tmp" . >&2
  mv -f "$tmp" "$out"
fi
echo "$out"
