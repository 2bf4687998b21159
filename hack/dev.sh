#!/usr/bin/env bash
# The quick loop: PostgreSQL under .dev/ and the apiserver in standalone mode (static admin
# token, self-signed certificate). Writes .dev/kubeconfig, prints KUBECONFIG=... when ready,
# and runs until interrupted. Safe to run again: it reuses .dev/ and restarts what it owns.
#   MCP_ACCESS_DEV_PORT (default 8443), MCP_ACCESS_DEV_METRICS_PORT (default 9090)
set -euo pipefail
cd "$(dirname "$0")/.."
. hack/lib/postgres.sh

root=$(pwd -P)/.dev
port=${MCP_ACCESS_DEV_PORT:-8443}
metrics_port=${MCP_ACCESS_DEV_METRICS_PORT:-9090}
mkdir -p "$root/certs"
chmod 755 "$root"

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

cargo build -p apiserver --bin mcp-access-apiserver >&2
bin=$(pwd -P)/target/debug/mcp-access-apiserver

apiserver_pid=
cleanup() {
  [ -n "$apiserver_pid" ] && kill "$apiserver_pid" 2>/dev/null && wait "$apiserver_pid" 2>/dev/null
  postgres_stop "$root/pg"
}
trap cleanup EXIT
trap 'exit 0' INT TERM

rm -f "$root/certs/apiserver.crt"
MCP_ACCESS_DATABASE_URL="$PG_DSN" "$bin" --standalone \
  --token-auth-file "$root/tokens.csv" \
  --cert-dir "$root/certs" \
  --bind-address 127.0.0.1 --secure-port "$port" --metrics-port "$metrics_port" \
  >"$root/apiserver.log" 2>&1 &
apiserver_pid=$!

for _ in $(seq 1 100); do
  if curl -fsS "http://127.0.0.1:$metrics_port/readyz" >/dev/null 2>&1; then break; fi
  if ! kill -0 "$apiserver_pid" 2>/dev/null; then
    cat "$root/apiserver.log" >&2
    echo "the apiserver exited; see above" >&2
    exit 1
  fi
  sleep 0.2
done

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

echo "apiserver log: $root/apiserver.log" >&2
echo "KUBECONFIG=$root/kubeconfig"
wait "$apiserver_pid"
