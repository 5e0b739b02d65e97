//! The relay page: the shared Slot's lag and state, as a tenant may see them.

use axum::extract::State;
use maud::html;

use super::{PageResult, Session, layout};
use crate::state::AppState;

// ---------------------------------------------------------------------------------------
// Relay

fn bytes(n: i64) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / f64::from(1u32 << 30)),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / f64::from(1u32 << 20)),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

pub async fn relay(State(state): State<AppState>, session: Session) -> PageResult {
    // Operational state of the shared Slot: no project's data is in it. Tenants see its lag
    // and state only; where the relay runs (the walsender's pid, the relay's address) is
    // the operator's, read with `railhook slot status` or from Postgres itself.
    let slot = railhook_common::slot_status::read(&state.pool, &state.slot).await?;
    let body = html! {
        @match &slot {
            None => p.error #slot-missing { "The Slot " code { (state.slot) } " does not exist. Run " code { "railhook slot create" } " (see docs/operate/slot.md)." },
            Some(s) => {
                div.grid #relay {
                    div.tile { div.muted { "Slot" } div.v { code { (state.slot) } } }
                    div.tile { div.muted { "Relay" } div.v.status class=(if s.active { "healthy" } else { "disabled" }) {
                        @if s.active { "active" } @else { "no relay holds the slot" } }
                    }
                    div.tile { div.muted { "Lag (bytes)" } div.v #lag-bytes { (s.lag_bytes.map_or_else(|| "—".to_owned(), bytes)) } }
                    div.tile { div.muted { "Lag (seconds, from heartbeats)" } div.v #lag-seconds {
                        (s.heartbeat_age_seconds.map_or_else(|| "—".to_owned(), |a| format!("≤ {a:.1} s"))) } }
                    div.tile { div.muted { "wal_status" } div.v.status class=[s.wal_status.as_deref()] { (s.wal_status.as_deref().unwrap_or("—")) } }
                    div.tile { div.muted { "Confirmed LSN" } div.v { code { (s.confirmed_flush_lsn.as_deref().unwrap_or("—")) } } }
                    div.tile { div.muted { "WAL left before invalidation" } div.v { (s.safe_wal_size.map_or_else(|| "unlimited".to_owned(), bytes)) } }
                    div.tile { div.muted { "Relay status written" } div.v { (s.status_age_seconds.map_or_else(|| "never".to_owned(), |a| format!("{a:.0} s ago"))) } }
                }
                p.muted { "A standby relay holds no connection while it waits, so Postgres cannot list it; "
                    code { "railhook_relay_active" } " in Prometheus shows every relay as active (1) or standby (0)." }
            }
        }
    };
    Ok(layout(&session, "relay", "Relay", body))
}
