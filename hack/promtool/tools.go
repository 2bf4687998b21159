//go:build tools

// Package tools pins Prometheus, whose cmd/promtool hack/build-promtool.sh builds to check
// deploy/monitoring's alerting rules (`promtool check rules`) in e2e/tests/cluster/monitoring.rs.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
