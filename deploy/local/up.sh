#!/usr/bin/env bash
# up.sh: brings up Postgres (wal_level=logical), Redis and the Kafka-protocol broker on
# loopback, installing what is missing; writes their settings to .local/env.
#
# RAILHOOK_LOCAL_TLS=1 also starts the TLS-only servers (deploy/local/tls.sh: Postgres
# accepting only hostssl, Redis on a TLS port, the broker behind stunnel with client
# certificates) and points the settings at them, so `demo.sh` runs over TLS end to end.
source "$(dirname "$0")/lib.sh"
"$ROOT/deploy/local/postgres.sh" up
"$ROOT/deploy/local/redis.sh" up
"$ROOT/deploy/local/broker.sh" up
TLS_SETTINGS=(RAILHOOK_REDIS_CA_FILE RAILHOOK_REDIS_CLIENT_CERT_FILE RAILHOOK_REDIS_CLIENT_KEY_FILE
  KAFKA_SECURITY_PROTOCOL KAFKA_SSL_CA_LOCATION KAFKA_SSL_CERTIFICATE_LOCATION KAFKA_SSL_KEY_LOCATION)
if [ "${RAILHOOK_LOCAL_TLS:-0}" = 1 ]; then
  "$ROOT/deploy/local/tls.sh" up
  source "$ENV_FILE"
  d="$RAILHOOK_TLS_DIR"
  # verify-full against the host name in the certificate (localhost), with a client
  # certificate; the same URL works for psql.
  set_env DATABASE_URL "postgres://railhook:$RAILHOOK_TLS_PASSWORD@localhost:$RAILHOOK_TLS_PG_PORT/railhook?sslmode=verify-full&sslrootcert=$d/ca.pem&sslcert=$d/client.pem&sslkey=$d/client.key"
  set_env REDIS_URL "rediss://default:$RAILHOOK_TLS_PASSWORD@127.0.0.1:$RAILHOOK_TLS_REDIS_PORT/0"
  set_env RAILHOOK_REDIS_CA_FILE "$d/ca.pem"
  set_env RAILHOOK_REDIS_CLIENT_CERT_FILE "$d/client.pem"
  set_env RAILHOOK_REDIS_CLIENT_KEY_FILE "$d/client.key"
  set_env KAFKA_BROKERS "127.0.0.1:$RAILHOOK_TLS_KAFKA_PORT"
  set_env KAFKA_SECURITY_PROTOCOL SSL
  set_env KAFKA_SSL_CA_LOCATION "$d/ca.pem"
  set_env KAFKA_SSL_CERTIFICATE_LOCATION "$d/client.pem"
  set_env KAFKA_SSL_KEY_LOCATION "$d/client.key"
  log "settings point at the TLS-only servers"
else
  for v in "${TLS_SETTINGS[@]}"; do unset_env "$v"; done
fi
log "connection settings: $ENV_FILE"
