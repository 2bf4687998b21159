//go:build tools

// Package tools pins the etcd server that hack/build-kube.sh builds
// (the module root of go.etcd.io/etcd/server/v3 is the etcd main package).
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
