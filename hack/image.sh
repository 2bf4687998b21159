#!/usr/bin/env bash
# Builds the container images of MCP Access with buildah, FROM scratch, out of the binaries
# built on this machine: each image holds its binary, the shared libraries it links (ldd) and
# the dynamic loader, the CA certificates, and a passwd/group naming the non-root user
# 65532:65532 it runs as (the distroless "nonroot" user; no shell, nothing else). It is what
# the Containerfile builds onto a distroless base where base images can be pulled; here none
# can. Then, for each image, it runs `--help` inside a container of it (`buildah run`, as the
# image's user) and prints the image's user and entrypoint (`buildah inspect`).
#
#   hack/image.sh [--bin-dir DIR] [--tag TAG] [--oci-dir DIR] [NAME...]
#
# NAME: mcp-access-apiserver, mcp-access-controllers, mcp-access-gateway, mcp-access-authz
# (default: all four), or the local node's demo images, both the official MCP Python SDK
# (e2e/mcp/requirements.txt, the venv of hack/lib/mcp-sdk.sh) with this machine's CPython and
# e2e/mcp/*.py in /app, named localhost/mcp-access/NAME:<mcp version> (the SDK's, not TAG):
#   demo-mcp-server   runs /app/upstream.py on 0.0.0.0:8080 (an MCPServer with port 8080)
#   demo-host         runs /app/host.py, which waits; agents run in it with kubectl exec
# --oci-dir DIR: also write each image as DIR/NAME.oci.tar (an OCI archive that names the image),
# for hack/node.sh import.
# --bin-dir DIR: take DIR/NAME as built (e.g. target/debug); without it, a release build
# (cargo build --release --locked) into target/release. Images are named
# ${IMAGE_REPO:-ghcr.io/mcp-runtime}/NAME:TAG (TAG defaults to latest), the names deploy/
# refers to; push them with `buildah push`.
#
# buildah (and runc, the OCI runtime it runs containers with) are installed from Debian's
# packages when missing, as root. Storage is buildah's default; CONTAINERS_STORAGE_CONF
# points it elsewhere (the test does). When this machine cannot run a container, the run
# step prints exactly what failed and the images are built and inspected only.
set -euo pipefail
cd "$(dirname "$0")/.."

all=(mcp-access-apiserver mcp-access-controllers mcp-access-gateway mcp-access-authz)
repo=${IMAGE_REPO:-ghcr.io/mcp-runtime}
tag=latest
bin_dir=
oci_dir=
names=()
while [ $# -gt 0 ]; do
  case $1 in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --bin-dir=*) bin_dir=${1#*=}; shift ;;
    --tag) tag=$2; shift 2 ;;
    --tag=*) tag=${1#*=}; shift ;;
    --oci-dir) oci_dir=$2; shift 2 ;;
    --oci-dir=*) oci_dir=${1#*=}; shift ;;
    -h|--help) sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    mcp-access-apiserver|mcp-access-controllers|mcp-access-gateway|mcp-access-authz|demo-mcp-server|demo-host) names+=("$1"); shift ;;
    *) echo "image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#names[@]} -gt 0 ] || names=("${all[@]}")

# The report goes to stdout (the --help output indented under its image); builds to stderr.
say() { echo "image.sh: $*"; }

# Non-root user of every image (distroless's nonroot; deploy/base sets fsGroup 65532).
uid=65532
ca_bundle=/etc/ssl/certs/ca-certificates.crt

ensure_packages() {
  local missing=()
  command -v buildah >/dev/null || missing+=(buildah)
  # crun 1.8 (Debian 12) refuses hosts with cgroup v1 and v2 mounted side by side ("cgroups
  # in hybrid mode not supported"); runc runs there, and everywhere else.
  command -v runc >/dev/null || [ -x /usr/sbin/runc ] || missing+=(runc)
  [ -r "$ca_bundle" ] || missing+=(ca-certificates)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    say "missing ${missing[*]}: install them (Debian: apt-get install -y ${missing[*]})"
    exit 1
  fi
  say "installing ${missing[*]} from Debian's packages"
  if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${missing[@]}" >&2; then
    apt-get update -q -o DPkg::Lock::Timeout=300 >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=300 --no-install-recommends "${missing[@]}" >&2
  fi
}
ensure_packages
# IMAGE_RUNTIME picks another OCI runtime for the run step (e.g. crun).
runtime=${IMAGE_RUNTIME:-$(command -v runc || echo /usr/sbin/runc)}

demo_only=1
for n in "${names[@]}"; do
  case $n in demo-*) ;; *) demo_only= ;; esac
done
if [ -z "$bin_dir" ] && [ -z "$demo_only" ]; then
  build=()
  for n in "${names[@]}"; do
    case $n in
      mcp-access-apiserver) build+=(-p apiserver --bin "$n") ;;
      mcp-access-controllers) build+=(-p controllers --bin "$n") ;;
      mcp-access-gateway) build+=(-p gateway --bin "$n" --bin mcp-access-stdio-bridge) ;;
      mcp-access-authz) build+=(-p gateway --bin "$n") ;;
      demo-*) ;;
    esac
  done
  cargo build --release --locked "${build[@]}" >&2
  bin_dir=target/release
