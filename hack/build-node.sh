#!/usr/bin/env bash
# Builds (or finds cached) what the local node runs, each from an exact version in a tools module
# of its own with a committed go.sum, into ${MCP_ACCESS_CACHE:-$HOME/.cache/mcp-access}/bin/ keyed
# by version and source hash (hack/lib/go-tool.sh), like hack/build-kube.sh:
#   kubelet, kube-proxy, kube-scheduler
#                            k8s.io/kubernetes, the release of kube-apiserver (hack/node/go.mod)
#   containerd, its runc shim and ctr
#                            github.com/containerd/containerd/v2 (hack/containerd/go.mod): Debian
#                            12's containerd is 1.6, and kubelet 1.36 needs containerd 2
#   kube-router              github.com/cloudnativelabs/kube-router/v2 (hack/kube-router/go.mod),
#                            run only as the NetworkPolicy enforcer (iptables + ipset; see
#                            docs/local-node.md for why not kube-network-policies)
#   runc                     github.com/opencontainers/runc (hack/runc/go.mod): Debian 12's
#                            runc 1.1.5 cannot start a Pod sandbox here
#   coredns                  github.com/coredns/coredns (hack/coredns/go.mod): the cluster DNS,
#                            a Pod labelled k8s-app=kube-dns in kube-system
#   pause                    k8s.io/kubernetes's build/pause/linux/pause.c, compiled static by gcc
# Stdout is only NAME=/abs/path lines (KUBELET KUBE_PROXY KUBE_SCHEDULER CONTAINERD CONTAINERD_SHIM CTR
# RUNC KUBE_ROUTER COREDNS PAUSE), for `env=$(hack/build-node.sh); eval "$env"`; the rest goes to stderr.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
. "$here/lib/go-tool.sh"

version_of() { # DIR MODULE
  awk -v m="$2" '($1 == "require" && $2 == m) { print $3 } (NF >= 2 && $1 == m) { print $2 }' "$1/go.mod" | head -n1
}

ctrd=github.com/containerd/containerd/v2
ctrd_version=$(version_of "$here/containerd" "$ctrd")
# no_btrfs: the btrfs snapshotter needs cgo and btrfs headers; the node uses overlayfs.
ctrd_flags=(-tags no_btrfs -ldflags "-s -w -X $ctrd/version.Version=$ctrd_version -X $ctrd/version.Package=$ctrd")
go_build_cached build-node "containerd-$ctrd_version" "$here/containerd" "$ctrd/cmd/containerd" "${ctrd_flags[@]}"
printf 'CONTAINERD=%q\n' "$built"
go_build_cached build-node "containerd-shim-runc-v2-$ctrd_version" "$here/containerd" "$ctrd/cmd/containerd-shim-runc-v2" "${ctrd_flags[@]}"
printf 'CONTAINERD_SHIM=%q\n' "$built"
go_build_cached build-node "ctr-$ctrd_version" "$here/containerd" "$ctrd/cmd/ctr" "${ctrd_flags[@]}"
printf 'CTR=%q\n' "$built"

# runc needs cgo (its nsenter is C) and libseccomp (containerd gives Pod sandboxes the
# RuntimeDefault seccomp profile): Debian's libseccomp-dev and pkg-config, installed when missing.
rc_mod=github.com/opencontainers/runc
rc_version=$(version_of "$here/runc" "$rc_mod")
if ! pkg-config --exists libseccomp 2>/dev/null; then
  . "$here/lib/debian.sh"
  echo "build-node: installing libseccomp-dev and pkg-config from Debian's packages" >&2
  debian_install libseccomp-dev >&2 && debian_install pkg-config >&2 ||
    { echo "build-node: could not install libseccomp-dev and pkg-config (runc needs them)" >&2; exit 1; }
fi
CGO_ENABLED=1 go_build_cached build-node "runc-$rc_version" "$here/runc" "$rc_mod" \
  -tags seccomp -ldflags "-s -w -X main.version=${rc_version#v}"
printf 'RUNC=%q\n' "$built"

kr=github.com/cloudnativelabs/kube-router/v2
kr_version=$(version_of "$here/kube-router" "$kr")
go_build_cached build-node "kube-router-$kr_version" "$here/kube-router" "$kr/cmd/kube-router" \
  -ldflags "-s -w -X $kr/pkg/version.Version=$kr_version"
printf 'KUBE_ROUTER=%q\n' "$built"

cd_mod=github.com/coredns/coredns
cd_version=$(version_of "$here/coredns" "$cd_mod")
go_build_cached build-node "coredns-$cd_version" "$here/coredns" "$cd_mod" \
  -ldflags "-s -w -X $cd_mod/coremain.GitCommit=$cd_version"
printf 'COREDNS=%q\n' "$built"

# Last: these share most packages with kube-apiserver, whose build (hack/tools.sh runs it beside
# this one) has filled Go's build cache by now on a cold machine.
"$here/build-kube.sh" node

# The pause container's one binary, from the Kubernetes release's own source in the module cache.
kube_version=$(version_of "$here/node" k8s.io/kubernetes)
src=$(cd "$here/node" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
cache=${MCP_ACCESS_CACHE:-$HOME/.cache/mcp-access}
pause=$cache/bin/pause-$kube_version-$(sha256sum "$src" | cut -c1-16)
if [[ ! -x $pause ]]; then
  tmp=$(mktemp "$cache/bin/.pause.XXXXXX")
  gcc -Os -static -Wall -Werror -DVERSION="$kube_version" -o "$tmp" "$src"
  strip "$tmp"
  mv -f "$tmp" "$pause"
  echo "build-node: pause: built -> $pause" >&2
fi
printf 'PAUSE=%q\n' "$pause"
