#!/usr/bin/env bash
# What hack/up.sh and hack/test.sh need on this machine, checked before anything is built or
# started, and installed when that can be done unattended. A machine with only Rust and Go is
# enough: as root, the rest comes from apt and from the Go module proxy.
#
#   cargo, go            not installed here (https://rustup.rs, https://go.dev/dl/): named and stop
#   python3, openssl,    Debian packages of the same names (free ports, the local PKI, readiness
#   curl                 probes)
#   CA certificates      /etc/ssl/certs/ca-certificates.crt (Debian's ca-certificates): Go
#                        fetches modules over HTTPS from the Go module proxy
#   PostgreSQL 15        initdb, pg_ctl and postgres in $PG_BIN (default /usr/lib/postgresql/15/bin,
#                        where the Debian package postgresql-15 puts them); as root, the postgres
#                        system user (initdb and postgres refuse to run as root)
#   kubectl              any kubectl on PATH; without one, `hack/build-kube.sh kubectl` builds the
#                        pinned release's kubectl from the Go module proxy (cached beside
#                        kube-apiserver as kubectl-vX.Y.Z-<key>) and its directory goes first on PATH
#
# As root, missing packages are installed with `apt-get install -y --no-upgrade` (nothing already
# installed is upgraded). Debian's postgresql-15 also creates the cluster 15/main (port 5432) and
# starts it where an init system runs; nothing here uses it (each script starts its own server
# on a free port), and `pg_dropcluster --stop 15 main` removes it.
# Not root, no apt-get, or MCP_ACCESS_NO_INSTALL=1: it prints what is missing and the exact
# command that installs it, and fails.
#
# Source it and call prereqs_ensure (it exports PG_BIN and PATH), or run it: then stdout is
# only PG_BIN=<dir> and KUBECTL=<path>, everything else goes to stderr.

PREREQS_PG_PACKAGE=postgresql-15
PREREQS_PG_DEFAULT_BIN=/usr/lib/postgresql/15/bin
PREREQS_CA_BUNDLE=${PREREQS_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}

_prereqs_log() { printf 'prereqs: %s\n' "$*" >&2; }

_prereqs_pg_ok() { # DIR
  [ -x "$1/initdb" ] && [ -x "$1/pg_ctl" ] && [ -x "$1/postgres" ]
}

