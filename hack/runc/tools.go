//go:build tools

// Package tools pins runc, the OCI runtime under the node's containerd, which hack/build-node.sh
// builds: Debian 12's runc 1.1.5 cannot start a Pod sandbox on this kernel (docs/local-node.md).
package tools

import (
	_ "github.com/opencontainers/runc"
)
