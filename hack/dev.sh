#!/usr/bin/env bash
# The quick loop: PostgreSQL under .dev/ and the apiserver in standalone mode (static admin
# token, self-signed certificate). Writes .dev/kubeconfig, prints KUBECONFIG=... when ready,
# and runs until interrupted. Safe to run again: it reuses .dev/ and restarts what it owns.
#   MCP_ACCESS_DEV_PORT (default 8443), MCP_ACCESS_DEV_METRICS_PORT (default 9090),
#   MCP_ACCESS_DEV_DIR (default .dev), MCP_ACCESS_APISERVER_BIN (default: cargo build it)
#
# "Ready" is the readiness of the apiserver this script started, never of whatever else answers
# on those ports: both ports must be free before it starts, the process must still be alive,
# must itself hold both listening sockets, must serve TLS with the certificate it generated for
# this run, and must answer /readyz. Anything else fails loudly with a non-zero exit status.
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib/postgres.sh

root=${MCP_ACCESS_DEV_DIR:-$(pwd -P)/.dev}
port=${MCP_ACCESS_DEV_PORT:-8443}
metrics_port=${MCP_ACCESS_DEV_METRICS_PORT:-9090}
ready_timeout=${MCP_ACCESS_DEV_READY_TIMEOUT:-60}
mkdir -p "$root/certs"
root=$(cd "$root" && pwd -P)
chmod 755 "$root"

die() { echo "dev.sh: error: $*" >&2; exit 1; }

# Whether something (anyone) listens on 127.0.0.1:PORT: binding it is the only reliable test.
port_is_free() { # PORT
  python3 - "$1" <<'EOF' 2>/dev/null
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
EOF
}

# Who listens on PORT, for the error message (best effort: ss shows only our own processes).
port_holder() { # PORT
  if command -v ss >/dev/null 2>&1; then
    ss -Hltnp "sport = :$1" 2>/dev/null | head -n1
  fi
}

# Whether process PID itself holds a listening TCP socket on PORT: the socket inode from
# /proc/net/tcp{,6} (state 0A = LISTEN) must be one of the process's open files.
holds_listener() { # PID PORT
  local pid=$1 hex inode
  hex=$(printf '%04X' "$2")
  for inode in $(awk -v p=":$hex" '$2 ~ (p "$") && $4 == "0A" { print $10 }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null); do
    if find "/proc/$pid/fd" -lname "socket:\[$inode\]" 2>/dev/null | grep -q .; then
      return 0
    fi
  done
  return 1
}

for p in "$port" "$metrics_port"; do
  if ! port_is_free "$p"; then
    holder=$(port_holder "$p")
    die "port $p is already in use${holder:+ ($holder)}; stop that server or choose other" \
      "ports with MCP_ACCESS_DEV_PORT and MCP_ACCESS_DEV_METRICS_PORT"
  fi
done
[[ $port != "$metrics_port" ]] || die "MCP_ACCESS_DEV_PORT and MCP_ACCESS_DEV_METRICS_PORT are both $port"

# A previous run that was killed hard may have left PostgreSQL running.
postgres_stop "$root/pg"
postgres_start "$root/pg"
echo "PostgreSQL on 127.0.0.1:$PGPORT_STARTED (data in $root/pg)" >&2

if [ ! -s "$root/tokens.csv" ]; then
  token=$(python3 -c 'import secrets; print(secrets.token_hex(24))')
  printf '%s,admin,admin-uid,"system:masters"\n' "$token" >"$root/tokens.csv"
  chmod 600 "$root/tokens.csv"
fi
token=$(cut -d, -f1 <"$root/tokens.csv" | head -n1)

# The session-token signing key (EC P-256, PKCS#8, mode 600): kept across runs so tokens
# minted before a restart still verify.
if [ ! -s "$root/session-token.key" ]; then
  (umask 077 && openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 \
    -out "$root/session-token.key" 2>/dev/null) || die "openssl could not generate the session-token key"
fi
chmod 600 "$root/session-token.key"

if [[ -n ${MCP_ACCESS_APISERVER_BIN:-} ]]; then
  bin=$MCP_ACCESS_APISERVER_BIN
else
  cargo build -p apiserver --bin mcp-access-apiserver >&2
  bin=$(pwd -P)/target/debug/mcp-access-apiserver
fi

apiserver_pid=
cleanup() {
  if [[ -n $apiserver_pid ]]; then
    kill "$apiserver_pid" 2>/dev/null || true
    wait "$apiserver_pid" 2>/dev/null || true
  fi
  postgres_stop "$root/pg"
}
trap cleanup EXIT
trap 'exit 0' INT TERM

# The certificate is generated afresh by the process started below (a new key every start), so
# a TLS handshake that verifies against it can only be with that process.
rm -f "$root/certs/apiserver.crt"
MCP_ACCESS_DATABASE_URL="$PG_DSN" "$bin" --standalone \
  --token-auth-file "$root/tokens.csv" \
  --session-token-signing-key-file "$root/session-token.key" \
  --session-token-issuer "https://mcp-access.dev.local" \
  --cert-dir "$root/certs" \
  --bind-address 127.0.0.1 --secure-port "$port" --metrics-port "$metrics_port" \
  >"$root/apiserver.log" 2>&1 &
apiserver_pid=$!

not_ready() {
  tail -n 40 "$root/apiserver.log" >&2 || true
  die "$* (apiserver log: $root/apiserver.log)"
}

# Ready when all of: our process is alive, holds both listeners, serves TLS with its own
# certificate, and says it is ready.
own_readiness() {
  holds_listener "$apiserver_pid" "$port" &&
    holds_listener "$apiserver_pid" "$metrics_port" &&
    [[ -s $root/certs/apiserver.crt ]] &&
    curl -fsS --max-time 2 --cacert "$root/certs/apiserver.crt" \
      "https://127.0.0.1:$port/readyz" >/dev/null 2>&1 &&
    curl -fsS --max-time 2 "http://127.0.0.1:$metrics_port/readyz" >/dev/null 2>&1
}

start=$SECONDS
until own_readiness; do
  kill -0 "$apiserver_pid" 2>/dev/null || not_ready "the apiserver (pid $apiserver_pid) exited"
  ((SECONDS - start < ready_timeout)) ||
    not_ready "the apiserver (pid $apiserver_pid) was not ready after ${ready_timeout}s"
  sleep 0.2
done
# The listeners were checked before /readyz answered; check the process once more after.
kill -0 "$apiserver_pid" 2>/dev/null || not_ready "the apiserver (pid $apiserver_pid) exited"

cat >"$root/kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: mcp-access-dev
  cluster:
    server: https://127.0.0.1:$port
    certificate-authority: $root/certs/apiserver.crt
users:
- name: admin
  user:
    token: $token
contexts:
- name: mcp-access-dev
  context: {cluster: mcp-access-dev, user: admin, namespace: default}
current-context: mcp-access-dev
KUBECONFIG
chmod 600 "$root/kubeconfig"

echo "apiserver (pid $apiserver_pid) log: $root/apiserver.log" >&2
echo "KUBECONFIG=$root/kubeconfig"
wait "$apiserver_pid"
