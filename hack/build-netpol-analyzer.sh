#!/usr/bin/env bash
# Builds np-guard's netpol-analyzer (`cmd/netpolicy`, module github.com/np-guard/netpol-analyzer,
# pinned in hack/netpol-analyzer/go.mod) from the Go module proxy into
# ${MCP_ACCESS_CACHE:-$HOME/.cache/mcp-access}/bin/netpolicy-<version>, reused when present.
# It is the independent oracle of controllers/tests/netpol_oracle.rs. Prints only the binary's
# absolute path on stdout; everything else goes to stderr.
#
# go.sum is committed. sum.golang.org has no entry for github.com/np-guard/models v0.5.7 (404),
# so its lines were seeded from netpol-analyzer v1.4.4's own go.sum (itself verified through the
# checksum database); the default -mod=readonly build checks every download against go.sum.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
mod=github.com/np-guard/netpol-analyzer
version=$(awk -v m="$mod" '($1 == "require" && $2 == m) { print $3 } (NF >= 2 && $1 == m) { print $2 }' "$here/netpol-analyzer/go.mod" | head -n1)
if [[ ! $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "build-netpol-analyzer.sh: no exact 'require $mod' version in hack/netpol-analyzer/go.mod" >&2
  exit 1
fi
cache=${MCP_ACCESS_CACHE:-$HOME/.cache/mcp-access}
mkdir -p "$cache/bin"
bin=$(cd "$cache/bin" && pwd -P)
out="$bin/netpolicy-$version"
if [[ ! -x $out ]]; then
  if ! command -v go >/dev/null 2>&1; then
    echo "build-netpol-analyzer.sh: go is not on PATH (Go >= 1.23 is needed)" >&2
    exit 1
  fi
  echo "building netpol-analyzer $version..." >&2
  tmp=$(mktemp "$bin/.netpolicy.XXXXXX")
  trap 'rm -f "$tmp"' EXIT
  (cd "$here/netpol-analyzer" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" -o "$tmp" "$mod/cmd/netpolicy") >&2
  chmod 755 "$tmp"
  mv -f "$tmp" "$out"
fi
echo "$out"
