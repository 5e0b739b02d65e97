#!/usr/bin/env bash
# demo.sh: brings everything up, migrates, starts `railhook all` and a local receiver, and
# walks one Event through: an organization, a project, an endpoint (the receiver) with a
# subscription, an Event accepted with its Delivery and Outbox row, then delivered, signed,
# to the receiver, which verifies it with the official Standard Webhooks library. Prints the
# 201 → receiver latency. Railhook keeps running afterwards; stop it with down.sh.
source "$(dirname "$0")/lib.sh"
"$ROOT/deploy/local/up.sh"
ensure_standardwebhooks
source "$ENV_FILE"
cd "$ROOT"
# Not --quiet: on a fresh clone this is the one long step (about 4 minutes on 2 cores), and a
# newcomer watching a silent terminal cannot tell it from a hang.
log "building railhook (the first build takes a few minutes; later ones seconds)"
cargo build --locked --bin railhook
BIN="$ROOT/target/debug/railhook"

if [ -z "${RAILHOOK_ADMIN_TOKEN:-}" ]; then
  RAILHOOK_ADMIN_TOKEN="admin-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
  set_env RAILHOOK_ADMIN_TOKEN "$RAILHOOK_ADMIN_TOKEN"
fi
export RAILHOOK_ADMIN_TOKEN
"$BIN" migrate

if pid_alive "$STATE/railhook.pid"; then
  kill "$(cat "$STATE/railhook.pid")"; sleep 1
fi
port=$(free_port)
export RAILHOOK_HTTP_ADDR="127.0.0.1:$port"
export RAILHOOK_METRICS_ADDR="127.0.0.1:$(free_port)"
# The demo receiver is on loopback, which the SSRF guard refuses unless allowed.
export RAILHOOK_ALLOW_PRIVATE_TARGETS="127.0.0.0/8"
# The demo serves plain HTTP on loopback, so the dashboard's cookie cannot be Secure here.
export RAILHOOK_DASHBOARD_COOKIE_SECURE=false

# The demo receiver.
if pid_alive "$STATE/receiver.pid"; then kill "$(cat "$STATE/receiver.pid")"; fi
receiver_port=$(free_port)
: > "$STATE/receiver.log"
: > "$STATE/receiver.secret"
setsid python3 "$ROOT/deploy/local/demo_receiver.py" "$receiver_port" "$STATE/receiver.secret" "$STATE/receiver.log" \
  </dev/null >>"$STATE/receiver.out" 2>&1 &
echo $! > "$STATE/receiver.pid"
set_env RAILHOOK_API "http://$RAILHOOK_HTTP_ADDR"
# The names the `railhook` command line (replay, listen) and the quickstart read.
set_env RAILHOOK_API_URL "http://$RAILHOOK_HTTP_ADDR"
setsid "$BIN" all </dev/null >>"$STATE/railhook.log" 2>&1 &
echo $! > "$STATE/railhook.pid"
API="http://$RAILHOOK_HTTP_ADDR"
wait_for "railhook" 30 curl -sf "$API/readyz"
log "railhook all is running at $API (log: $STATE/railhook.log)"

json() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
call() { # call METHOD PATH TOKEN [BODY]
  curl -sS -X "$1" "$API$2" -H "authorization: Bearer $3" -H 'content-type: application/json' ${4:+-d "$4"}
}

org=$(call POST /v1/organizations "$RAILHOOK_ADMIN_TOKEN" '{"name":"Demo Org","monthly_quota":100000}' | json "['id']")
project=$(call POST /v1/projects "$RAILHOOK_ADMIN_TOKEN" "{\"organization_id\":\"$org\",\"name\":\"Demo\"}")
key=$(echo "$project" | json "['api_key']")
set_env RAILHOOK_API_KEY "$key"
created=$(call POST /v1/endpoints "$key" "{\"url\":\"http://127.0.0.1:$receiver_port/webhooks\",\"description\":\"demo receiver\"}")
endpoint=$(echo "$created" | json "['id']")
echo "$created" | json "['secret']" > "$STATE/receiver.secret"
call POST /v1/subscriptions "$key" "{\"endpoint_id\":\"$endpoint\",\"event_types\":[\"order.*\"]}" >/dev/null
idem="demo-order-$(date +%s%N)"
echo
echo "== POST /v1/events (Idempotency-Key: $idem)"
sent_ms=$(python3 -c 'import time; print(time.time()*1000)')
curl -sS -w '\n-> HTTP %{http_code}\n' -X POST "$API/v1/events" -H "authorization: Bearer $key" \
  -H 'content-type: application/json' -H "Idempotency-Key: $idem" \
  -d '{"type":"order.paid","payload":{"order_id":1,"amount_cents":4200}}'
echo "== the same request again: the same Event, nothing new written"
curl -sS -w '\n-> HTTP %{http_code}\n' -X POST "$API/v1/events" -H "authorization: Bearer $key" \
  -H 'content-type: application/json' -H "Idempotency-Key: $idem" \
  -d '{"type":"order.paid","payload":{"order_id":1,"amount_cents":4200}}'
echo "== committed together: the Event, its Delivery, its Outbox row"
psql "$DATABASE_URL" -P pager=off -c "
  select e.id as event, d.id as delivery, d.status, o.id as outbox_row, o.reason
  from events e join deliveries d on d.event_id = e.id join outbox o on o.delivery_id = d.id
  where e.project_id = '$(echo "$project" | json "['id']")'"
echo "== the receiver got it: signed, verified by the official Standard Webhooks library"
wait_for "the webhook at the receiver" 30 test -s "$STATE/receiver.log"
python3 - "$STATE/receiver.log" "$sent_ms" <<'PY'
import json, sys
line = json.loads(open(sys.argv[1]).readline())
print(f"webhook-id {line['webhook_id']}  event {line['event_id']}  verified={line['verified']}  body={line['body']}")
print(f"POST /v1/events sent -> webhook at the receiver: {line['arrived_ms'] - float(sys.argv[2]):.1f} ms")
PY
# A customer of the demo team, and a one-time link to its portal (docs/PORTAL.md).
app=$(call POST /v1/applications "$key" '{"name":"Demo customer","uid":"demo-customer"}' | json "['id']")
portal=$(call POST "/v1/applications/$app/portal-access" "$key" '{"expiry":3600}' | json "['url']")
echo "API key for this demo project: $key"
echo "Dashboard: $API/dashboard/ (sign in with the API key above)"
echo "Customer portal of application $app (open once, within 10 minutes): $portal"
echo "Railhook keeps running at $API; stop everything with deploy/local/down.sh"
