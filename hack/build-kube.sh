#!/usr/bin/env bash
# Builds the control-plane binaries the end-to-end tests run as local processes:
#   kube-apiserver and kube-controller-manager (module k8s.io/kubernetes, pinned in hack/kube/go.mod)
#   etcd                                       (module go.etcd.io/etcd/server/v3, pinned in hack/etcd/go.mod)
# from the Go module proxy, into ${MCP_ACCESS_CACHE:-$HOME/.cache/mcp-access}/bin/, one file per
# version and source hash (e.g. kube-apiserver-v1.36.3-<key>, the key from go_tool_key in
# hack/lib/go-tool.sh: go.mod, go.sum, tools.go and the link flags). A binary already there is
# reused, so only the first run is slow (a cold build takes many minutes on 2 cores). To move to another release, change the
# version in the go.mod (and the staging replaces), run `go mod tidy` there, and commit both files.
#
# Stdout is only the lines
#   KUBE_APISERVER=/abs/path
#   KUBE_CONTROLLER_MANAGER=/abs/path
#   ETCD=/abs/path
# so callers can `env=$(hack/build-kube.sh); eval "$env"`; everything else goes to stderr. (Not
# `eval "$(hack/build-kube.sh)"`: eval of the empty output of a failed build succeeds, and
# `set -e` never sees the failure.)
#
# `hack/build-kube.sh kubectl` builds (or finds cached) only kubectl of the same pinned release
# (kubectl-v1.36.3 beside the others) and prints only KUBECTL=/abs/path; hack/lib/prereqs.sh
# runs it when no kubectl is on PATH.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
cache=${MCP_ACCESS_CACHE:-$HOME/.cache/mcp-access}
mkdir -p "$cache/bin"
bin=$(cd "$cache/bin" && pwd -P)
. "$here/lib/go-tool.sh"

log() { printf 'build-kube: %s\n' "$*" >&2; }

# The version a module requires, read from its go.mod (no go command needed, so a cached run is instant).
required_version() { # go.mod module
  local v
  v=$(awk -v m="$2" '($1 == "require" && $2 == m) { print $3 } (NF >= 2 && $1 == m) { print $2 }' "$1" | head -n1)
  if [[ -z $v ]]; then
    log "no 'require $2' in $1"
    exit 1
  fi
  printf '%s\n' "$v"
}

KUBE_VERSION=$(required_version "$here/kube/go.mod" k8s.io/kubernetes)
ETCD_VERSION=$(required_version "$here/etcd/go.mod" go.etcd.io/etcd/server/v3)

if [[ ! $KUBE_VERSION =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]]; then
  log "unexpected k8s.io/kubernetes version $KUBE_VERSION"
  exit 1
fi
kube_major=${BASH_REMATCH[1]}
kube_minor=${BASH_REMATCH[2]}

# build NAME MODULE_DIR PACKAGE [go build flags...]: go_build_cached (hack/lib/go-tool.sh) to
# $bin/NAME-<key>, its path left in $built.
build() { go_build_cached build-kube "$@"; }

kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$kube_major -X $pkg.gitMinor=$kube_minor"
  kube_ldflags+=" -X $pkg.gitTreeState=clean"
done

if [[ ${1:-} == kubectl ]]; then
  build "kubectl-$KUBE_VERSION" "$here/kube" k8s.io/kubernetes/cmd/kubectl -ldflags "$kube_ldflags"
  printf 'KUBECTL=%q\n' "$built"
  exit 0
elif [[ ${1:-} == node ]]; then
  # kubelet, kube-proxy and kube-scheduler of the same release, from their own tools module (hack/node), so the
  # control plane's cached binaries keep their keys; hack/build-node.sh calls this.
  build "kubelet-$KUBE_VERSION" "$here/node" k8s.io/kubernetes/cmd/kubelet -ldflags "$kube_ldflags"
  printf 'KUBELET=%q\n' "$built"
  build "kube-proxy-$KUBE_VERSION" "$here/node" k8s.io/kubernetes/cmd/kube-proxy -ldflags "$kube_ldflags"
  printf 'KUBE_PROXY=%q\n' "$built"
  build "kube-scheduler-$KUBE_VERSION" "$here/node" k8s.io/kubernetes/cmd/kube-scheduler -ldflags "$kube_ldflags"
  printf 'KUBE_SCHEDULER=%q\n' "$built"
  exit 0
elif [[ $# -gt 0 ]]; then
  log "usage: $0 [kubectl|node]"
  exit 2
fi

build "kube-apiserver-$KUBE_VERSION" "$here/kube" k8s.io/kubernetes/cmd/kube-apiserver -ldflags "$kube_ldflags"
printf 'KUBE_APISERVER=%q\n' "$built"
build "kube-controller-manager-$KUBE_VERSION" "$here/kube" k8s.io/kubernetes/cmd/kube-controller-manager -ldflags "$kube_ldflags"
printf 'KUBE_CONTROLLER_MANAGER=%q\n' "$built"
build "etcd-$ETCD_VERSION" "$here/etcd" go.etcd.io/etcd/server/v3 -ldflags "-s -w"
printf 'ETCD=%q\n' "$built"
