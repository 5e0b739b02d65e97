#!/usr/bin/env bash
# up.sh: brings up Postgres (wal_level=logical), Redis and the Kafka-protocol broker on
# loopback, installing what is missing; writes their settings to .local/env.
source "$(dirname "$0")/lib.sh"
"$ROOT/deploy/local/postgres.sh" up
"$ROOT/deploy/local/redis.sh" up
"$ROOT/deploy/local/broker.sh" up
log "connection settings: $ENV_FILE"
