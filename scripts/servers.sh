#!/usr/bin/env bash
# Starts the servers the tests need, on loopback, each from a fresh temporary directory, and
# stops them when the calling script exits (whatever the outcome). Sourced by
# scripts/test.sh; also usable by hand:
#
#   source scripts/servers.sh; idem_start_postgres; idem_start_redis
#   ... IDEM_TEST_POSTGRES_URL and IDEM_TEST_REDIS_URL are set ...
#   idem_start_pgbouncer transaction; idem_start_pgbouncer session   (after PostgreSQL)
#   ... IDEM_TEST_PGBOUNCER_TX_URL and IDEM_TEST_PGBOUNCER_SESSION_URL are set ...
#   idem_start_redis_tls; idem_start_redis_sentinel; idem_start_redis_cluster
#   ... IDEM_TEST_REDIS_TLS_URL, IDEM_TEST_REDIS_SENTINEL_URL, IDEM_TEST_REDIS_CLUSTER_URL ...
#
# Nothing here listens beyond 127.0.0.1 and the temporary unix sockets.

IDEM_PG_BIN=${IDEM_PG_BIN:-/usr/lib/postgresql/15/bin}
_idem_server_dirs=()
_idem_server_stops=()

# A TCP port on 127.0.0.1 that nothing answers on. With --bus, port + 10000 is free too (a
# cluster node's bus). Ports named after the options are never chosen (ones handed out but
# not yet listening). Chosen below the kernel's ephemeral range, so that no connection's
# local port can hold it when the server binds (a connect test cannot see those).
idem_free_port() {
  local port bus=0 taken=" " top
  if [[ ${1:-} == --bus ]]; then
    bus=1
    shift
  fi
  taken+="$* "
  top=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  ((bus)) && top=$((top - 10000))
  for _ in $(seq 1 200); do
    port=$((10000 + RANDOM % (top - 10000)))
    [[ $taken == *" $port "* || $taken == *" $((port + 10000)) "* ]] && continue
    ((bus)) && [[ $taken == *" $((port - 10000)) "* ]] && continue
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue
    ((bus)) && (exec 3<>"/dev/tcp/127.0.0.1/$((port + 10000))") 2>/dev/null && continue
    echo "$port"
    return 0
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

# Debian's PgBouncer (1.18) from DIR, in front of the PostgreSQL server at SERVER_HOST (a
# socket directory or an address) and SERVER_PORT: listens on 127.0.0.1:PORT and a unix
# socket in DIR, with pool_mode MODE (session or transaction), and sends every database
# name on to the server (a `*` entry). Every other setting is PgBouncer's default but what
# it takes to reach the server: trust authentication for the postgres user (listed in
# DIR/userlist.txt), who may also use its console (database pgbouncer, for SHOW POOLS).
# Extra arguments are added to the database entry (e.g. pool_size=1).
# PgBouncer refuses to run as root, so it runs as the `postgres` user; DIR becomes that
# user's. Its pid is in DIR/pgbouncer.pid, its log in DIR/pgbouncer.log.
idem_pgbouncer_run() {
  local dir=$1 port=$2 mode=$3 server_host=$4 server_port=$5; shift 5
  cat >"$dir/pgbouncer.ini" <<EOF
[databases]
* = host=$server_host port=$server_port $*
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $port
unix_socket_dir = $dir
auth_type = trust
admin_users = postgres
auth_file = $dir/userlist.txt
pool_mode = $mode
logfile = $dir/pgbouncer.log
pidfile = $dir/pgbouncer.pid
EOF
  echo '"postgres" ""' >"$dir/userlist.txt"
  chown -R postgres:postgres "$dir"
  chmod 700 "$dir"
  runuser -u postgres -- pgbouncer -d -q "$dir/pgbouncer.ini" || { cat "$dir/pgbouncer.log" >&2; return 1; }
  local i
  for i in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    sleep 0.1
  done
  cat "$dir/pgbouncer.log" >&2
  return 1
}

# PgBouncer in MODE (transaction or session) in front of the server idem_start_postgres
# started, reaching it through its unix socket. Exports IDEM_TEST_PGBOUNCER_TX_URL or
# IDEM_TEST_PGBOUNCER_SESSION_URL (database idem_test, user postgres).
idem_start_pgbouncer() {
  local mode=$1 dir port url
  dir=$(mktemp -d /tmp/idem-pgbouncer.XXXXXX)
  port=$(idem_free_port)
  _idem_server_dirs+=("$dir")
  idem_pgbouncer_run "$dir" "$port" "$mode" "$IDEM_TEST_POSTGRES_SOCKET_DIR" \
    "$IDEM_TEST_POSTGRES_PORT" || return 1
  _idem_server_stops+=("kill \$(cat '$dir/pgbouncer.pid')")
  url="postgresql://postgres@127.0.0.1:$port/idem_test"
  case $mode in
    transaction) export IDEM_TEST_PGBOUNCER_TX_URL=$url ;;
    session) export IDEM_TEST_PGBOUNCER_SESSION_URL=$url ;;
    *) echo "idem_start_pgbouncer: MODE must be transaction or session" >&2; return 1 ;;
  esac
  echo "== PgBouncer ($mode pooling) on 127.0.0.1:$port in front of PostgreSQL"
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

