#!/usr/bin/env bash
# A private PostgreSQL server for the tests that stop, restart or reconfigure their server
# (postgres_server_test.cpp), so the shared server other tests use in parallel is never
# touched. Built the way scripts/servers.sh builds the shared one; must run as root.
#
#   private_server.sh start DIR    initdb into DIR, start, print the port; database
#                                  idem_test; the socket in DIR trusts everyone, TCP on
#                                  127.0.0.1 asks for a password (scram-sha-256); the
#                                  postgres user's password is in DIR/password
#   private_server.sh stop DIR     pg_ctl stop -m immediate (a crash, as far as WAL goes)
#   private_server.sh resume DIR   start again on the same port
#   private_server.sh standby DIR  stop cleanly and start again as a hot standby (in
#                                  recovery, read-only, with no primary to follow)
#   private_server.sh destroy DIR  stop if running, then remove DIR
set -euo pipefail
source "$(dirname "$0")/../../../scripts/servers.sh"
trap - EXIT  # the server outlives this script; `destroy` ends it

cmd=$1 dir=$2
pg_ctl() { runuser -u postgres -- "$IDEM_PG_BIN/pg_ctl" -D "$dir/data" "$@"; }
# autovacuum off: nothing but the test writes WAL or takes transaction ids.
options=(-c max_connections=100 -c autovacuum=off)

case "$cmd" in
  start)
    idem_postgres_init "$dir" --auth-local=trust --auth-host=scram-sha-256
    port=$(idem_free_port)
    echo "$port" >"$dir/port"
    idem_postgres_run "$dir" "$port" "${options[@]}"
    password="pw-$RANDOM-$RANDOM"
    runuser -u postgres -- psql -h "$dir" -p "$port" -U postgres -qAt \
      -c "CREATE DATABASE idem_test" -c "ALTER ROLE postgres PASSWORD '$password'" >/dev/null
    echo "$password" >"$dir/password"
    echo "$port"
    ;;
  stop)
    pg_ctl -m immediate -w stop >/dev/null
    ;;
  resume)
    idem_postgres_run "$dir" "$(cat "$dir/port")" "${options[@]}"
    ;;
  standby)
    pg_ctl -m fast -w stop >/dev/null
    runuser -u postgres -- touch "$dir/data/standby.signal"
    idem_postgres_run "$dir" "$(cat "$dir/port")" "${options[@]}"
    ;;
  destroy)
    pg_ctl -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
    ;;
  *)
    echo "usage: $0 start|stop|resume|standby|destroy DIR" >&2
    exit 2
    ;;
esac
