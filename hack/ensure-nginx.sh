#!/usr/bin/env bash
# Prints the path of an nginx binary, for the end-to-end scenario that puts a real nginx
# (`auth_request` to mcp-access-authz, deploy/gateways/nginx.conf) in front of a stand-in MCP
# server. An nginx on PATH (or /usr/sbin/nginx) is used as it is. Otherwise, as root, Debian's
# package is installed unattended (nginx-light, else nginx); its service is never started:
# the test runs nginx itself, in a temporary directory, on loopback.
#
#   MCP_ACCESS_NGINX_BIN=$(hack/ensure-nginx.sh)
set -euo pipefail
. "$(dirname "$0")/lib/debian.sh"
debian_ensure ensure-nginx.sh nginx nginx-light nginx
