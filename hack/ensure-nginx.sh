#!/usr/bin/env bash
# Prints the path of an nginx binary, for the end-to-end scenario that puts a real nginx
# (`auth_request` to mcp-access-authz, deploy/gateways/nginx.conf) in front of a stand-in MCP
# server. An nginx on PATH (or /usr/sbin/nginx) is used as it is. Otherwise, as root, Debian's
# package is installed unattended (nginx-light, else nginx); its service is never started:
# the test runs nginx itself, in a temporary directory, on loopback.
#
#   MCP_ACCESS_NGINX_BIN=$(hack/ensure-nginx.sh)
set -euo pipefail

find_nginx() {
  command -v nginx 2>/dev/null && return 0
  [ -x /usr/sbin/nginx ] && echo /usr/sbin/nginx && return 0
  return 1
}

if find_nginx; then
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "ensure-nginx.sh: nginx is not installed and this is not root; install it with" >&2
  echo "  apt-get install -y nginx-light   (or nginx), or put an nginx binary on PATH" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "ensure-nginx.sh: nginx is not installed and there is no apt-get; put an nginx binary on PATH" >&2
  exit 1
fi

. "$(dirname "$0")/lib/debian.sh"
echo "ensure-nginx.sh: nginx not found; installing Debian's nginx-light" >&2
debian_install nginx-light nginx

if ! find_nginx; then
  echo "ensure-nginx.sh: the package installed, but no nginx binary was found" >&2
  exit 1
fi
