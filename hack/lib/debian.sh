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
