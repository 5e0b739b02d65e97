#!/usr/bin/env bash
# demo.sh: brings everything up, migrates, starts `railhook all`, and walks one Event in:
# an organization, a project, an endpoint with a subscription, and an Event accepted with
# its Delivery and Outbox row. Railhook keeps running afterwards; stop it with down.sh.
source "$(dirname "$0")/lib.sh"
"$ROOT/deploy/local/up.sh"
source "$ENV_FILE"
cd "$ROOT"
log "building railhook"
cargo build --locked --bin railhook --quiet
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
set_env RAILHOOK_API "http://$RAILHOOK_HTTP_ADDR"
"$BIN" all >>"$STATE/railhook.log" 2>&1 &
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
endpoint=$(call POST /v1/endpoints "$key" '{"url":"http://127.0.0.1:9/demo-receiver","description":"demo"}' | json "['id']")
call POST /v1/subscriptions "$key" "{\"endpoint_id\":\"$endpoint\",\"event_types\":[\"order.*\"]}" >/dev/null
echo
echo "== POST /v1/events (Idempotency-Key: demo-order-1)"
curl -sS -w '\n-> HTTP %{http_code}\n' -X POST "$API/v1/events" -H "authorization: Bearer $key" \
  -H 'content-type: application/json' -H 'Idempotency-Key: demo-order-1' \
  -d '{"type":"order.paid","payload":{"order_id":1,"amount_cents":4200}}'
echo "== the same request again: the same Event, nothing new written"
curl -sS -w '\n-> HTTP %{http_code}\n' -X POST "$API/v1/events" -H "authorization: Bearer $key" \
  -H 'content-type: application/json' -H 'Idempotency-Key: demo-order-1' \
  -d '{"type":"order.paid","payload":{"order_id":1,"amount_cents":4200}}'
echo "== committed together: the Event, its Delivery, its Outbox row"
psql "$DATABASE_URL" -P pager=off -c "
  select e.id as event, d.id as delivery, d.status, o.id as outbox_row, o.reason
  from events e join deliveries d on d.event_id = e.id join outbox o on o.delivery_id = d.id
  where e.project_id = '$(echo "$project" | json "['id']")'"
echo "API key for this demo project: $key"
echo "Railhook keeps running at $API; stop everything with deploy/local/down.sh"
