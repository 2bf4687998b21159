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
. "$here/lib/go-tool.sh"
go_tool_build build-promtool.sh "$here/promtool" github.com/prometheus/prometheus cmd/promtool promtool 1.25
