#!/usr/bin/env bash
# sqlx-prepare.sh: regenerates .sqlx/ (the query data sqlx's macros compile against) from a
# scratch database built from migrations/. Run it after changing a query or a migration.
source "$(dirname "$0")/lib.sh"
"$ROOT/deploy/local/postgres.sh" up
source "$ENV_FILE"
base="${DATABASE_URL%/*}"
scratch="$base/railhook_sqlx"
psql "$base/postgres" -qc 'drop database if exists railhook_sqlx' -c 'create database railhook_sqlx' >/dev/null
for f in "$ROOT"/migrations/*.sql; do
  psql "$scratch" -q -v ON_ERROR_STOP=1 -f "$f" >/dev/null
done
rm -rf "$ROOT/.sqlx" && mkdir -p "$ROOT/.sqlx"
# Touch every crate so each macro runs again and writes its query file (a build, not a
# check, so the test build that follows reuses the artifacts).
find "$ROOT" -path "$ROOT/target" -prune -o -name '*.rs' -print0 | xargs -0 touch
(cd "$ROOT" && SQLX_OFFLINE=false SQLX_OFFLINE_DIR="$ROOT/.sqlx" DATABASE_URL="$scratch" \
  cargo build --workspace --all-targets --quiet)
log "wrote $(ls "$ROOT/.sqlx" | wc -l) query files to .sqlx/"
