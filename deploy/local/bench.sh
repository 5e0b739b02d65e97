#!/usr/bin/env bash
# bench.sh relay [options]: brings up the local infrastructure and runs a benchmark against
# it, in release mode. Options go to railhook-bench (see `railhook-bench relay --help`).
source "$(dirname "$0")/lib.sh"
"$ROOT/deploy/local/up.sh"
if [ "${1:-}" = transports ]; then
  # The receivers' brokers and their clients (tests/transports/requirements.txt).
  ensure_transport_brokers
  "$ROOT/deploy/local/rabbitmq.sh" up
fi
source "$ENV_FILE"
cd "$ROOT"
# The relay-memory bench runs the real `railhook relay` binary as its own process.
cargo build --release --locked -p railhook -p railhook-bench --quiet
exec "$ROOT/target/release/railhook-bench" "$@"
