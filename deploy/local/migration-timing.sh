#!/usr/bin/env bash
# migration-timing.sh [events]: how long the partitioning migration (20261204000010) holds
# its locks on a database of the previous schema filled with [events] Events (default
# 1,000,000), each with one Delivery and one Attempt, spread over 30 days. Prints the
# migration's wall time (the time events, deliveries and attempts are locked ACCESS
# EXCLUSIVE) and the rate. Uses a scratch database on the local Postgres; drops it after.
source "$(dirname "$0")/lib.sh"
"$ROOT/deploy/local/postgres.sh" up >/dev/null
source "$ENV_FILE"
n="${1:-1000000}"
base="${DATABASE_URL%/*}"
db="$base/railhook_migration_timing"
psql "$base/postgres" -qc 'drop database if exists railhook_migration_timing' \
  -c 'create database railhook_migration_timing' >/dev/null
target="20261204000010"
for f in "$ROOT"/migrations/*.sql; do
  [[ "$(basename "$f")" < "$target" ]] || continue
  psql "$db" -q -v ON_ERROR_STOP=1 -f "$f" >/dev/null
done
log "filling the previous schema with $n Events, Deliveries and Attempts"
psql "$db" -q -v ON_ERROR_STOP=1 <<SQL
INSERT INTO organizations VALUES ('org_t', 't', 1000000000);
INSERT INTO projects VALUES ('proj_t', 'org_t', 't');
INSERT INTO endpoints (id, project_id, url, secret) VALUES ('ep_t', 'proj_t', 'http://127.0.0.1:9/', 's');
-- The id's time prefix comes from the same encoding the migration adds; defined here for
-- the fill only, and dropped before the migration creates its own.
CREATE FUNCTION fill_ulid(prefix text, at timestamptz, salt text) RETURNS text LANGUAGE plpgsql IMMUTABLE AS \$\$
DECLARE a constant text := '0123456789abcdefghjkmnpqrstvwxyz'; ms bigint := floor(extract(epoch FROM at) * 1000); e text := '';
BEGIN FOR i IN 1..10 LOOP e := substr(a, (ms % 32)::int + 1, 1) || e; ms := ms / 32; END LOOP;
RETURN prefix || e || substr(md5(salt), 1, 16); END \$\$;
CREATE TEMP TABLE s AS SELECT i, now() - (i * 2592000.0 / $n) * interval '1 second' AS at FROM generate_series(1, $n) i;
INSERT INTO events (id, project_id, event_type, payload, idempotency_key, created_at)
  SELECT fill_ulid('evt_', at, i::text), 'proj_t', 'order.paid',
         jsonb_build_object('order_id', i, 'note', repeat('x', 80)), md5(i::text), at FROM s;
INSERT INTO deliveries (id, project_id, event_id, endpoint_id, status, created_at)
  SELECT fill_ulid('dlv_', at, i::text), 'proj_t', fill_ulid('evt_', at, i::text), 'ep_t', 'SUCCEEDED', at FROM s;
INSERT INTO attempts (delivery_id, attempt_number, started_at, finished_at, status_code, outcome, duration_ms)
  SELECT fill_ulid('dlv_', at, i::text), 1, at, at, 200, 'succeeded', 30 FROM s;
DROP FUNCTION fill_ulid;
VACUUM ANALYZE;
CHECKPOINT;
SQL
size=$(psql "$db" -Atc "select pg_size_pretty(pg_total_relation_size('events') + pg_total_relation_size('deliveries') + pg_total_relation_size('attempts'))")
start=$(date +%s.%N)
psql "$db" -q -v ON_ERROR_STOP=1 -1 -f "$ROOT/migrations/${target}_partitions.sql" >/dev/null
end=$(date +%s.%N)
secs=$(echo "$end - $start" | bc)
rows=$(psql "$db" -Atc "select (select count(*) from events) + (select count(*) from deliveries) + (select count(*) from attempts)")
parts=$(psql "$db" -Atc "select count(*) from pg_inherits where inhparent = 'events'::regclass")
printf 'migration of %s Events (+%s Deliveries, +%s Attempts; %s before) took %.1f s: %.0f rows/s; %s day partitions per table\n' \
  "$n" "$n" "$n" "$size" "$secs" "$(echo "$rows / $secs" | bc -l)" "$parts"
psql "$base/postgres" -qc 'drop database railhook_migration_timing' >/dev/null
