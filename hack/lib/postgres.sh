# Starts and stops a throwaway PostgreSQL from the installed server binaries.
# Source this file; it defines postgres_start DIR and postgres_stop DIR.
# After postgres_start, PGPORT_STARTED holds the port and PG_DSN a libpq-style DSN.
# PG_EXTRA_OPTS adds server options, e.g. for profiling a benchmark:
#   PG_EXTRA_OPTS="-c shared_preload_libraries=pg_stat_statements" hack/bench-vs-crd.sh

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Runs a command as the postgres user when we are root (initdb and postgres refuse root).
as_pg() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

postgres_start() {
  local dir=$1
  local port=${2:-$(free_port)}
  if [ ! -x "$PG_BIN/initdb" ]; then
    echo "PostgreSQL server binaries not found in $PG_BIN (set PG_BIN, or run hack/lib/prereqs.sh: as root it installs postgresql-15)" >&2
    return 1
  fi
  mkdir -p "$dir"
  if [ "$(id -u)" = 0 ]; then
    chown -R postgres: "$dir"
    # postgres must be able to reach the directory.
    local d=$dir
    while [ "$d" != / ]; do d=$(dirname "$d"); chmod o+x "$d" 2>/dev/null || true; done
  fi
  if [ ! -f "$dir/data/PG_VERSION" ]; then
    as_pg "$PG_BIN/initdb" -D "$dir/data" -A trust -U postgres --no-sync >"$dir/initdb.log" 2>&1 || {
      cat "$dir/initdb.log" >&2; return 1; }
  fi
  # postgres cannot report a port-0 bind: on a port of our choosing (none given), one that
  # another process took first ("Address already in use") is replaced by a fresh candidate.
  local attempt seen
  for attempt in 1 2 3 4 5; do
    seen=0
    if [ -f "$dir/postgres.log" ]; then seen=$(wc -l <"$dir/postgres.log"); fi
    as_pg "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
      -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=400 -c shared_buffers=256MB ${PG_EXTRA_OPTS:-}" \
      start >/dev/null && break
    if [ -z "${2:-}" ] && [ "$attempt" -lt 5 ] &&
      tail -n "+$((seen + 1))" "$dir/postgres.log" | grep -qi 'already in use'; then
      port=$(free_port)
      continue
    fi
    cat "$dir/postgres.log" >&2
    return 1
  done
  PGPORT_STARTED=$port
  PG_DSN="host=127.0.0.1 port=$port user=postgres dbname=postgres"
  export PGPORT_STARTED PG_DSN
}

postgres_stop() {
  local dir=$1
  if [ -f "$dir/data/postmaster.pid" ]; then
    as_pg "$PG_BIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
  fi
}
