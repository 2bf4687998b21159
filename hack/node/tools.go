//go:build tools

// Package tools pins the node components that hack/build-node.sh builds: kubelet and kube-proxy
// of the same Kubernetes release as hack/kube (kube-apiserver).
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
