//! `railhook secrets rotate-key`: seals every endpoint signing secret, endpoint custom header
//! value, broker endpoint's transport settings (docs/DESTINATIONS.md), endpoint authentication
//! (common/src/endpoint_auth.rs) and Source secret with
//! the first key of `RAILHOOK_ENCRYPTION_KEYS` (common/src/sealing.rs), in batches.
//!
//! Run it after putting a new key first (`new,old`); when it reports nothing left, `old` can
//! go. It also seals secrets written in plaintext before any key was configured. Each row is
//! rewritten only if it still holds what was read (a rotation through the API meanwhile is
//! never overwritten; such a row is counted and a second run picks it up). Safe to run while
//! everything else runs, and again.

use anyhow::Context;
use railhook_common::config::Settings;
use railhook_common::sealing::Keyring;
use sqlx::PgPool;

#[derive(clap::Subcommand)]
pub enum SecretsAction {
    /// Seal every secret with the first configured key (re-sealing those under older keys
    /// and sealing plaintext ones).
    RotateKey,
}

/// Rows read per batch.
const BATCH: i64 = 500;

pub async fn run(settings: &Settings, action: SecretsAction) -> anyhow::Result<()> {
    match action {
        SecretsAction::RotateKey => {
            let keyring = settings.keyring();
            let Some(key_id) = keyring.sealing_key_id() else {
                anyhow::bail!(
                    "configuration: encryption_keys (RAILHOOK_ENCRYPTION_KEYS) has no key to seal with"
                );
            };
            let pool =
                railhook_common::db::connect(settings).context("configuration: database_url")?;
            println!("sealing with key {key_id}");
            for table in ["endpoints", "sources"] {
                let (resealed, raced) = reseal_table(&pool, &keyring, table).await?;
                println!("{table}: {resealed} rows sealed again, {raced} changed meanwhile");
                if raced > 0 {
                    println!("  run `railhook secrets rotate-key` again for those");
                }
            }
            let (resealed, raced) = reseal_headers(&pool, &keyring).await?;
            println!("endpoint headers: {resealed} rows sealed again, {raced} changed meanwhile");
            if raced > 0 {
                println!("  run `railhook secrets rotate-key` again for those");
            }
            reseal_columns(&pool, &keyring).await?;
            Ok(())
        }
    }
}

/// Re-seals `table`'s secrets (and an endpoint's previous secret) that need it. Returns
/// (rows rewritten, rows that changed between the read and the write).
#[allow(clippy::disallowed_methods)] // composed: the same re-seal runs over each table that holds secrets
async fn reseal_table(pool: &PgPool, keyring: &Keyring, table: &str) -> anyhow::Result<(u64, u64)> {
    let previous = if table == "endpoints" {
        "previous_secret"
    } else {
        "NULL::text"
    };
    let (mut cursor, mut resealed, mut raced) = (String::new(), 0, 0);
    loop {
        let rows: Vec<(String, String, Option<String>)> = sqlx::query_as(&format!(
            "SELECT id, secret, {previous} FROM {table} WHERE id > $1 ORDER BY id LIMIT $2"
        ))
        .bind(&cursor)
        .bind(BATCH)
        .fetch_all(pool)
        .await
        .with_context(|| format!("reading {table}"))?;
        let Some(last) = rows.last() else {
            return Ok((resealed, raced));
        };
        cursor = last.0.clone();
        for (id, secret, prev) in rows {
            let stale = keyring.needs_reseal(&secret)
                || prev.as_deref().is_some_and(|p| keyring.needs_reseal(p));
            if !stale {
                continue;
            }
            let new_secret = keyring
                .reseal(&id, &secret)
                .with_context(|| format!("{table} {id}"))?;
            let new_prev = prev
                .as_deref()
                .map(|p| keyring.reseal(&id, p))
                .transpose()
                .with_context(|| format!("{table} {id}"))?;
            let set_previous = if table == "endpoints" {
                ", previous_secret = $4"
            } else {
                ""
            };
            let check_previous = if table == "endpoints" {
                " AND previous_secret IS NOT DISTINCT FROM $5"
            } else {
                " AND $4::text IS NULL AND $5::text IS NULL"
            };
            let wrote = sqlx::query(&format!(
                "UPDATE {table} SET secret = $2{set_previous}
                 WHERE id = $1 AND secret = $3{check_previous}"
            ))
            .bind(&id)
            .bind(&new_secret)
            .bind(&secret)
            .bind(&new_prev)
            .bind(&prev)
            .execute(pool)
            .await
            .with_context(|| format!("writing {table} {id}"))?
            .rows_affected();
            if wrote == 1 {
                resealed += 1;
            } else {
                raced += 1;
            }
        }
    }
}

