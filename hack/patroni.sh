#!/usr/bin/env bash
# A 3-member PostgreSQL 15 cluster under Patroni, etcd its store, on loopback, in DIR: the
# PostgreSQL HA test's database (apiserver/tests/ha_patroni.rs). Synchronous replication
# (`synchronous_mode: true`): a commit is acknowledged once a standby has it, so the standby
# Patroni promotes when the primary dies holds every acknowledged write.
#
#   hack/patroni.sh start DIR        prints PATRONI_DSN=... (every member, target_session_attrs=
#                                    read-write) and PATRONI_MEMBERS=... once a leader and a
#                                    synchronous standby run
#   hack/patroni.sh kill-primary DIR kill -9 of the leader's Patroni and PostgreSQL; prints its name
#   hack/patroni.sh stop DIR         stops everything started in DIR
#
# Needs ETCD (hack/build-kube.sh), PG_BIN (default /usr/lib/postgresql/15/bin) and patroni
# (MCP_ACCESS_PATRONI_BIN, or hack/ensure-patroni.sh). As root, PostgreSQL runs as the postgres
# system user. Ports: a random free range, tried again elsewhere if a member cannot bind.
set -euo pipefail

cmd=${1:?usage: hack/patroni.sh start|kill-primary|stop DIR}
dir=${2:?usage: hack/patroni.sh start|kill-primary|stop DIR}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
members=(pg0 pg1 pg2)

log() { printf 'patroni.sh: %s\n' "$*" >&2; }

# The Python process of member M's Patroni (not runuser, its parent when root).
patroni_pid() { # M
  pgrep -f "^[^ ]*python[^ ]* [^ ]*patroni $dir/$1.yml\$" || true
}

postmaster_pid() { # M
  [ -f "$dir/data-$1/postmaster.pid" ] && head -1 "$dir/data-$1/postmaster.pid" || true
}

rest_port() { # M
  sed -n 's/^  connect_address: 127.0.0.1:\([0-9]*\)$/\1/p' "$dir/$1.yml" | head -1
}

member_is() { # M ROLE (primary, sync, replica)
  local port
  port=$(rest_port "$1")
  [ -n "$port" ] && curl -fs -o /dev/null --max-time 1 "http://127.0.0.1:$port/$2"
}

stop_all() {
  local m pid
  for m in "${members[@]}"; do
    pid=$(patroni_pid "$m")
    [ -n "$pid" ] && kill -9 $pid 2>/dev/null || true
    pid=$(postmaster_pid "$m")
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  done
  if [ -f "$dir/etcd.pid" ]; then
    kill -9 "$(cat "$dir/etcd.pid")" 2>/dev/null || true
    rm -f "$dir/etcd.pid"
  fi
  # What PostgreSQL leaves: backends die with their postmaster, shared memory with the last.
  sleep 0.2
}

port_free() { # PORT
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

start_once() {
  local base p i m ok
  base=$((20000 + RANDOM % 30000))
  for ((p = base; p < base + 8; p++)); do
    port_free "$p" || return 1
  done
  local etcd_client=$base etcd_peer=$((base + 1))
  mkdir -p "$dir"
  rm -rf "$dir"/etcd "$dir"/data-* "$dir"/*.yml
  "${ETCD:?ETCD is not set: run hack/build-kube.sh}" --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_client" \
    --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "default=http://127.0.0.1:$etcd_peer" >"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/etcd.pid"
  for ((i = 0; i < 50; i++)); do
    curl -fs -o /dev/null --max-time 1 "http://127.0.0.1:$etcd_client/health" && break
    sleep 0.1
  done
  i=0
  for m in "${members[@]}"; do
    cat >"$dir/$m.yml" <<YAML
scope: mcp-access-test
name: $m
log:
  level: WARNING
restapi:
  listen: 127.0.0.1:$((base + 5 + i))
  connect_address: 127.0.0.1:$((base + 5 + i))
etcd3:
  hosts: 127.0.0.1:$etcd_client
bootstrap:
  dcs:
    ttl: 10
    loop_wait: 1
    retry_timeout: 4
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: false
      parameters:
        synchronous_commit: "on"
        max_connections: 100
  initdb:
  - encoding: UTF8
  - auth-local: trust
  - auth-host: trust
  pg_hba:
  - host all all 127.0.0.1/32 trust
  - host replication replicator 127.0.0.1/32 trust
postgresql:
  listen: 127.0.0.1:$((base + 2 + i))
  connect_address: 127.0.0.1:$((base + 2 + i))
  data_dir: $dir/data-$m
  bin_dir: $PG_BIN
  pgpass: $dir/pgpass-$m
  authentication:
    superuser: {username: postgres, password: unused}
    replication: {username: replicator, password: unused}
  parameters:
    unix_socket_directories: $dir
YAML
    i=$((i + 1))
  done
  local patroni=${MCP_ACCESS_PATRONI_BIN:-$(command -v patroni)}
  local as=()
  if [ "$(id -u)" = 0 ]; then
    chown -R postgres "$dir"
    as=(runuser -u postgres --)
  fi
  chmod 755 "$dir"
  for m in "${members[@]}"; do
    "${as[@]}" "$patroni" "$dir/$m.yml" >"$dir/$m.log" 2>&1 &
  done
  # A leader, a synchronous standby and a replica.
  for ((i = 0; i < 900; i++)); do
    ok=0
    for m in "${members[@]}"; do
      member_is "$m" primary && ok=$((ok + 1))
      member_is "$m" sync && ok=$((ok + 10))
    done
    [ "$ok" = 11 ] && break
    sleep 0.1
  done
  [ "$ok" = 11 ] || return 1
  local hosts ports
  hosts=127.0.0.1,127.0.0.1,127.0.0.1
  ports=$((base + 2)),$((base + 3)),$((base + 4))
  echo "PATRONI_DSN='host=$hosts port=$ports user=postgres dbname=postgres target_session_attrs=read-write connect_timeout=2'"
  echo "PATRONI_MEMBERS='${members[*]}'"
}

case $cmd in
  start)
    for attempt in 1 2 3; do
      if start_once; then
        log "cluster up in $dir (attempt $attempt)"
        exit 0
      fi
      log "attempt $attempt failed (a port in use, or no leader within 90 s); last lines:"
      tail -n 5 "$dir"/*.log >&2 2>/dev/null || true
      stop_all
    done
    exit 1
    ;;
  kill-primary)
    for m in "${members[@]}"; do
      if member_is "$m" primary; then
        pids="$(patroni_pid "$m") $(postmaster_pid "$m")"
        # shellcheck disable=SC2086 # two pids
        kill -9 $pids
        echo "$m"
        exit 0
      fi
    done
    log "no member is the leader"
    exit 1
    ;;
  stop)
    stop_all
    ;;
  *)
    log "unknown command $cmd"
    exit 2
    ;;
esac
