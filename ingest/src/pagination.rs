//! Cursor pagination: lists are newest first (`ORDER BY id DESC`, ids are time-sortable),
//! and the opaque cursor is the last id of the previous page, base64url-encoded so callers
//! do not come to depend on its shape.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::Serialize;

use crate::problem::ApiError;

pub const DEFAULT_LIMIT: i64 = 50;
pub const MAX_LIMIT: i64 = 500;

/// A validated page request: how many rows, and the id to continue below.
pub struct PageRequest {
    pub limit: i64,
    pub after: Option<String>,
}

impl PageRequest {
    pub fn parse(limit: Option<i64>, cursor: Option<&str>) -> Result<Self, ApiError> {
        let limit = limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(ApiError::validation(
                "limit",
                format!("limit must be between 1 and {MAX_LIMIT}"),
            ));
        }
        let after = match cursor {
            None | Some("") => None,
            Some(c) => Some(decode_cursor(c).ok_or(ApiError::InvalidCursor)?),
        };
        Ok(Self { limit, after })
    }

    /// Rows to fetch: one more than the page, to know whether another page follows.
    pub fn fetch(&self) -> i64 {
        self.limit + 1
    }

    /// Cuts the extra row off and turns it into `next_cursor`.
    pub fn finish<T>(&self, mut rows: Vec<T>, id_of: impl Fn(&T) -> &str) -> Listing<T> {
        let more = rows.len() as i64 > self.limit;
        rows.truncate(self.limit as usize);
        let next_cursor = if more {
            rows.last().map(|r| URL_SAFE_NO_PAD.encode(id_of(r)))
        } else {
            None
        };
        Listing {
            data: rows,
            next_cursor,
        }
    }
}

fn decode_cursor(cursor: &str) -> Option<String> {
    let bytes = URL_SAFE_NO_PAD.decode(cursor).ok()?;
    let id = String::from_utf8(bytes).ok()?;
    // Ids (`evt_…`) and event-type names (`order.paid`, `a-b`).
    crate::routes::is_plain_name(&id).then_some(id)
}

/// One page of a list.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Listing<T> {
    pub data: Vec<T>,
    /// Pass as `cursor` to get the next page; absent on the last page.
    pub next_cursor: Option<String>,
}
