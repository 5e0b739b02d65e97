#!/usr/bin/env bash
# tls.sh up|down: the same three dependencies again, reachable only over TLS, on loopback:
#   - a private CA made with openssl (server certificate for localhost and 127.0.0.1, a
#     client certificate, and a second, unrelated CA for "wrong CA" checks);
#   - a PostgreSQL cluster with ssl = on whose pg_hba.conf accepts only hostssl lines
#     (password auth, replication included) and rejects every plaintext connection;
#   - Redis on a TLS-only port (--port 0) with a password;
#   - the broker behind stunnel: a second broker ($RAILHOOK_BROKER) whose advertised listener is stunnel's TLS
#     port, and stunnel requires a client certificate signed by the CA (mutual TLS).
# Settings go to .local/env as RAILHOOK_TLS_* (tests/it/connectivity.rs reads them). With
# RAILHOOK_LOCAL_TLS=1, up.sh runs this and points DATABASE_URL, REDIS_URL and the KAFKA_*
# settings at these servers, so the demo runs over TLS end to end.
source "$(dirname "$0")/lib.sh"

DIR="$STATE/tls"
PG_USER=postgres
PASSWORD_FILE="$DIR/password"

certs() {
  mkdir -p "$DIR"
  [ -f "$DIR/client.key" ] && [ -f "$DIR/wrong-ca.pem" ] && return 0
  log "making a private CA and certificates in $DIR"
  (
    cd "$DIR"
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=Railhook local CA" \
      -keyout ca.key -out ca.pem 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
      -keyout server.key -out server.csr 2>/dev/null
    printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
      -extfile server.ext -out server.pem 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=railhook" \
      -keyout client.key -out client.csr 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' > client.ext
    openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 825 \
      -extfile client.ext -out client.pem 2>/dev/null
    # A CA that signed nothing here: trusting it instead of ca.pem must fail every check.
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=Someone else's CA" \
      -keyout wrong-ca.key -out wrong-ca.pem 2>/dev/null
    python3 -c 'import secrets; print(secrets.token_hex(16))' > password
    rm -f ./*.csr ./*.ext
    chmod 600 ./*.key password
  )
}

postgres_up() {
  local pgdir="$DIR/pg" port
  id "$PG_USER" >/dev/null 2>&1 || useradd --system --home-dir /nonexistent "$PG_USER"
  mkdir -p "$pgdir"
  # The server's user must reach its folder (see postgres.sh for the same fallback).
  chmod o+x "$STATE" "$DIR" 2>/dev/null || true
  chown "$PG_USER" "$pgdir"
  if ! runuser -u "$PG_USER" -- test -w "$pgdir" 2>/dev/null; then
    pgdir="/var/tmp/railhook-pg-tls-$(echo "$STATE" | sha1sum | cut -c1-12)"
    mkdir -p "$pgdir" && chown "$PG_USER" "$pgdir"
  fi
  local data="$pgdir/data"
  if [ ! -f "$data/PG_VERSION" ]; then
    log "initdb $data (TLS only)"
    install -o "$PG_USER" -m 600 "$PASSWORD_FILE" "$pgdir/pwfile"
    runuser -u "$PG_USER" -- "$PG_BIN/initdb" -D "$data" -U railhook --pwfile="$pgdir/pwfile" \
      --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pgdir/pwfile"
    install -o "$PG_USER" -m 600 "$DIR/server.key" "$data/server.key"
    install -o "$PG_USER" -m 644 "$DIR/server.pem" "$data/server.crt"
    install -o "$PG_USER" -m 644 "$DIR/ca.pem" "$data/root.crt"
    # hostssl only: a client that does not speak TLS is refused before authentication.
    cat > "$data/pg_hba.conf" <<HBA
local   all          all                     trust
hostssl all          all          127.0.0.0/8  scram-sha-256
hostssl replication  all          127.0.0.0/8  scram-sha-256
hostnossl all        all          0.0.0.0/0    reject
hostnossl replication all         0.0.0.0/0    reject
HBA
    chown "$PG_USER" "$data/pg_hba.conf"
  fi
  if runuser -u "$PG_USER" -- "$PG_BIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    port=$(sed -n "s/^port = '\\{0,1\\}\\([0-9]*\\).*/\\1/p" "$data/postgresql.auto.conf" | tail -1)
  else
    port=$(free_port)
    cat > "$data/postgresql.auto.conf" <<CONF
# 127.0.0.2 is loopback too, but not in the certificate: connecting to it with
# verify-full must fail on the host name.
listen_addresses = '127.0.0.1,127.0.0.2'
port = $port
unix_socket_directories = '$pgdir'
wal_level = logical
max_replication_slots = 32
max_wal_senders = 32
wal_sender_timeout = '10s'
max_connections = 200
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
ssl_ca_file = 'root.crt'
logging_collector = off
CONF
    log "starting PostgreSQL (TLS only) on 127.0.0.1:$port"
    runuser -u "$PG_USER" -- "$PG_BIN/pg_ctl" -D "$data" -l "$pgdir/server.log" -w -t 60 start >/dev/null
  fi
  local admin="postgresql:///postgres?host=$pgdir&port=$port&user=railhook"
  wait_for "PostgreSQL (TLS)" 60 psql "$admin" -Atc 'select 1'
  psql "$admin" -Atc "select 1 from pg_database where datname='railhook'" | grep -q 1 \
    || psql "$admin" -qc 'create database railhook' >/dev/null
  set_env RAILHOOK_TLS_PG_PORT "$port"
  set_env RAILHOOK_TLS_PG_SOCKET "$pgdir"
  set_env RAILHOOK_TLS_PG_DATA "$data"
  log "PostgreSQL (TLS only) ready on 127.0.0.1:$port"
}

redis_up() {
  command -v redis-server >/dev/null || apt_install redis-server
  local rdir="$DIR/redis" port
  mkdir -p "$rdir"
  if pid_alive "$rdir/redis.pid"; then
    port=$(cat "$rdir/port")
  else
    port=$(free_port)
    echo "$port" > "$rdir/port"
    log "starting Redis (TLS only) on 127.0.0.1:$port"
    redis-server --bind 127.0.0.1 --port 0 --tls-port "$port" \
      --tls-cert-file "$DIR/server.pem" --tls-key-file "$DIR/server.key" \
      --tls-ca-cert-file "$DIR/ca.pem" --tls-auth-clients optional \
      --requirepass "$(cat "$PASSWORD_FILE")" \
      --save '' --appendonly no --daemonize yes --pidfile "$rdir/redis.pid" --dir "$rdir" \
      --logfile "$rdir/redis.log"
  fi
  wait_for "Redis (TLS)" 30 sh -c "REDISCLI_AUTH=$(cat "$PASSWORD_FILE") redis-cli --tls --cacert $DIR/ca.pem -h 127.0.0.1 -p $port ping | grep -q PONG"
  set_env RAILHOOK_TLS_REDIS_PORT "$port"
  log "Redis (TLS only) ready on 127.0.0.1:$port"
}

broker_up() {
  command -v stunnel4 >/dev/null || apt_install stunnel4
  "$ROOT/deploy/local/broker.sh" install
  local bdir="$DIR/broker" plain tls
  mkdir -p "$bdir"
  plain=$(cat "$bdir/plain-port" 2>/dev/null || free_port)
  tls=$(cat "$bdir/tls-port" 2>/dev/null || free_port)
  echo "$plain" > "$bdir/plain-port"
  echo "$tls" > "$bdir/tls-port"
  if ! pid_alive "$bdir/broker.pid"; then
    log "starting $RAILHOOK_BROKER on 127.0.0.1:$plain, advertising stunnel's TLS port $tls"
    (cd "$bdir" && exec "$BROKER_BIN" broker \
        --listener-url "tcp://127.0.0.1:$plain" \
        --advertised-listener-url "tcp://127.0.0.1:$tls" \
        --storage-engine "sqlite://$RAILHOOK_BROKER.db" >>"$bdir/broker.log" 2>&1) &
    echo $! > "$bdir/broker.pid"
  fi
  if ! pid_alive "$bdir/stunnel.pid"; then
    # Mutual TLS: stunnel accepts only clients whose certificate the CA signed.
    cat > "$bdir/stunnel.conf" <<CONF
foreground = yes
pid =
[kafka]
accept = 127.0.0.1:$tls
connect = 127.0.0.1:$plain
cert = $DIR/server.pem
key = $DIR/server.key
CAfile = $DIR/ca.pem
verifyChain = yes
requireCert = yes
CONF
    stunnel4 "$bdir/stunnel.conf" >>"$bdir/stunnel.log" 2>&1 &
    echo $! > "$bdir/stunnel.pid"
  fi
  wait_for "broker (TLS)" 60 timeout 5 "$BROKER_BIN" topic list --broker "tcp://127.0.0.1:$plain"
  wait_for "stunnel" 30 sh -c "echo | timeout 5 openssl s_client -connect 127.0.0.1:$tls -CAfile $DIR/ca.pem -cert $DIR/client.pem -key $DIR/client.key -verify_return_error >/dev/null 2>&1"
  set_env RAILHOOK_TLS_KAFKA_PORT "$tls"
  log "broker (TLS via stunnel) ready on 127.0.0.1:$tls"
}

up() {
  command -v openssl >/dev/null || apt_install openssl
  certs
  postgres_up
  redis_up
  broker_up
  set_env RAILHOOK_TLS_DIR "$DIR"
  set_env RAILHOOK_TLS_PASSWORD "$(cat "$PASSWORD_FILE")"
}

down() {
  local data
  data=$(sed -n 's/^export RAILHOOK_TLS_PG_DATA=//p' "$ENV_FILE" 2>/dev/null | tail -1)
  if [ -n "$data" ] && [ -f "$data/PG_VERSION" ]; then
    runuser -u "$PG_USER" -- "$PG_BIN/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
  fi
  for pidfile in "$DIR/redis/redis.pid" "$DIR/broker/stunnel.pid"; do
    pid_alive "$pidfile" && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  pid_alive "$DIR/broker/broker.pid" && kill -9 "$(cat "$DIR/broker/broker.pid")" 2>/dev/null || true
  for v in RAILHOOK_TLS_PG_PORT RAILHOOK_TLS_PG_SOCKET RAILHOOK_TLS_PG_DATA RAILHOOK_TLS_REDIS_PORT \
           RAILHOOK_TLS_KAFKA_PORT RAILHOOK_TLS_DIR RAILHOOK_TLS_PASSWORD; do
    unset_env "$v"
  done
  log "TLS servers stopped"
}

case "${1:-up}" in
  up) up ;;
  down) down ;;
  *) die "usage: $0 up|down" ;;
esac
