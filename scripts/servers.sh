#!/usr/bin/env bash
# Starts the servers the tests need, on loopback, each from a fresh temporary directory, and
# stops them when the calling script exits (whatever the outcome). Sourced by
# scripts/test.sh; also usable by hand:
#
#   source scripts/servers.sh; idem_start_postgres; idem_start_redis
#   ... IDEM_TEST_POSTGRES_URL and IDEM_TEST_REDIS_URL are set ...
#
# Nothing here listens beyond 127.0.0.1 and the temporary unix sockets.

IDEM_PG_BIN=${IDEM_PG_BIN:-/usr/lib/postgresql/15/bin}
_idem_server_dirs=()
_idem_server_stops=()

# A TCP port on 127.0.0.1 that nothing answers on.
idem_free_port() {
  local port
  for _ in $(seq 1 200); do
    port=$((20000 + RANDOM % 30000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return 0
    fi
  done
  echo "idem_free_port: no free port found" >&2
  return 1
}

idem_stop_servers() {
  local i
  for ((i = ${#_idem_server_stops[@]} - 1; i >= 0; i--)); do
    eval "${_idem_server_stops[$i]}" >/dev/null 2>&1 || true
  done
  for d in "${_idem_server_dirs[@]}"; do rm -rf "$d"; done
  _idem_server_stops=()
  _idem_server_dirs=()
}
trap idem_stop_servers EXIT

# initdb as the unprivileged `postgres` user (the server refuses root) into DIR/data; extra
# arguments go to initdb. DIR is made the postgres user's.
idem_postgres_init() {
  local dir=$1; shift
  chown postgres:postgres "$dir"
  chmod 700 "$dir"
  runuser -u postgres -- "$IDEM_PG_BIN/initdb" -D "$dir/data" -U postgres -A trust \
    --no-sync -E UTF8 "$@" >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; return 1; }
}

# Starts the server of DIR/data on 127.0.0.1:PORT and a unix socket in DIR; extra arguments
# are server options ("-c name=value").
idem_postgres_run() {
  local dir=$1 port=$2; shift 2
  runuser -u postgres -- "$IDEM_PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
    -o "-p $port -k $dir -c listen_addresses=127.0.0.1 $*" start \
    >/dev/null || { cat "$dir/server.log" >&2; return 1; }
}

# PostgreSQL 15: TCP on 127.0.0.1 and a unix socket in the temporary directory. Exports
# IDEM_TEST_POSTGRES_URL (database idem_test, user postgres, trust authentication on
# loopback only), IDEM_TEST_POSTGRES_SOCKET_DIR, IDEM_TEST_POSTGRES_PORT and
# IDEM_TEST_POSTGRES_DATA.
idem_start_postgres() {
  local dir port
  dir=$(mktemp -d /tmp/idem-pg.XXXXXX)
  port=$(idem_free_port)
  _idem_server_dirs+=("$dir")
  idem_postgres_init "$dir" || return 1
  idem_postgres_run "$dir" "$port" -c max_connections=300 || return 1
  _idem_server_stops+=("runuser -u postgres -- '$IDEM_PG_BIN/pg_ctl' -D '$dir/data' -m immediate -w stop")
  runuser -u postgres -- psql -h 127.0.0.1 -p "$port" -U postgres -qAt \
    -c "CREATE DATABASE idem_test" >/dev/null
  export IDEM_TEST_POSTGRES_URL="postgresql://postgres@127.0.0.1:$port/idem_test"
  export IDEM_TEST_POSTGRES_SOCKET_DIR=$dir
  export IDEM_TEST_POSTGRES_PORT=$port
  export IDEM_TEST_POSTGRES_DATA=$dir/data
  echo "== PostgreSQL on 127.0.0.1:$port (data in $dir)"
}

# Redis: no persistence, TCP on 127.0.0.1 and a unix socket in the temporary directory.
# Exports IDEM_TEST_REDIS_URL, IDEM_TEST_REDIS_SOCKET and IDEM_TEST_REDIS_PORT.
idem_start_redis() {
  local dir port
  dir=$(mktemp -d /tmp/idem-redis.XXXXXX)
  port=$(idem_free_port)
  _idem_server_dirs+=("$dir")
  redis-server --bind 127.0.0.1 --port "$port" --unixsocket "$dir/redis.sock" \
    --unixsocketperm 700 --save "" --appendonly no --dir "$dir" --daemonize yes \
    --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >/dev/null
  _idem_server_stops+=("kill \$(cat '$dir/redis.pid')")
  local i
  for i in $(seq 1 100); do
    redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && break
    sleep 0.1
  done
  redis-cli -p "$port" ping | grep -q PONG || { cat "$dir/redis.log" >&2; return 1; }
  export IDEM_TEST_REDIS_URL="redis://127.0.0.1:$port/0"
  export IDEM_TEST_REDIS_SOCKET=$dir/redis.sock
  export IDEM_TEST_REDIS_PORT=$port
  echo "== Redis on 127.0.0.1:$port (socket $dir/redis.sock)"
}
