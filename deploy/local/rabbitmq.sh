#!/usr/bin/env bash
# rabbitmq.sh up|down|stop-app|start-app: a RabbitMQ node (Debian's rabbitmq-server) on a
# free loopback port, for the RabbitMQ transport's tests (tests/it/transports.rs). Its own
# node name, data folder and Erlang cookie under .local/, so it never meets a system node.
# `stop-app`/`start-app` stop and start the broker inside the node (its listener closes, its
# durable queues stay): the tests' outage.
source "$(dirname "$0")/lib.sh"

# Debian's wrappers run the node and rabbitmqctl as the `rabbitmq` user (its home holds the
# Erlang cookie), so the node's folder is under that user's home.
DIR="/var/lib/rabbitmq/railhook"
NODE="railhook@localhost"

ctl() {
  RABBITMQ_NODENAME="$NODE" rabbitmqctl -n "$NODE" "$@"
}

up() {
  command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
  mkdir -p "$DIR/mnesia" "$DIR/log"
  if ! ctl status >/dev/null 2>&1; then
    local port
    port=$(free_port)
    echo "$port" > "$DIR/port"
    echo "[]." > "$DIR/enabled_plugins.erl"
    chown -R rabbitmq:rabbitmq "$DIR"
    log "starting RabbitMQ on 127.0.0.1:$port"
    RABBITMQ_NODENAME="$NODE" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
      RABBITMQ_NODE_PORT="$port" RABBITMQ_DIST_PORT="$(free_port)" \
      RABBITMQ_MNESIA_BASE="$DIR/mnesia" RABBITMQ_LOG_BASE="$DIR/log" \
      RABBITMQ_ENABLED_PLUGINS_FILE="$DIR/enabled_plugins.erl" \
      RABBITMQ_FEATURE_FLAGS_FILE="$DIR/mnesia/feature_flags" \
      RABBITMQ_CONFIG_FILE="$DIR/rabbitmq" \
      rabbitmq-server >"$DIR/start.log" 2>&1 &
  fi
  wait_for "RabbitMQ" 90 ctl await_startup
  local port
  port=$(cat "$DIR/port")
  set_env RABBITMQ_URL "amqp://guest:guest@127.0.0.1:$port/%2f"
  set_env RABBITMQ_CTL "$ROOT/deploy/local/rabbitmq.sh"
  log "RabbitMQ ready: amqp://127.0.0.1:$port"
}

down() {
  ctl stop >/dev/null 2>&1 || true
  unset_env RABBITMQ_URL
  log "RabbitMQ stopped"
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  stop-app) ctl stop_app >/dev/null ;;
  start-app) ctl start_app >/dev/null && ctl await_startup >/dev/null ;;
  *) die "usage: rabbitmq.sh up|down|stop-app|start-app" ;;
esac
