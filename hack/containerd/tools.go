//go:build tools

// Package tools pins containerd (the node's container runtime), its runc shim and ctr, which
// hack/build-node.sh builds: Debian's containerd 1.6 is older than kubelet 1.36 supports.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
