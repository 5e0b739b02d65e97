//! Warming the worker's connections at start (issue #35): each connection the pool opens
//! ahead (common/src/db.rs, `open_ahead`) plans the statements every delivery runs — the
//! Claim, the re-stamp and the success write — before the first hint arrives.
//!
//! Why: the worker's statements are planned once per connection, generically, over every
//! partition (common/src/db.rs, `Planning::Generic`). The first `bind` of each on a new
//! connection cost 10–60 ms on the loaded 2-core machine, and a cold worker paid it on each
//! of its connections inside the first second of traffic: that second's p99 was about
//! 200 ms, the next ones' 15. Each statement here runs on empty input, so it plans in full
//! and matches nothing: no row is read or written.

use std::time::Duration;

use uuid::Uuid;

use crate::claim::{self, Claimed};
use crate::fence::{self, StreakPolicy};
use crate::successes;

/// Opens the pool's connections ahead and plans the hot statements on each.
pub(crate) async fn warm(pools: &crate::Pools, streak: &StreakPolicy, gap_timeout: Duration) {
    let pool = &pools.claims;
    let nobody = Claimed {
        id: String::new(),
        token: Uuid::nil(),
        attempt_count: 0,
        event_id: String::new(),
        endpoint_id: String::new(),
        direction: railhook_common::vocabulary::Direction::Outgoing,
        sequence_number: None,
        ladder_started_at: chrono::Utc::now(),
        ordered: false,
        deferral_count: 0,
        gated: false,
        claimed_at: std::time::Instant::now(),
    };
    railhook_common::db::open_ahead(pool, "worker", |mut c| {
        let nobody = &nobody;
        async move {
            claim::claim_batch(&mut *c, &[], gap_timeout).await?;
            fence::restamp(&mut *c, nobody).await?;
            successes::write_successes(&mut *c, streak, []).await?;
            Ok(())
        }
    })
    .await;
    if pools.split() {
        railhook_common::db::open_ahead(&pools.outcomes, "worker outcomes", |mut c| async move {
            successes::write_successes(&mut *c, streak, [])
                .await
                .map(|_| ())
        })
        .await;
    }
}
