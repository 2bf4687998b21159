//go:build tools

// Package tools pins np-guard's netpol-analyzer, whose cmd/netpolicy hack/build-netpol-analyzer.sh
// builds as the independent oracle of controllers/tests/netpol_oracle.rs.
package tools

import (
	_ "github.com/np-guard/netpol-analyzer/cmd/netpolicy"
)
