//go:build tools

// Package tools pins CoreDNS, the local node's cluster DNS (a Pod labelled k8s-app=kube-dns in
// kube-system, as the controllers' policies expect), which hack/build-node.sh builds.
package tools

import (
	_ "github.com/coredns/coredns"
)