fi

containers=()
cleanup() {
  for c in "${containers[@]}"; do buildah rm "$c" >/dev/null 2>&1 || true; done
}
trap cleanup EXIT

# Copies a file of the host into the image root at the same path, symlinks resolved.
put() {
  local root=$1 path=$2
  mkdir -p "$root$(dirname "$path")"
  cp -L "$path" "$root$path"
}

# base_files ROOT LIBS: what every image holds besides its programs: the libraries LIBS (paths
# of this machine), the CA certificates, and the passwd/group of its non-root user with a home.
base_files() {
  local root=$1 lib
  for lib in $2; do put "$root" "$lib"; done
  put "$root" "$ca_bundle"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%s:%s:nonroot:/home/nonroot:/sbin/nologin\n' \
    "$uid" "$uid" >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:%s:\n' "$uid" >"$root/etc/group"
  mkdir -p "$root/home/nonroot"
  chown "$uid:$uid" "$root/home/nonroot"
}

build_image() {
  local name=$1 image=$2 bin=$bin_dir/$1
  [ -x "$bin" ] || { say "$bin: no such executable (build it, or pass --bin-dir)"; exit 1; }
  local c root
  c=$(buildah from --name "image-sh-$name-$$" scratch)
  containers+=("$c")
  root=$(buildah mount "$c")

  mkdir -p "$root/usr/local/bin" "$root/etc" "$root/tmp"
  chmod 1777 "$root/tmp"
  cp "$bin" "$root/usr/local/bin/$name"
  chmod 755 "$root/usr/local/bin/$name"
  # The gateway image also carries the stdio bridge: a stdio MCPServer's init container
  # copies it into the MCP container, a remote one runs it as its egress proxy.
  local bins=$bin
  if [ "$name" = mcp-access-gateway ]; then
    local bridge=$bin_dir/mcp-access-stdio-bridge
    [ -x "$bridge" ] || { say "$bridge: no such executable (build it, or pass --bin-dir)"; exit 1; }
    cp "$bridge" "$root/usr/local/bin/mcp-access-stdio-bridge"
    chmod 755 "$root/usr/local/bin/mcp-access-stdio-bridge"
    bins="$bin $bridge"
  fi
  # What the binaries link, and the loader ldd names (the line without "=>"). With two files
  # ldd heads each one's list with "<file>:" (one field), which is not a library.
  local libs
  libs=$(ldd $bins | awk 'NF > 1 && $2 == "=>" && $3 ~ /^\// {print $3} NF > 1 && $1 ~ /^\// {print $1}' | sort -u)
  [ -n "$libs" ] || { say "$bin: ldd found no libraries (not a dynamic executable?)"; exit 1; }
  base_files "$root" "$libs"
  buildah umount "$c" >/dev/null

  buildah config \
    --user "$uid:$uid" \
    --entrypoint "[\"/usr/local/bin/$name\"]" \
    --workingdir /home/nonroot \
    --label org.opencontainers.image.title="$name" \
    --label org.opencontainers.image.source=https://github.com/mcp-runtime/mcp-access \
    "$c"
  buildah commit --quiet --rm "$c" "$image" >/dev/null
  say "built $image: $bin, $(wc -w <<<"$libs") libraries ($(echo $libs | tr '\n' ' ')), $ca_bundle"
}

