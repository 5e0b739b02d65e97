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

# A free port whose cluster bus port (port + 10000) is free and valid too.
cluster_port() {
  python3 -c '
import random, socket
for _ in range(200):
    p = random.randint(20000, 45000)
    try:
        a = socket.socket(); a.bind(("127.0.0.1", p))
        b = socket.socket(); b.bind(("127.0.0.1", p + 10000))
        a.close(); b.close(); print(p); break
    except OSError:
        continue
'
}

# A three-node Redis Cluster (no replicas) on loopback, for tests/it/redis_cluster.rs: the
# limits' scripts must work where keys live on different nodes.
cluster_up() {
  command -v redis-server >/dev/null || apt_install redis-server
  local cdir="$STATE/redis-cluster" ports=() p all_up=1
  mkdir -p "$cdir"
  for i in 1 2 3; do
    if ! pid_alive "$cdir/$i.pid"; then all_up=0; fi
  done
  if [ "$all_up" = 1 ] && [ -f "$cdir/ports" ]; then
    read -r -a ports < "$cdir/ports"
  else
    for i in 1 2 3; do
      pid_alive "$cdir/$i.pid" && kill "$(cat "$cdir/$i.pid")" 2>/dev/null || true
    done
    rm -rf "${cdir:?}"/*
    for i in 1 2 3; do
      p=$(cluster_port)
      ports+=("$p")
      mkdir -p "$cdir/$i"
      redis-server --bind 127.0.0.1 --port "$p" --cluster-enabled yes         --cluster-config-file "$cdir/$i/nodes.conf" --cluster-node-timeout 5000         --save '' --appendonly no --daemonize yes --pidfile "$cdir/$i.pid" --dir "$cdir/$i"         --logfile "$cdir/$i/redis.log"
    done
    echo "${ports[*]}" > "$cdir/ports"
    for p in "${ports[@]}"; do
      wait_for "Redis cluster node $p" 30 sh -c "redis-cli -h 127.0.0.1 -p $p ping | grep -q PONG"
    done
    log "creating a Redis Cluster on 127.0.0.1:${ports[*]}"
    redis-cli --cluster create "${ports[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >/dev/null
  fi
  wait_for "Redis cluster state ok" 60 sh -c "redis-cli -h 127.0.0.1 -p ${ports[0]} cluster info | grep -q 'cluster_state:ok'"
  set_env RAILHOOK_TEST_REDIS_CLUSTER_URL "redis://127.0.0.1:${ports[0]}"
  log "Redis Cluster ready: redis://127.0.0.1:${ports[0]} (3 nodes)"
}

cluster_down() {
  local cdir="$STATE/redis-cluster"
  for i in 1 2 3; do
    pid_alive "$cdir/$i.pid" && kill "$(cat "$cdir/$i.pid")" 2>/dev/null || true
  done
  unset_env RAILHOOK_TEST_REDIS_CLUSTER_URL
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  cluster) cluster_up ;;
  cluster-down) cluster_down ;;
  *) die "usage: $0 up|down|cluster|cluster-down" ;;
esac
