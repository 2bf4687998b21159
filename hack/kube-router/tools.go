//go:build tools

// Package tools pins kube-router, whose network-policy controller (iptables + ipset) is the
// local node's NetworkPolicy enforcer; hack/build-node.sh builds it.
package tools

import (
	_ "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
)
