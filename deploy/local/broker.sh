#!/usr/bin/env bash
# broker.sh install|up|down|kill: the Kafka-protocol broker (tansu, sqlite storage so data
# and committed offsets survive a restart) on a free loopback port.
#
# `install` builds tansu from crates.io into $TANSU_ROOT (~25 CPU-minutes, the largest cost
# on a new machine) and is skipped when the pinned binary is already there.
# `down` uses SIGKILL on purpose: tansu 0.6.0 with sqlite answers errors while draining on
# SIGTERM under a live idempotent producer and can then fail on restart (SPEC broker notes).
source "$(dirname "$0")/lib.sh"

DIR="$STATE/broker"
PIDFILE="$DIR/broker.pid"

install() {
  if [ -x "$TANSU_BIN" ]; then
    return 0
  fi
  log "installing tansu $TANSU_VERSION into $TANSU_ROOT (takes ~25 CPU-minutes, once per machine)"
  cargo install --locked tansu --version "$TANSU_VERSION" --no-default-features \
    --features libsql --root "$TANSU_ROOT" >"$STATE/tansu-install.log" 2>&1 \
    || { tail -30 "$STATE/tansu-install.log" >&2; die "tansu install failed"; }
}

metadata_ok() {
  timeout 5 "$TANSU_BIN" topic list --broker "tcp://127.0.0.1:$1" >/dev/null 2>&1
}

up() {
  install
  mkdir -p "$DIR"
  local port
  if pid_alive "$PIDFILE"; then
    port=$(cat "$DIR/port")
  else
    # Keep the port across restarts so clients' bootstrap list stays valid.
    port=$(cat "$DIR/port" 2>/dev/null || free_port)
    echo "$port" > "$DIR/port"
    log "starting tansu on 127.0.0.1:$port"
    (cd "$DIR" && exec "$TANSU_BIN" broker \
        --listener-url "tcp://127.0.0.1:$port" \
        --advertised-listener-url "tcp://127.0.0.1:$port" \
        --storage-engine "sqlite://tansu.db" >>"$DIR/broker.log" 2>&1) &
    echo $! > "$PIDFILE"
  fi
  wait_for "broker metadata" 60 metadata_ok "$port"
  set_env KAFKA_BROKERS "127.0.0.1:$port"
  log "broker ready: 127.0.0.1:$port"
}

down() {
  if pid_alive "$PIDFILE"; then
    kill -9 "$(cat "$PIDFILE")" || true
  fi
  rm -f "$PIDFILE"
  log "broker stopped"
}

case "${1:-up}" in
  install) install ;;
  up) up ;;
  down|kill) down ;;
  *) die "usage: $0 install|up|down" ;;
esac
