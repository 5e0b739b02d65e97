#!/usr/bin/env bash
# postgres.sh up|down: a private PostgreSQL cluster in $STATE/pg with wal_level=logical,
# listening on a free loopback port. Idempotent: `up` on a running cluster only re-checks it.
# RAILHOOK_PG_VERSION=18 runs PostgreSQL 18 instead (lib.sh); RAILHOOK_PG_ENV=PREFIX writes
# its settings as PREFIX_DATABASE_URL and PREFIX_DATA beside the default cluster's, so the
# two run side by side (test.sh runs part of the suite on the second).
source "$(dirname "$0")/lib.sh"

PG_USER=postgres   # the server refuses to run as root
if [ "$PG_VERSION" = 15 ]; then PGDIR="$STATE/pg"; else PGDIR="$STATE/pg$PG_VERSION"; fi
URL_VAR="${RAILHOOK_PG_ENV:+${RAILHOOK_PG_ENV}_}DATABASE_URL"
DATA_VAR="${RAILHOOK_PG_ENV:-RAILHOOK_PG}_DATA"

ensure_installed() {
  if [ "$PG_VERSION" = 18 ]; then ensure_pg18; fi
  [ -x "$PG_BIN/initdb" ] || apt_install postgresql
  [ -x "$PG_BIN/initdb" ] || die "PostgreSQL server binaries not found in $PG_BIN"
  id "$PG_USER" >/dev/null 2>&1 || useradd --system --home-dir /nonexistent "$PG_USER"
}

as_pg() { runuser -u "$PG_USER" -- "$@"; }

# The cluster lives in $STATE/pg unless the server's user cannot reach that folder (a
# checkout under a private home, say); then in a folder of /var/tmp named after $STATE.
pick_dir() {
  mkdir -p "$PGDIR"
  chown "$PG_USER" "$PGDIR"
  if ! runuser -u "$PG_USER" -- test -w "$PGDIR" 2>/dev/null; then
    PGDIR="/var/tmp/railhook-pg-$(echo "$STATE" | sha1sum | cut -c1-12)"
    mkdir -p "$PGDIR" && chown "$PG_USER" "$PGDIR"
  fi
  PGDATA="$PGDIR/data"
}

up() {
  ensure_installed
  pick_dir
  if [ ! -f "$PGDATA/PG_VERSION" ]; then
    log "initdb $PGDATA"
    as_pg "$PG_BIN/initdb" -D "$PGDATA" -U railhook --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
  fi
  local port
  if as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then
    # ALTER SYSTEM rewrites postgresql.auto.conf (and may quote values): read either form.
    port=$(sed -n "s/^port = '\\{0,1\\}\\([0-9]*\\).*/\\1/p" "$PGDATA/postgresql.auto.conf" | tail -1)
  else
    port=$(free_port)
    # Replication settings the relay needs; max_slot_wal_keep_size bounds the WAL a stalled
    # slot may pin before Postgres invalidates it (docs/OPERATIONS.md).
    cat > "$PGDATA/postgresql.auto.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$PGDIR'
wal_level = logical
max_replication_slots = 64
max_wal_senders = 64
max_slot_wal_keep_size = '4GB'
wal_sender_timeout = '10s'
max_connections = 400
shared_buffers = '256MB'
fsync = on
logging_collector = off
CONF
    log "starting PostgreSQL on 127.0.0.1:$port"
    as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" -l "$PGDIR/server.log" -w -t 60 start >/dev/null
  fi
  local url="postgres://railhook@127.0.0.1:$port/railhook"
  wait_for "PostgreSQL" 60 psql "postgres://railhook@127.0.0.1:$port/postgres" -Atc 'select 1'
  psql "postgres://railhook@127.0.0.1:$port/postgres" -Atc "select 1 from pg_database where datname='railhook'" | grep -q 1 \
    || psql "postgres://railhook@127.0.0.1:$port/postgres" -qc 'create database railhook' >/dev/null
  [ "$(psql "$url" -Atc 'show wal_level')" = logical ] || die "wal_level is not logical"
  set_env "$URL_VAR" "$url"
  set_env "$DATA_VAR" "$PGDATA"
  log "PostgreSQL $(psql "$url" -Atc 'show server_version') ready: $url"
}

down() {
  pick_dir
  if [ -f "$PGDATA/PG_VERSION" ]; then
    as_pg "$PG_BIN/pg_ctl" -D "$PGDATA" -m fast -w stop >/dev/null 2>&1 || true
  fi
  unset_env "$URL_VAR"
  log "PostgreSQL stopped"
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  *) die "usage: $0 up|down" ;;
esac