# Waits until redis-cli -p PORT (extra arguments: TLS options) answers PING; prints LOG and
# fails when it does not within 10 s.
idem_wait_redis() {
  local port=$1 log=$2; shift 2
  local i
  for i in $(seq 1 100); do
    redis-cli -p "$port" "$@" ping 2>/dev/null | grep -q PONG && return 0
    sleep 0.1
  done
  cat "$log" >&2
  return 1
}

# Certificates for the TLS tests, made with openssl into DIR: a CA (ca.crt), a server
# certificate for 127.0.0.1 and localhost signed by it (server.crt, server.key), a client
# certificate signed by it (client.crt, client.key), a server certificate that expired in
# 2020 (expired.crt, expired.key; made under faketime), and a second CA that signed nothing
# (wrong-ca.crt). One-day certificates, 2048-bit RSA.
idem_make_tls_certs() {
  local dir=$1
  (
    set -e
    cd "$dir"
    openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=idem test CA" \
      -keyout ca.key -out ca.crt 2>/dev/null
    openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=idem wrong CA" \
      -keyout wrong-ca.key -out wrong-ca.crt 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >server.ext
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key \
      -out server.csr 2>/dev/null
    openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
      -extfile server.ext -out server.crt 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=idem client" -keyout client.key \
      -out client.csr 2>/dev/null
    openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 \
      -out client.crt 2>/dev/null
    # A server certificate that expired: signed while faketime says it is 2020.
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout expired.key \
      -out expired.csr 2>/dev/null
    faketime '2020-01-01 00:00:00' openssl x509 -req -in expired.csr -CA ca.crt -CAkey ca.key \
      -CAcreateserial -days 1 -extfile server.ext -out expired.crt 2>/dev/null
    chmod 644 ./*.key
  )
}

# Redis over TLS: a second server listening with TLS on 127.0.0.1 (client certificates
# optional) and in plain TCP on another port (the TLS-versus-plain figures), with the
# certificates of idem_make_tls_certs. Exports IDEM_TEST_REDIS_TLS_URL (rediss://, with
# tls_ca=), IDEM_TEST_REDIS_TLS_DIR (the certificates), IDEM_TEST_REDIS_TLS_PORT and
# IDEM_TEST_REDIS_TLS_PLAIN_PORT.
idem_start_redis_tls() {
  local dir port plain
  dir=$(mktemp -d /tmp/idem-redis-tls.XXXXXX)
  _idem_server_dirs+=("$dir")
  idem_make_tls_certs "$dir" || return 1
  port=$(idem_free_port)
  plain=$(idem_free_port "$port")
  redis-server --bind 127.0.0.1 --port "$plain" --tls-port "$port" \
    --tls-cert-file "$dir/server.crt" --tls-key-file "$dir/server.key" \
    --tls-ca-cert-file "$dir/ca.crt" --tls-auth-clients optional \
    --save "" --appendonly no --dir "$dir" --daemonize yes \
    --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >/dev/null
  _idem_server_stops+=("kill \$(cat '$dir/redis.pid')")
  idem_wait_redis "$port" "$dir/redis.log" --tls --cacert "$dir/ca.crt" || return 1
  export IDEM_TEST_REDIS_TLS_URL="rediss://127.0.0.1:$port/0?tls_ca=$dir/ca.crt"
  export IDEM_TEST_REDIS_TLS_DIR=$dir
  export IDEM_TEST_REDIS_TLS_PORT=$port
  export IDEM_TEST_REDIS_TLS_PLAIN_PORT=$plain
  echo "== Redis over TLS on 127.0.0.1:$port (plain TCP on $plain, certificates in $dir)"
}

# Redis Sentinel: a primary, one replica and three sentinels (quorum 2, a primary is down
# after 1 s) watching it as service "idemtest". Exports IDEM_TEST_REDIS_SENTINEL_URL
# (redis+sentinel://the three sentinels/idemtest) and IDEM_TEST_REDIS_SENTINEL_PORTS.
idem_start_redis_sentinel() {
  local dir primary replica ports=() i s
  dir=$(mktemp -d /tmp/idem-redis-sentinel.XXXXXX)
  _idem_server_dirs+=("$dir")
  primary=$(idem_free_port)
  replica=$(idem_free_port "$primary")
  for name in primary replica; do
    local p=${!name}
    mkdir -p "$dir/$name"
    local extra=()
    [[ $name == replica ]] && extra=(--replicaof 127.0.0.1 "$primary")
    redis-server --bind 127.0.0.1 --port "$p" --save "" --appendonly no --dir "$dir/$name" \
      --daemonize yes --pidfile "$dir/$name/redis.pid" --logfile "$dir/$name/redis.log" \
      "${extra[@]}" >/dev/null
    _idem_server_stops+=("kill \$(cat '$dir/$name/redis.pid')")
    idem_wait_redis "$p" "$dir/$name/redis.log" || return 1
  done
  for i in 1 2 3; do
    s=$(idem_free_port)
    mkdir -p "$dir/s$i"
    cat >"$dir/s$i/sentinel.conf" <<CONF
bind 127.0.0.1
port $s
daemonize yes
pidfile $dir/s$i/sentinel.pid
logfile $dir/s$i/sentinel.log
dir $dir/s$i
sentinel monitor idemtest 127.0.0.1 $primary 2
sentinel down-after-milliseconds idemtest 10000
sentinel failover-timeout idemtest 6000
sentinel parallel-syncs idemtest 1
CONF
    redis-server "$dir/s$i/sentinel.conf" --sentinel >/dev/null
    _idem_server_stops+=("kill \$(cat '$dir/s$i/sentinel.pid')")
    idem_wait_redis "$s" "$dir/s$i/sentinel.log" || return 1
    ports+=("$s")
  done
  # Until every sentinel knows the replica (a forced failover needs one).
  for s in "${ports[@]}"; do
    for i in $(seq 1 100); do
      redis-cli -p "$s" sentinel replicas idemtest 2>/dev/null | grep -q "$replica" && break
      sleep 0.1
    done
  done
  export IDEM_TEST_REDIS_SENTINEL_URL="redis+sentinel://127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}/idemtest"
  export IDEM_TEST_REDIS_SENTINEL_PORTS="${ports[*]}"
  echo "== Redis Sentinel: primary 127.0.0.1:$primary, replica $replica, sentinels ${ports[*]}"
}

# Redis Cluster: three primaries with one replica each on loopback, made with
# redis-cli --cluster create. Exports IDEM_TEST_REDIS_CLUSTER_URL (redis+cluster:// with
# every primary as a seed) and IDEM_TEST_REDIS_CLUSTER_PORTS (the six ports).
idem_start_redis_cluster() {
  local dir ports=() p i
  dir=$(mktemp -d /tmp/idem-redis-cluster.XXXXXX)
  _idem_server_dirs+=("$dir")
  for i in 1 2 3 4 5 6; do
    p=$(idem_free_port --bus "${ports[@]}") || return 1
    mkdir -p "$dir/n$i"
    redis-server --bind 127.0.0.1 --port "$p" --cluster-enabled yes \
      --cluster-config-file "$dir/n$i/nodes.conf" --cluster-node-timeout 2000 \
      --save "" --appendonly no --dir "$dir/n$i" --daemonize yes \
      --pidfile "$dir/n$i/redis.pid" --logfile "$dir/n$i/redis.log" >/dev/null
    _idem_server_stops+=("kill \$(cat '$dir/n$i/redis.pid')")
    ports+=("$p")
  done
  for i in 1 2 3 4 5 6; do
    idem_wait_redis "${ports[i - 1]}" "$dir/n$i/redis.log" || return 1
  done
  local addrs=()
  for p in "${ports[@]}"; do addrs+=("127.0.0.1:$p"); done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
    >"$dir/create.log" 2>&1 || { cat "$dir/create.log" >&2; return 1; }
  for i in $(seq 1 100); do
    local ok=1
    for p in "${ports[@]}"; do
      redis-cli -p "$p" cluster info 2>/dev/null | grep -q "cluster_state:ok" || ok=0
    done
    ((ok)) && break
    sleep 0.1
  done
  export IDEM_TEST_REDIS_CLUSTER_URL="redis+cluster://127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}"
  export IDEM_TEST_REDIS_CLUSTER_PORTS="${ports[*]}"
  echo "== Redis Cluster: 3 primaries and 3 replicas on 127.0.0.1 ports ${ports[*]}"
}
