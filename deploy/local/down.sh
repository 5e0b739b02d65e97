#!/usr/bin/env bash
# down.sh: stops Railhook (if the demo started it) and the local infrastructure. Data stays
# in .local/ for the next `up`; delete that folder to start from nothing.
source "$(dirname "$0")/lib.sh"
if pid_alive "$STATE/railhook.pid"; then
  kill "$(cat "$STATE/railhook.pid")" || true
  log "railhook stopped"
fi
if pid_alive "$STATE/receiver.pid"; then kill "$(cat "$STATE/receiver.pid")" || true; fi
"$ROOT/deploy/local/tls.sh" down
"$ROOT/deploy/local/rabbitmq.sh" down
"$ROOT/deploy/local/broker.sh" down
"$ROOT/deploy/local/redis.sh" cluster-down
"$ROOT/deploy/local/redis.sh" down
"$ROOT/deploy/local/postgres.sh" down
# The second cluster test.sh starts (PostgreSQL 18), when it ran.
if [ -d "$STATE/pg18" ]; then
  RAILHOOK_PG_VERSION=18 RAILHOOK_PG_ENV=RAILHOOK_PG18 "$ROOT/deploy/local/postgres.sh" down
fi