# The MCP Python SDK image: CPython (without its tests, IDLE, Tk and build files) at the path it
# was installed at (its libpython is found there), the SDK's venv at $image_venv, every library
# their programs and extension modules link, and e2e/mcp/*.py in /app.
image_venv=/opt/mcp-sdk
build_python_image() {
  local image=$1 python base venv c root libs
  # shellcheck source=hack/lib/mcp-sdk.sh
  . hack/lib/mcp-sdk.sh
  python=$(mcp_sdk_python)
  venv=$(cd "$(dirname "$python")/.." && pwd -P)
  base=$(sed -n 's/^home = \(.*\)\/bin$/\1/p' "$venv/pyvenv.cfg")
  [ -x "$base/bin/python3" ] || { say "$venv/pyvenv.cfg names no CPython home"; exit 1; }
  c=$(buildah from --name "image-sh-mcp-sdk-python-$$" scratch)
  containers+=("$c")
  root=$(buildah mount "$c")
  # The venv at a fixed path of its own: where the cache is on this machine (under /tmp, say)
  # may be where a Pod mounts a volume. Python finds a venv from the path it is started by.
  mkdir -p "$root$base" "$root$image_venv" "$root/app" "$root/etc" "$root/tmp"
  chmod 1777 "$root/tmp"
  tar -C "$base" --exclude='lib/python3.*/test' --exclude='lib/python3.*/site-packages' \
    --exclude='lib/python3.*/idlelib' --exclude='lib/python3.*/tkinter' \
    --exclude='lib/python3.*/ensurepip' --exclude='lib/python3.*/lib2to3' \
    --exclude='lib/python3.*/turtledemo' --exclude='lib/python3.*/config-*' \
    --exclude='*.a' --exclude=share --exclude=include -cf - . | tar -C "$root$base" -xf -
  tar -C "$venv" -cf - . | tar -C "$root$image_venv" -xf -
  cp e2e/mcp/*.py "$root/app/"
  # (ldd fails on the scripts among them: its status is not the point, its output is.)
  libs=$({ find "$base"/bin/python3* "$base"/lib/libpython3* "$base"/lib/python3.*/lib-dynload "$venv/lib" \
    -type f \( -name '*.so*' -o -perm -u+x \) -print0 | xargs -0 -r ldd 2>/dev/null || true; } |
    awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' |
    grep -v -F -e "$base" -e "$venv" | sort -u)
  base_files "$root" "$libs"
  # CPython lives under /root on this machine: the image's user must traverse it.
  chmod 755 "$root/root" 2>/dev/null || true
  buildah umount "$c" >/dev/null
  buildah config --user "$uid:$uid" --entrypoint "[\"$image_venv/bin/python\"]" --workingdir /app \
    --env PYTHONDONTWRITEBYTECODE=1 --env PYTHONUNBUFFERED=1 \
    --label org.opencontainers.image.title=mcp-sdk-python "$c"
  buildah commit --quiet --rm "$c" "$image" >/dev/null
  sdk_python=$image_venv/bin/python
  say "built $image: CPython $base, the SDK venv $venv at $image_venv, $(wc -w <<<"$libs") libraries, e2e/mcp/*.py"
}

# demo_image NAME IMAGE: one of the demo images, the SDK image with the command NAME runs.
demo_image() {
  local name=$1 image=$2 c sdk
  sdk=localhost/mcp-access/mcp-sdk-python:${image##*:}
  [ -n "${sdk_python:-}" ] || build_python_image "$sdk"
  c=$(buildah from --name "image-sh-$name-$$" "$sdk")
  containers+=("$c")
  case $name in
    demo-mcp-server) entry="[\"$sdk_python\", \"/app/upstream.py\", \"--listen\", \"0.0.0.0:8080\", \"--log-level\", \"info\"]" ;;
    demo-host) entry="[\"$sdk_python\", \"/app/host.py\"]" ;;
  esac
  buildah config --entrypoint "$entry" --label org.opencontainers.image.title="$name" "$c"
  buildah commit --quiet --rm "$c" "$image" >/dev/null
  say "built $image: $sdk running $entry"
}

# `--help` inside a container of the image, as the image's user; false (with the reason
# printed) when no container can run here.
run_help() {
  local name=$1 image=$2 c out status=0
  c=$(buildah from --name "image-sh-run-$name-$$" "$image")
  containers+=("$c")
  out=$(buildah run --runtime "$runtime" "$c" -- "/usr/local/bin/$name" --help 2>&1) || status=$?
  buildah rm "$c" >/dev/null
  if [ $status -ne 0 ]; then
    # The runtime could not start the container (namespaces, cgroups, mounts): the sandbox.
    # Anything else (a library missing, the binary failing) is the image's fault.
    if ! grep -q -E 'error running container|while running runtime|OCI runtime|creating container' <<<"$out"; then
      say "run $image: $name --help failed inside the container (exit $status):"
      sed 's/^/    /' <<<"$out"
      exit 1
    fi
    say "cannot run a container here (buildah run --runtime $runtime, exit $status): $out"
    say "run $image: skipped; the image was built and inspected only"
    return 1
  fi
  say "run $image: $name --help (as the image's user, $runtime):"
  sed 's/^/    /' <<<"$out"
}

export_archive() { # NAME IMAGE
  [ -n "$oci_dir" ] || return 0
  mkdir -p "$oci_dir"
  rm -f "$oci_dir/$1.oci.tar"
  buildah push --quiet "$2" "oci-archive:$oci_dir/$1.oci.tar:$2" >/dev/null
  say "wrote $oci_dir/$1.oci.tar"
}

can_run=1
for name in "${names[@]}"; do
  case $name in
    demo-*)
      image=localhost/mcp-access/$name:$(sed -n 's/^mcp==\([0-9][0-9.]*\).*/\1/p' e2e/mcp/requirements.txt)
      demo_image "$name" "$image"
      export_archive "$name" "$image"
      continue
      ;;
  esac
  image=$repo/$name:$tag
  build_image "$name" "$image"
  export_archive "$name" "$image"
  config=$(buildah inspect --type image --format \
    'user={{.OCIv1.Config.User}} entrypoint={{.OCIv1.Config.Entrypoint}}' "$image")
  say "inspect $image: $config"
  if [ $can_run = 1 ]; then
    run_help "$name" "$image" || can_run=0
  else
    say "run $image: skipped; the image was built and inspected only"
  fi
done
