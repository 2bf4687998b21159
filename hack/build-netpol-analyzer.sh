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
. "$here/lib/go-tool.sh"
go_tool_build build-netpol-analyzer.sh "$here/netpol-analyzer" github.com/np-guard/netpol-analyzer cmd/netpolicy netpolicy 1.23