# The kubectl directory for the pinned release: a directory holding only a `kubectl` link to
# the cached binary, so that it can go first on PATH.
_prereqs_kubectl_from_cache() { # REPO
  local out kubectl dir
  out=$("$1/hack/build-kube.sh" kubectl) || return 1
  kubectl=${out#KUBECTL=}
  [ -x "$kubectl" ] || { _prereqs_log "hack/build-kube.sh kubectl printed '$out'"; return 1; }
  dir=$(dirname "$kubectl")/$(basename "$kubectl").path
  mkdir -p "$dir"
  ln -sfn "$kubectl" "$dir/kubectl"
  PATH=$dir:$PATH
  export PATH
}

# Checks; installs what it may; exports PG_BIN and PATH. Returns non-zero, having said what is
# missing and how to get it, when something is still missing.
prereqs_ensure() {
  local repo root=0 may_install=1 missing=() fixes=() apt=() stop=0 need_kubectl=0 c
  repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
  [ "$(id -u)" = 0 ] && root=1
  if [ "${MCP_ACCESS_NO_INSTALL:-}" = 1 ] || [ $root = 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    may_install=0
  fi
  PG_BIN=${PG_BIN:-$PREREQS_PG_DEFAULT_BIN}

  if ! command -v cargo >/dev/null 2>&1; then
    missing+=("cargo is not on PATH (Rust builds every MCP Access binary)")
    fixes+=("install Rust with rustup (https://rustup.rs), then open a new shell or run: . \"\$HOME/.cargo/env\"")
    stop=1
  fi
  if ! command -v go >/dev/null 2>&1; then
    missing+=("go is not on PATH (Go >= 1.26 builds kube-apiserver, etcd, kubectl and the client-go test programs from the Go module proxy)")
    fixes+=("install Go from https://go.dev/dl/ and put its bin directory on PATH (e.g. export PATH=/usr/local/go/bin:\$PATH)")
    stop=1
  fi
  for c in python3 openssl curl; do
    if ! command -v "$c" >/dev/null 2>&1; then
      missing+=("$c is not on PATH")
      apt+=("$c")
    fi
  done
  if [ ! -s "$PREREQS_CA_BUNDLE" ]; then
    missing+=("CA certificates: no $PREREQS_CA_BUNDLE (Go fetches modules from the Go module proxy over HTTPS)")
    apt+=(ca-certificates)
  fi
  if ! _prereqs_pg_ok "$PG_BIN"; then
    missing+=("PostgreSQL 15 server binaries: no initdb, pg_ctl and postgres in $PG_BIN (PG_BIN)")
    apt+=("$PREREQS_PG_PACKAGE")
  elif [ $root = 1 ] && ! id -u postgres >/dev/null 2>&1; then
    missing+=("the postgres system user (as root, initdb and postgres run as postgres)")
    apt+=("$PREREQS_PG_PACKAGE")
  fi
  if [ $root = 1 ] && ! command -v runuser >/dev/null 2>&1; then
    missing+=("runuser is not on PATH (runs PostgreSQL as postgres)")
    apt+=(util-linux)
  fi
  if ! command -v kubectl >/dev/null 2>&1; then
    need_kubectl=1
    missing+=("kubectl is not on PATH")
    fixes+=("run: hack/build-kube.sh kubectl (needs go; hack/up.sh and hack/test.sh run it themselves and put that kubectl first on PATH)")
  fi

  if [ ${#missing[@]} = 0 ]; then
    export PG_BIN
    return 0
  fi
  _prereqs_log "missing:"
  for c in "${missing[@]}"; do _prereqs_log "  - $c"; done
  if [ ${#apt[@]} -gt 0 ]; then
    if command -v apt-get >/dev/null 2>&1; then
      fixes+=("run as root: apt-get install -y ${apt[*]}")
    else
      fixes+=("install ${apt[*]} with this system's package manager (PostgreSQL 15's server binaries: set PG_BIN to the directory with initdb)")
    fi
  fi

  if ! _prereqs_pg_ok "$PG_BIN" && _prereqs_pg_ok "$PREREQS_PG_DEFAULT_BIN"; then
    fixes+=("or leave PG_BIN unset: $PREREQS_PG_DEFAULT_BIN has them")
  fi

  # kubectl alone is built whoever runs this (it needs neither root nor anything outside the
  # user's cache); packages only as root; cargo and go never.
  local why=()
  [ $stop = 1 ] && why+=("Rust and Go are not installed by this script")
  if [ "${MCP_ACCESS_NO_INSTALL:-}" = 1 ]; then
    why+=("MCP_ACCESS_NO_INSTALL=1: nothing was installed")
  elif [ ${#apt[@]} -gt 0 ] && [ $root = 0 ]; then
    why+=("not root: nothing was installed")
  elif [ ${#apt[@]} -gt 0 ] && [ $may_install = 0 ]; then
    why+=("no apt-get: nothing was installed")
  fi
  if [ ${#why[@]} -gt 0 ]; then
    local joined
    joined=$(printf '%s; ' "${why[@]}")
    _prereqs_log "to get them (${joined%; }):"
    for c in "${fixes[@]}"; do _prereqs_log "  - $c"; done
    return 1
  fi

  if [ ${#apt[@]} -gt 0 ]; then
    local apt_install=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300
      install -y --no-upgrade --no-install-recommends "${apt[@]}")
    _prereqs_log "installing: apt-get install -y --no-upgrade --no-install-recommends ${apt[*]}"
    if ! "${apt_install[@]}" >&2; then
      # A fresh machine's package lists may be empty or stale.
      _prereqs_log "apt-get install failed; running apt-get update and trying again"
      env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 update >&2 &&
        "${apt_install[@]}" >&2 || {
        _prereqs_log "could not install ${apt[*]} (see apt-get's output above)"
        return 1
      }
    fi
    hash -r
    if ! _prereqs_pg_ok "$PG_BIN" && _prereqs_pg_ok "$PREREQS_PG_DEFAULT_BIN"; then
      _prereqs_log "PG_BIN=$PG_BIN has no server binaries; using $PREREQS_PG_DEFAULT_BIN ($PREREQS_PG_PACKAGE)"
      PG_BIN=$PREREQS_PG_DEFAULT_BIN
    fi
  fi
  if [ $need_kubectl = 1 ]; then
    _prereqs_log "building kubectl: hack/build-kube.sh kubectl"
    _prereqs_kubectl_from_cache "$repo" || { _prereqs_log "could not build kubectl"; return 1; }
    _prereqs_log "kubectl: $(command -v kubectl)"
  fi

  # Whatever an install did not fix is still missing.
  local left=()
  for c in python3 openssl curl kubectl; do
    command -v "$c" >/dev/null 2>&1 || left+=("$c")
  done
  _prereqs_pg_ok "$PG_BIN" || left+=("PostgreSQL server binaries in $PG_BIN")
  [ -s "$PREREQS_CA_BUNDLE" ] || left+=("$PREREQS_CA_BUNDLE")
  if [ $root = 1 ]; then
    id -u postgres >/dev/null 2>&1 || left+=("the postgres user")
    command -v runuser >/dev/null 2>&1 || left+=("runuser")
  fi
  if [ ${#left[@]} -gt 0 ]; then
    _prereqs_log "still missing after installing: ${left[*]}"
    return 1
  fi
  _prereqs_log "ok: PostgreSQL $("$PG_BIN/postgres" --version | awk '{print $3}') in $PG_BIN, kubectl $(command -v kubectl)"
  export PG_BIN
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  prereqs_ensure
  printf 'PG_BIN=%q\n' "$PG_BIN"
  printf 'KUBECTL=%q\n' "$(command -v kubectl)"
fi
