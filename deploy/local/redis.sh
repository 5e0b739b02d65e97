#!/usr/bin/env bash
# redis.sh up|down: Redis on a free loopback port, without persistence (quota counters and
# limits are best-effort by design; see docs/ARCHITECTURE.md).
source "$(dirname "$0")/lib.sh"

DIR="$STATE/redis"
PIDFILE="$DIR/redis.pid"

up() {
  command -v redis-server >/dev/null || apt_install redis-server
  mkdir -p "$DIR"
  local port
  if pid_alive "$PIDFILE"; then
    port=$(cat "$DIR/port")
  else
    port=$(free_port)
    echo "$port" > "$DIR/port"
    log "starting Redis on 127.0.0.1:$port"
    redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
      --daemonize yes --pidfile "$PIDFILE" --dir "$DIR" --logfile "$DIR/redis.log"
  fi
  wait_for "Redis" 30 sh -c "redis-cli -h 127.0.0.1 -p $port ping | grep -q PONG"
  set_env REDIS_URL "redis://127.0.0.1:$port"
  log "Redis ready: redis://127.0.0.1:$port"
}

down() {
  if pid_alive "$PIDFILE"; then
    kill "$(cat "$PIDFILE")" || true
  fi
  unset_env REDIS_URL
  log "Redis stopped"
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  *) die "usage: $0 up|down" ;;
esac
