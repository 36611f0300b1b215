#!/usr/bin/env bash
# A PgBouncer of a test's own (scripts/servers.sh, idem_pgbouncer_run), for tests that need
# settings of their own or a server that the test kills and restarts (the crash soak); must
# run as root.
#
#   pgbouncer.sh start DIR MODE SERVER_HOST SERVER_PORT [DB_OPTION...]
#                               start in front of the server at SERVER_HOST (a socket
#                               directory or an address) and SERVER_PORT, with pool_mode
#                               MODE; DB_OPTIONs (e.g. pool_size=1) go to the database
#                               entry; print the port
#   pgbouncer.sh destroy DIR    stop it, then remove DIR
set -euo pipefail
source "$(dirname "$0")/../../../scripts/servers.sh"
trap - EXIT  # PgBouncer outlives this script; `destroy` ends it

cmd=$1 dir=$2
case "$cmd" in
  start)
    mode=$3 server_host=$4 server_port=$5
    shift 5
    port=$(idem_free_port)
    idem_pgbouncer_run "$dir" "$port" "$mode" "$server_host" "$server_port" "$@"
    echo "$port"
    ;;
  destroy)
    if [[ -f "$dir/pgbouncer.pid" ]]; then kill "$(cat "$dir/pgbouncer.pid")" 2>/dev/null || true; fi
    rm -rf "$dir"
    ;;
  *)
    echo "usage: $0 start DIR MODE SERVER_HOST SERVER_PORT [DB_OPTION...] | destroy DIR" >&2
    exit 2
    ;;
esac
