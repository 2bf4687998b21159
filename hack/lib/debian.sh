# Installing one of Debian's packages unattended for a test, its service never started.
# Source it, then: debian_install PACKAGE [ALTERNATIVE...] (the first that installs wins).
# Needs root and apt-get (the callers check both, to name what is missing).

debian_install() { # PACKAGE...
  # A package's postinst must not start the system service (nginx would listen on port 80 of
  # every address, Patroni would start a cluster): policy-rc.d refuses every start during the
  # install, as in container builds.
  local policy=/usr/sbin/policy-rc.d added_policy= pkg status=1
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod 755 "$policy"
    added_policy=1
  fi
  for pkg in "$@"; do
    if _debian_apt_install "$pkg"; then status=0; break; fi
  done
  if [ $status != 0 ]; then
    # The package lists may be missing or stale: refresh them once.
    apt-get update -q -o DPkg::Lock::Timeout=300 >&2 || true
    for pkg in "$@"; do
      if _debian_apt_install "$pkg"; then status=0; break; fi
    done
  fi
  if [ -n "$added_policy" ]; then rm -f "$policy"; fi
  return $status
}

_debian_apt_install() { # PACKAGE
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=300 \
    --no-install-recommends "$1" >&2
}

# Prints the path of the executable NAME (on PATH, or in /usr/sbin); when missing, installs the
# first of PACKAGES that installs (as root, with apt-get, never starting its service) and looks
# again. Fails naming what to do when it cannot. The caller's name goes in the messages.
#   debian_ensure CALLER NAME PACKAGE...
debian_ensure() {
  local caller=$1 name=$2
  shift 2
  _debian_find "$name" && return 0
  if [ "$(id -u)" != 0 ]; then
    echo "$caller: $name is not installed and this is not root; install it with" >&2
    echo "  apt-get install -y --no-install-recommends $1   (or put $name on PATH)" >&2
    return 1
  fi
  if ! command -v apt-get >/dev/null; then
    echo "$caller: $name is not installed and there is no apt-get; put $name on PATH" >&2
    return 1
  fi
  echo "$caller: $name not found; installing Debian's $1" >&2
  debian_install "$@" || return 1
  if ! _debian_find "$name"; then
    echo "$caller: the package installed, but no $name executable was found" >&2
    return 1
  fi
}

_debian_find() { # NAME
  command -v "$1" 2>/dev/null && return 0
  [ -x "/usr/sbin/$1" ] && echo "/usr/sbin/$1" && return 0
  return 1
}
