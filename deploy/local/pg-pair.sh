#!/usr/bin/env bash
# pg-pair.sh up|kill-primary|promote|stop-standby|start-standby|down DIR [failover]: a PostgreSQL primary and a
# physical standby in DIR, for the failover tests (tests/it/failover.rs; docs/OPERATIONS.md,
# "Failover"). PostgreSQL 18 unless RAILHOOK_PG_VERSION says 15.
#
# - Synchronous replication (synchronous_commit = on, the standby named in
#   synchronous_standby_names): a commit, hence a 201, is on the standby too.
# - The standby streams through a physical slot (railhook_standby) with hot_standby_feedback.
# - With `failover` (PostgreSQL 17+): the standby runs sync_replication_slots, so failover
#   logical Slots are copied to it, and the primary lists its physical slot in
#   synchronized_standby_slots, so no logical decoding gets ahead of what the standby has.
#
# `up` prints PRIMARY_PORT=… and STANDBY_PORT=… lines. `kill-primary` is kill -9 of the
# primary's postmaster; `promote` promotes the standby.
source "$(dirname "$0")/lib.sh"

PG_USER=postgres
cmd="${1:?usage: $0 up|kill-primary|promote|down DIR [failover]}"
DIR="${2:?a directory}"
MODE="${3:-}"

as_pg() { runuser -u "$PG_USER" -- "$@"; }

conf_common() {
  cat <<CONF
listen_addresses = '127.0.0.1'
port = $1
unix_socket_directories = '$2'
wal_level = logical
max_replication_slots = 32
max_wal_senders = 16
wal_sender_timeout = '10s'
max_connections = 200
shared_buffers = '128MB'
logging_collector = off
hot_standby = on
hot_standby_feedback = on
CONF
}

up() {
  if [ "$PG_VERSION" = 18 ]; then ensure_pg18; fi
  id "$PG_USER" >/dev/null 2>&1 || useradd --system --home-dir /nonexistent "$PG_USER"
  mkdir -p "$DIR"
  chmod o+x "$DIR" "$(dirname "$DIR")" 2>/dev/null || true
  chown "$PG_USER" "$DIR"
  local p s
  p=$(free_port); s=$(free_port)
  while [ "$s" = "$p" ]; do s=$(free_port); done
  as_pg "$PG_BIN/initdb" -D "$DIR/primary" -U railhook --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
  {
    conf_common "$p" "$DIR"
    echo "synchronous_commit = on"
    if [ "$MODE" = failover ]; then echo "synchronized_standby_slots = 'railhook_standby'"; fi
  } > "$DIR/primary/postgresql.auto.conf"
  echo "host replication railhook 127.0.0.1/32 trust" >> "$DIR/primary/pg_hba.conf"
  as_pg "$PG_BIN/pg_ctl" -D "$DIR/primary" -l "$DIR/primary.log" -w -t 60 start >/dev/null
  psql "postgres://railhook@127.0.0.1:$p/postgres" -qc "create database railhook" >/dev/null
  psql "postgres://railhook@127.0.0.1:$p/postgres" -qAtc \
    "select pg_create_physical_replication_slot('railhook_standby')" >/dev/null
  as_pg "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$p" -U railhook -D "$DIR/standby" -X stream >/dev/null
  {
    conf_common "$s" "$DIR"
    echo "primary_conninfo = 'host=127.0.0.1 port=$p user=railhook dbname=railhook application_name=railhook_standby'"
    echo "primary_slot_name = 'railhook_standby'"
    if [ "$MODE" = failover ]; then echo "sync_replication_slots = on"; fi
  } > "$DIR/standby/postgresql.auto.conf"
  as_pg touch "$DIR/standby/standby.signal"
  as_pg "$PG_BIN/pg_ctl" -D "$DIR/standby" -l "$DIR/standby.log" -w -t 60 start >/dev/null
  # Synchronous from here on (named only now: with no standby, every commit would wait).
  wait_for "the standby streaming" 60 bash -c \
    "psql 'postgres://railhook@127.0.0.1:$p/postgres' -Atc \"select 1 from pg_stat_replication where application_name = 'railhook_standby'\" | grep -q 1"
  psql "postgres://railhook@127.0.0.1:$p/postgres" -qc \
    "alter system set synchronous_standby_names = 'railhook_standby'" -c "select pg_reload_conf()" >/dev/null
  wait_for "the standby streaming synchronously" 60 bash -c \
    "psql 'postgres://railhook@127.0.0.1:$p/postgres' -Atc \"select 1 from pg_stat_replication where application_name = 'railhook_standby' and sync_state = 'sync'\" | grep -q 1"
  echo "PRIMARY_PORT=$p"
  echo "STANDBY_PORT=$s"
}

kill_primary() {
  local pid
  pid=$(head -1 "$DIR/primary/postmaster.pid")
  kill -9 "$pid"
  # The postmaster's children go with it (they notice it died); wait for the port to close.
  wait_for "the primary's processes to exit" 30 bash -c "! kill -0 $pid 2>/dev/null"
}

promote() {
  as_pg "$PG_BIN/pg_ctl" -D "$DIR/standby" -w -t 60 promote >/dev/null
}

stop_standby() {
  as_pg "$PG_BIN/pg_ctl" -D "$DIR/standby" -m fast -w stop >/dev/null
}

start_standby() {
  as_pg "$PG_BIN/pg_ctl" -D "$DIR/standby" -l "$DIR/standby.log" -w -t 60 start >/dev/null
}

down() {
  for node in primary standby; do
    if [ -f "$DIR/$node/postmaster.pid" ]; then
      as_pg "$PG_BIN/pg_ctl" -D "$DIR/$node" -m immediate -w stop >/dev/null 2>&1 || true
    fi
  done
  rm -rf "$DIR"
}

case "$cmd" in
  up) up ;;
  kill-primary) kill_primary ;;
  promote) promote ;;
  stop-standby) stop_standby ;;
  start-standby) start_standby ;;
  down) down ;;
  *) die "usage: $0 up|kill-primary|promote|down DIR [failover]" ;;
esac
