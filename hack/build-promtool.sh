#!/usr/bin/env bash
# Builds Prometheus's promtool (`cmd/promtool`, module github.com/prometheus/prometheus, pinned
# in hack/promtool/go.mod) from the Go module proxy into
# ${MCP_ACCESS_CACHE:-$HOME/.cache/mcp-access}/bin/promtool-<version>, reused when present.
# It checks deploy/monitoring's alerting rules (`promtool check rules`) in the e2e scenario
# e2e/tests/cluster/monitoring.rs. Prints only the binary's absolute path on stdout; everything
# else goes to stderr.
#
# The module proxy serves exact versions only: Prometheus 3.x is published as module versions
# v0.3XX.Y. go.sum is committed; the default -mod=readonly build checks every download
# against it.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
mod=github.com/prometheus/prometheus
version=$(awk -v m="$mod" '($1 == "require" && $2 == m) { print $3 } (NF >= 2 && $1 == m) { print $2 }' "$here/promtool/go.mod" | head -n1)
if [[ ! $version =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  echo "build-promtool.sh: no exact 'require $mod' version in hack/promtool/go.mod" >&2
  exit 1
fi
cache=${MCP_ACCESS_CACHE:-$HOME/.cache/mcp-access}
mkdir -p "$cache/bin"
bin=$(cd "$cache/bin" && pwd -P)
out="$bin/promtool-$version"
if [[ ! -x $out ]]; then
  if ! command -v go >/dev/null 2>&1; then
    echo "build-promtool.sh: go is not on PATH (Go >= 1.25 is needed)" >&2
    exit 1
  fi
  echo "building promtool $version..." >&2
  tmp=$(mktemp "$bin/.promtool.XXXXXX")
  trap 'rm -f "$tmp"' EXIT
  (cd "$here/promtool" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" -o "$tmp" "$mod/cmd/promtool") >&2
  chmod 755 "$tmp"
  mv -f "$tmp" "$out"
fi
echo "$out"
