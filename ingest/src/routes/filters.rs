//! Payload filters (docs/ROUTING.md): a SQL/JSON path predicate on an endpoint or a
//! subscription, checked here before it is stored and evaluated by the ingest statement
//! (`railhook_ingest`, migration 20261206000027) on each Event's payload.
//!
//! Postgres is the parser: a filter is exactly what its `jsonpath` type accepts, so what is
//! checked here and what the statement runs cannot disagree. The check answers in the API's
//! words (the position of the error, never Postgres's message), and what is stored is the
//! canonical form Postgres prints, which the ingest can join with `&&` and `||`.

use crate::problem::{ApiError, ApiResult};

/// The longest filter accepted, in characters: a filter is a predicate, not a program, and
/// every planned Delivery of a filtered endpoint carries it to the statement.
pub const MAX_FILTER_CHARS: usize = 1_024;

/// Checks `filter` (the value of the request's `field`) and returns its canonical form.
pub(crate) async fn check_filter(
    db: impl sqlx::PgExecutor<'_>,
    field: &str,
    filter: &str,
) -> ApiResult<String> {
    let bad = |detail: String| ApiError::validation(field, detail);
    let chars = filter.chars().count();
    if filter.trim().is_empty() {
        return Err(bad(format!(
            "{field} must be a SQL/JSON path predicate such as `$.amount_cents > 10000`; send null to remove it"
        )));
    }
    if chars > MAX_FILTER_CHARS {
        return Err(bad(format!(
            "{field} is {chars} characters long; the limit is {MAX_FILTER_CHARS}"
        )));
    }
    if filter.contains('\0') {
        return Err(bad(format!("{field} must not contain a NUL character")));
    }
    let checked = sqlx::query!(
        r#"SELECT error_at, predicate AS "predicate!", strict AS "strict!", canonical
           FROM railhook_check_filter($1)"#,
        filter
    )
    .fetch_one(db)
    .await?;
    if let Some(at) = checked.error_at {
        let at = usize::try_from(at).unwrap_or(1).max(1);
        let near: String = filter.chars().skip(at - 1).take(20).collect();
        let near = if near.is_empty() {
            "the end of the filter".to_owned()
        } else {
            format!("`{near}`")
        };
        return Err(bad(format!(
            "{field} is not a valid SQL/JSON path: the error is at character {at}, near {near}"
        )));
    }
    if checked.strict {
        return Err(bad(format!(
            "{field} must not use strict mode: filters are evaluated in lax mode (a missing key makes a comparison false)"
        )));
    }
    if !checked.predicate {
        return Err(bad(format!(
            "{field} must be a predicate that is true or false for a payload, such as `$.status == \"shipped\"`; a path alone (`$.status`) selects values and decides nothing"
        )));
    }
    let canonical = checked
        .canonical
        .ok_or_else(|| bad(format!("{field} is not a valid SQL/JSON path")))?;
    super::filter_cost::check(&canonical)
        .map_err(|why| bad(format!("{field} {}", why.detail())))?;
    Ok(canonical)
}

/// A request's filter field: absent (`None`), `null` (`Some(None)`: remove it) or a filter,
/// checked and in canonical form.
pub(crate) async fn check_change(
    db: impl sqlx::PgExecutor<'_>,
    field: &str,
    change: Option<Option<&str>>,
) -> ApiResult<Option<Option<String>>> {
    match change {
        None => Ok(None),
        Some(None) => Ok(Some(None)),
        Some(Some(f)) => Ok(Some(Some(check_filter(db, field, f).await?))),
    }
}