/// Re-seals endpoints' custom header values that need it, as [`reseal_table`] does the
/// secrets: each row only if its headers are still what was read.
async fn reseal_headers(pool: &PgPool, keyring: &Keyring) -> anyhow::Result<(u64, u64)> {
    let (mut cursor, mut resealed, mut raced) = (String::new(), 0, 0);
    loop {
        let rows = sqlx::query!(
            "SELECT id, headers FROM endpoints WHERE id > $1 AND headers <> '{}'::jsonb
             ORDER BY id LIMIT $2",
            cursor,
            BATCH
        )
        .fetch_all(pool)
        .await
        .context("reading endpoint headers")?;
        let Some(last) = rows.last() else {
            return Ok((resealed, raced));
        };
        cursor = last.id.clone();
        for row in rows {
            let Some(sealed) = keyring
                .reseal_headers(&row.id, &row.headers)
                .with_context(|| format!("endpoint {} headers", row.id))?
            else {
                continue;
            };
            let wrote = sqlx::query!(
                "UPDATE endpoints SET headers = $2 WHERE id = $1 AND headers = $3",
                row.id,
                sealed,
                row.headers
            )
            .execute(pool)
            .await
            .with_context(|| format!("writing endpoint {} headers", row.id))?
            .rows_affected();
            if wrote == 1 {
                resealed += 1;
            } else {
                raced += 1;
            }
        }
    }
}

/// The name a sealed value of an endpoint is bound to, from the endpoint's id.
type SealingId = fn(&str) -> String;

/// The endpoint columns that hold a whole sealed JSON value, each bound to its own sealing
/// id: a broker endpoint's transport settings and an HTTP endpoint's authentication.
const SEALED_COLUMNS: &[(&str, &str, SealingId)] = &[
    (
        "transport_secret",
        "endpoint transport settings",
        railhook_common::transport::sealing_id,
    ),
    (
        "authentication_secret",
        "endpoint authentication",
        railhook_common::endpoint_auth::sealing_id,
    ),
    (
        "client_certificate_secret",
        "endpoint client certificates",
        railhook_common::endpoint_auth::certificate_sealing_id,
    ),
];

/// Re-seals each of [`SEALED_COLUMNS`] that needs it, as [`reseal_table`] does the secrets:
/// each row only if its value is still what was read.
async fn reseal_columns(pool: &PgPool, keyring: &Keyring) -> anyhow::Result<()> {
    for (column, label, sealing) in SEALED_COLUMNS {
        let (resealed, raced) = reseal_column(pool, keyring, column, *sealing).await?;
        println!("{label}: {resealed} rows sealed again, {raced} changed meanwhile");
        if raced > 0 {
            println!("  run `railhook secrets rotate-key` again for those");
        }
    }
    Ok(())
}

#[allow(clippy::disallowed_methods)] // composed: the same re-seal runs over each sealed column
async fn reseal_column(
    pool: &PgPool,
    keyring: &Keyring,
    column: &str,
    sealing: SealingId,
) -> anyhow::Result<(u64, u64)> {
    let (mut cursor, mut resealed, mut raced) = (String::new(), 0, 0);
    loop {
        let rows: Vec<(String, String)> = sqlx::query_as(&format!(
            "SELECT id, {column} FROM endpoints
             WHERE id > $1 AND {column} IS NOT NULL ORDER BY id LIMIT $2"
        ))
        .bind(&cursor)
        .bind(BATCH)
        .fetch_all(pool)
        .await
        .with_context(|| format!("reading endpoints.{column}"))?;
        let Some(last) = rows.last() else {
            return Ok((resealed, raced));
        };
        cursor = last.0.clone();
        for (id, stored) in rows {
            if !keyring.needs_reseal(&stored) {
                continue;
            }
            let sealed = keyring
                .reseal(&sealing(&id), &stored)
                .with_context(|| format!("endpoint {id} {column}"))?;
            let wrote = sqlx::query(&format!(
                "UPDATE endpoints SET {column} = $2 WHERE id = $1 AND {column} = $3"
            ))
            .bind(&id)
            .bind(&sealed)
            .bind(&stored)
            .execute(pool)
            .await
            .with_context(|| format!("writing endpoint {id} {column}"))?
            .rows_affected();
            if wrote == 1 {
                resealed += 1;
            } else {
                raced += 1;
            }
        }
    }
}
