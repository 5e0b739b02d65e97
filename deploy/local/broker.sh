#!/usr/bin/env bash
# broker.sh install|up|down|kill: the Kafka-protocol broker ($RAILHOOK_BROKER, tansu or
# nisshi, sqlite storage so data and committed offsets survive a restart) on a free loopback
# port.
#
# `install` builds the broker from crates.io into $BROKER_ROOT (~25 CPU-minutes, the largest
# cost on a new machine) and is skipped when the pinned binary is already there.
# `down` uses SIGKILL on purpose: tansu 0.6.0 with sqlite answers errors while draining on
# SIGTERM under a live idempotent producer and can then fail on restart (SPEC broker notes).
# `up` records the broker's binary as RAILHOOK_BROKER_BIN, for the tests that start brokers
# of their own (tests/it/support/relay.rs).
source "$(dirname "$0")/lib.sh"

DIR="$STATE/broker"
PIDFILE="$DIR/broker.pid"

install() {
  if [ -x "$BROKER_BIN" ]; then
    return 0
  fi
  log "installing $RAILHOOK_BROKER $BROKER_VERSION into $BROKER_ROOT (takes ~25 CPU-minutes, once per machine)"
  cargo install --locked "$RAILHOOK_BROKER" --version "$BROKER_VERSION" "${BROKER_FEATURES[@]}" \
    --root "$BROKER_ROOT" >"$STATE/$RAILHOOK_BROKER-install.log" 2>&1 \
    || { tail -30 "$STATE/$RAILHOOK_BROKER-install.log" >&2; die "$RAILHOOK_BROKER install failed"; }
}

metadata_ok() {
  timeout 5 "$BROKER_BIN" topic list --broker "tcp://127.0.0.1:$1" >/dev/null 2>&1
}

up() {
  install
  mkdir -p "$DIR"
  local port
  if pid_alive "$PIDFILE"; then
    port=$(cat "$DIR/port")
    [ "$(cat "$DIR/kind" 2>/dev/null || echo tansu)" = "$RAILHOOK_BROKER" ] \
      || die "a $(cat "$DIR/kind" 2>/dev/null || echo tansu) broker is running; broker.sh down first"
  else
    # Keep the port across restarts so clients' bootstrap list stays valid.
    port=$(cat "$DIR/port" 2>/dev/null || free_port)
    echo "$port" > "$DIR/port"
    # Each broker keeps its own data file: the two do not share a storage format.
    log "starting $RAILHOOK_BROKER on 127.0.0.1:$port"
    # setsid: the broker outlives the shell (and process group) that started it, e.g. a
    # reader's terminal running demo.sh, or the docs samples' runner ending a page.
    (cd "$DIR" && exec setsid "$BROKER_BIN" broker \
        --listener-url "tcp://127.0.0.1:$port" \
        --advertised-listener-url "tcp://127.0.0.1:$port" \
        --storage-engine "sqlite://$RAILHOOK_BROKER.db" >>"$DIR/broker.log" 2>&1) &
    echo $! > "$PIDFILE"
    echo "$RAILHOOK_BROKER" > "$DIR/kind"
  fi
  wait_for "broker metadata" 60 metadata_ok "$port"
  set_env KAFKA_BROKERS "127.0.0.1:$port"
  set_env RAILHOOK_BROKER_BIN "$BROKER_BIN"
  log "$RAILHOOK_BROKER ready: 127.0.0.1:$port"
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
