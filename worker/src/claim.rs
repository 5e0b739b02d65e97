//! The Claim: how a worker takes a Delivery row (duplicate windows 4 and 5), the only
//! statements that do (the ordering hand-off among them), and what a won Claim hands to its
//! turn (`Claimed`, `Target`).
//!
//! A Kafka message is a hint; these statements decide. A fresh hint claims with
//! [`claim_batch`] (PENDING and due → PROCESSING under a new token); a RetryHint swaps the
//! scheduler's token for the consumer's with [`swap_batch`]. Every later write on the row is
//! conditional on that token (the Fence, fence.rs). The retry scheduler's own Claim of due
//! rows, [`claim_due`], is here too.

use chrono::{DateTime, Utc};
use railhook_common::Word;
use railhook_common::vocabulary::Direction;
use sqlx::PgPool;
use uuid::Uuid;

/// A Delivery this worker owns, under `token`.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub id: String,
    pub token: Uuid,
    pub attempt_count: i32,
    pub event_id: String,
    pub endpoint_id: String,
    pub direction: Direction,
    pub sequence_number: Option<i64>,
    pub ladder_started_at: DateTime<Utc>,
    /// Opted into the Ordering Buffer (and not skipped out of it).
    pub ordered: bool,
    pub deferral_count: i32,
    /// Handed off by its predecessor's resolution, which checked the order under the
    /// endpoint's lock (ordering.rs, `hand_off_next`): the gate is not run again.
    pub gated: bool,
    /// When the statement that took the Claim answered: a Claim younger than
    /// `turn::FRESH_CLAIM` is its own re-stamp (turn.rs, `send`).
    pub claimed_at: std::time::Instant,
}

/// Where and what to send for a claimed Delivery.
#[derive(Debug, Clone)]
pub struct Target {
    pub url: String,
    pub secret: String,
    pub previous_secret: Option<String>,
    pub headers: serde_json::Value,
    pub timeout_ms: i32,
    pub enabled: bool,
    pub event_type: String,
    pub payload: String,
    /// The endpoint's own ladder, if it has one: waits ("60,300") and Attempts.
    pub retry_delays: Option<String>,
    pub max_attempts: Option<i32>,
    /// When the Event committed: the start of the delivery latency.
    pub event_created_at: DateTime<Utc>,
    pub rate_limit_per_second: Option<i32>,
    pub rate_limit_burst: Option<i32>,
    pub max_concurrency: Option<i32>,
    /// The endpoint's application and that application's rate limit (all of its endpoints
    /// together), if it has one.
    pub application_id: Option<String>,
    pub application_rate_limit: Option<i32>,
    /// Incoming webhooks: the provider's body as it came, and the headers to pass on.
    pub raw_body: Option<Vec<u8>>,
    pub forward_headers: Option<serde_json::Value>,
    /// The Event's payload was expunged: nothing may be sent.
    pub expunged: bool,
    /// The trace context stored with the Event (common/src/trace_context.rs).
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// The Delivery's Event is not stored (its row is gone): nothing can be sent.
    pub event_gone: bool,
    /// The endpoint's transport settings, sealed (`None`: HTTP to `url`); opened by the turn
    /// right before the Attempt (common/src/transport/).
    pub transport_secret: Option<String>,
    /// The endpoint's HTTP authentication, sealed (common/src/endpoint_auth.rs); opened by
    /// the turn like the transport settings.
    pub authentication_secret: Option<String>,
    /// The endpoint's client certificate and key for mutual TLS, sealed; opened likewise.
    pub client_certificate_secret: Option<String>,
    /// The endpoint's transformation, when it is on (common/src/transformation.rs), and the
    /// outcome it last recorded (`transformation_last`, as `outcome:error`), so a turn writes
    /// only a change.
    pub transformation: Option<String>,
    pub transformation_last: Option<String>,
}

/// One row of [`claim_batch`] or [`swap_batch`]: the Claim and what its Attempt needs.
struct ClaimRow {
    id: String,
    token: Uuid,
    attempt_count: i32,
    event_id: String,
    endpoint_id: String,
    direction: String,
    sequence_number: Option<i64>,
    ladder_started_at: DateTime<Utc>,
    ordered: bool,
    deferral_count: i32,
    rate_limit_per_second: Option<i32>,
    rate_limit_burst: Option<i32>,
    max_concurrency: Option<i32>,
    application_id: Option<String>,
    application_rate_limit: Option<i32>,
    url: String,
    secret: String,
    previous_secret: Option<String>,
    headers: serde_json::Value,
    timeout_ms: i32,
    enabled: bool,
    event_type: String,
    payload: String,
    retry_delays: Option<String>,
    max_attempts: Option<i32>,
    event_created_at: DateTime<Utc>,
    raw_body: Option<Vec<u8>>,
    forward_headers: Option<serde_json::Value>,
    expunged: bool,
    traceparent: Option<String>,
    tracestate: Option<String>,
    event_gone: bool,
    transport_secret: Option<String>,
    authentication_secret: Option<String>,
    client_certificate_secret: Option<String>,
    transformation: Option<String>,
    transformation_last: Option<String>,
    /// Goes without the ordering gate: the statement checked the order itself.
    gated: bool,
    /// Parked by the statement, not claimed (`claim_batch` only).
    parked: bool,
}

impl ClaimRow {
    fn split(self) -> (Claimed, Target) {
        let claimed = Claimed {
            id: self.id,
            token: self.token,
            attempt_count: self.attempt_count,
            event_id: self.event_id,
            endpoint_id: self.endpoint_id,
            // The column's CHECK allows only the two words.
            direction: Direction::parse(&self.direction).unwrap_or(Direction::Outgoing),
            sequence_number: self.sequence_number,
            ladder_started_at: self.ladder_started_at,
            ordered: self.ordered,
            deferral_count: self.deferral_count,
            gated: self.gated,
            claimed_at: std::time::Instant::now(),
        };
        let target = Target {
            url: self.url,
            secret: self.secret,
            previous_secret: self.previous_secret,
            headers: self.headers,
            timeout_ms: self.timeout_ms,
            enabled: self.enabled,
            event_type: self.event_type,
            payload: self.payload,
            retry_delays: self.retry_delays,
            max_attempts: self.max_attempts,
            event_created_at: self.event_created_at,
            rate_limit_per_second: self.rate_limit_per_second,
            rate_limit_burst: self.rate_limit_burst,
            max_concurrency: self.max_concurrency,
            application_id: self.application_id,
            application_rate_limit: self.application_rate_limit,
            raw_body: self.raw_body,
            forward_headers: self.forward_headers,
            expunged: self.expunged,
            traceparent: self.traceparent,
            tracestate: self.tracestate,
            event_gone: self.event_gone,
            transport_secret: self.transport_secret,
            authentication_secret: self.authentication_secret,
            client_certificate_secret: self.client_certificate_secret,
            transformation: self.transformation,
            transformation_last: self.transformation_last,
        };
        (claimed, target)
    }
}

/// A Claim statement with the read of what its Attempts need, written once for every
/// statement that takes a Delivery row. `$claimed` is the statement's `WITH` clause: its
/// last query, named `claimed`, returns each taken (or parked) row as `id, token, verdict,
/// attempt_count, event_id, endpoint_id, direction, sequence_number, ladder_started_at,
/// ordered, deferral_count`. `verdict`: `claim` (the gate still runs for an ordered
/// Delivery), `go` (the order was checked by the statement), or `park` (parked, not
/// claimed). sqlx's macros take only literal SQL, so the shared part is spliced in here.
///
/// The Event is read by its id, one index lookup per claimed row (`LATERAL … LIMIT 1`), as
/// a LEFT join: a Delivery whose Event is missing is still returned (`event_gone`), so its
/// turn can end it FAILED `event_gone`. As an inner join the statement flipped such a row to
/// PROCESSING under a token it never handed to anyone (review #34 item 9). As
/// a plain join the generic plan hashed the claimed rows and scanned every Event partition
/// in full (3.9 of the 6.1 ms of a 30-row Claim with 10,000 Events stored, growing with the
/// day), because the statistics of the day's partition lag behind its inserts.
macro_rules! claim_rows {
    ($claimed:tt, $($arg:expr),* $(,)?) => {
        sqlx::query_as!(
            ClaimRow,
            $claimed + r#"
           SELECT c.id AS "id!", c.token AS "token!", c.attempt_count AS "attempt_count!",
                  c.event_id AS "event_id!", c.endpoint_id AS "endpoint_id!",
                  c.direction AS "direction!", c.sequence_number,
                  c.ladder_started_at AS "ladder_started_at!",
                  c.ordered AS "ordered!", c.deferral_count AS "deferral_count!",
                  e.rate_limit_per_second, e.rate_limit_burst, e.max_concurrency,
                  e.application_id,
                  (SELECT a.rate_limit_per_second FROM applications a
                   WHERE a.id = e.application_id) AS application_rate_limit,
                  e.url, e.secret,
                  CASE WHEN e.previous_secret_expires_at > now() THEN e.previous_secret END AS previous_secret,
                  e.headers, e.timeout_ms, (e.enabled AND e.deleted_at IS NULL) AS "enabled!",
                  coalesce(v.event_type, '') AS "event_type!",
                  coalesce(v.payload::text, 'null') AS "payload!",
                  e.retry_delays, e.max_attempts,
                  coalesce(v.created_at, c.ladder_started_at) AS "event_created_at!",
                  v.raw_body, v.forward_headers,
                  v.expunged_at IS NOT NULL AS "expunged!", v.traceparent, v.tracestate,
                  v.id IS NULL AS "event_gone!", e.transport_secret,
                  e.authentication_secret, e.client_certificate_secret,
                  CASE WHEN e.transformation_enabled THEN e.transformation_code END
                      AS transformation,
                  (e.transformation_last->>'outcome') || ':'
                      || coalesce(e.transformation_last->>'error', '') AS transformation_last,
                  c.verdict = 'go' AS "gated!", c.verdict = 'park' AS "parked!"
           FROM claimed c
           JOIN endpoints e ON e.id = c.endpoint_id
           LEFT JOIN LATERAL (
               SELECT v.id, v.event_type, v.payload, v.created_at, v.raw_body,
                      v.forward_headers, v.expunged_at, v.traceparent, v.tracestate
               FROM events v WHERE v.id = c.event_id LIMIT 1) AS v ON true"#,
            $($arg),*
        )
    };
}

/// What one Claim statement did with a batch of fresh hints.
#[derive(Debug, Default)]
pub struct Claims {
    /// Won Claims, with what their Attempts need.
    pub won: Vec<(Claimed, Target)>,
    /// Ordered Deliveries parked by the statement instead of claimed: something ahead of
    /// them on their endpoint is unresolved (ordering.rs, "Parking in the Claim").
    pub parked: Vec<String>,
}

impl Claims {
    /// Whether the statement answered the hint for `id`: claimed or parked it. A hint it
    /// did not answer is a miss (a duplicate, or a row not yet visible).
    pub fn answered(&self, id: &str) -> bool {
        self.won.iter().any(|(c, _)| c.id == id) || self.parked.iter().any(|p| p == id)
    }
}

/// The Claim (duplicate windows 4 and 5), the only one: one worker gets each row; every other
/// copy of the hint — a republished Outbox row, a rebalance replay — matches nothing.
/// Claims a batch of hinted Deliveries in one statement (one commit for the whole batch)
/// and returns each won Claim with what its Attempt needs. A hint repeated in the batch, or
/// for a row that is not due, simply returns nothing for it.
///
/// An ordered Delivery is decided here too, from the same snapshot the ordering gate would
/// read (ordering.rs, "Parking in the Claim"): with nothing unresolved ahead of it, it is
/// claimed and goes without the gate (`gated`); with something ahead, it is parked by this
/// statement (PENDING, its wake-up from `railhook_park_wakeup`) instead of being claimed, gated and
/// parked in three transactions; unnumbered, or parked past its gap timeout, it is claimed
/// and the gate decides, as before.
///
/// The verdict is `MATERIALIZED`: every assignment of the update reads it, and inlined it
/// put one copy of the "anything ahead?" probe (over every partition) into each of them, seven
/// subplans per statement, each run per row. Measured on a batch of 128 (docs/BENCHMARKS-HISTORY.md,
/// "JIT"): planning 14.7 → 10.8 ms, one subplan.
///
/// The stamp (`last_attempt_at`) starts the processing window: the worker claims only what
/// it can start at once (a free in-flight permit per hint), so the window is not spent
/// waiting in a queue.
///
/// Invariant: the Claim finds its rows by primary key, whatever the statistics say. The
/// worker's statements run as one generic plan per connection (common/src/db.rs,
/// `Planning::Generic`), made from the statistics of its first call or of the last ANALYZE.
/// With `status = 'PENDING'` written plainly, the planner may read every row of a partial
/// index whose predicate that implies (`deliveries_open_event_idx`, `deliveries_due_idx`) and
/// hash-join it with the hints — cheap when the statistics were taken with few open
/// Deliveries, and a scan of the whole backlog per Claim once one formed before the next
/// ANALYZE (measured, issue #54: 50,000 PENDING rows written after an ANALYZE, 15.1 ms per
/// Claim of one hint, against 0.65 ms by primary key). The comparison under `COLLATE "C"`
/// means the same for these ASCII words (equality is bytewise under any deterministic
/// collation), but Postgres cannot prove a partial index's predicate from it, so the only
/// way in is the primary key (tests/it/claim_fence.rs,
/// `the_claim_reads_by_primary_key_even_with_stale_statistics`).
#[tracing::instrument(level = "debug", skip_all, fields(hints = ids.len()))]
pub async fn claim_batch(
    db: impl sqlx::PgExecutor<'_>,
    ids: &[String],
    gap_timeout: std::time::Duration,
) -> Result<Claims, sqlx::Error> {
    let tokens: Vec<Uuid> = ids.iter().map(|_| Uuid::new_v4()).collect();
    let (lowest, highest) = id_range(ids);
    let rows = claim_rows!(
        r#"WITH want AS (
               SELECT * FROM unnest($1::text[], $2::uuid[]) AS w(id, token)
           ), verdict AS MATERIALIZED (
               SELECT d.id, w.token,
                      CASE
                          WHEN NOT (d.ordered AND d.ordering_skipped_at IS NULL)
                               OR d.sequence_number IS NULL THEN 'claim'
                          WHEN NOT EXISTS (
                              SELECT 1 FROM railhook_ordered_ahead(d.endpoint_id, d.sequence_number))
                              THEN 'go'
                          WHEN d.parked_at + make_interval(secs => $3) <= now() THEN 'claim'
                          ELSE 'park'
                      END AS verdict
               FROM want w JOIN deliveries d ON d.id = w.id
               WHERE d.status = 'PENDING' COLLATE "C"
                 AND (d.next_retry_at IS NULL OR d.next_retry_at <= now())
                 AND d.id BETWEEN $4 AND $5
           ), claimed AS (
               UPDATE deliveries d
               SET status = CASE WHEN v.verdict = 'park' THEN 'PENDING' ELSE 'PROCESSING' END,
                   claim_token = CASE WHEN v.verdict = 'park' THEN NULL ELSE v.token END,
                   last_attempt_at = CASE WHEN v.verdict = 'park' THEN d.last_attempt_at
                                          ELSE now() END,
                   parked_at = CASE v.verdict WHEN 'park' THEN coalesce(d.parked_at, now())
                                              WHEN 'go' THEN NULL ELSE d.parked_at END,
                   next_retry_at = CASE WHEN v.verdict = 'park'
                       THEN railhook_park_wakeup(d.endpoint_id, d.sequence_number, d.parked_at,
                                                 $3, $6)
                       ELSE d.next_retry_at END,
                   deferral_count = d.deferral_count
                                    + CASE WHEN v.verdict = 'park' THEN 1 ELSE 0 END,
                   updated_at = now(), version = d.version + 1
               FROM verdict v
               WHERE d.id = v.id AND d.status = 'PENDING' COLLATE "C"
                 AND (d.next_retry_at IS NULL OR d.next_retry_at <= now())
                 AND d.id BETWEEN $4 AND $5
               RETURNING d.id, v.token, v.verdict, d.attempt_count, d.event_id, d.endpoint_id,
                         d.direction, d.sequence_number, d.ladder_started_at,
                         (d.ordered AND d.ordering_skipped_at IS NULL) AS ordered, d.deferral_count
           )"#,
        ids,
        &tokens,
        gap_timeout.as_secs_f64(),
        lowest,
        highest,
        crate::ordering::PARKED_FALLBACK.as_secs_f64()
    )
    .fetch_all(db)
    .await?;
    let mut claims = Claims::default();
    for r in rows {
        if r.parked {
            claims.parked.push(r.id);
        } else {
            claims.won.push(r.split());
        }
    }
    Ok(claims)
}

pub use railhook_common::ids::id_range;

/// The parker's second look (ordering.rs, "Parking in the Claim"): of the Deliveries a Claim
/// statement just parked, claims those that nothing unresolved is ahead of any more, because
/// their predecessor resolved while the statement ran and its resolution could not see the
/// park. Each such row is claimed at most once: the update re-checks the row itself
/// (PENDING and parked) on the version it locks. Usually matches nothing and writes nothing.
pub async fn take_parked(
    pool: &PgPool,
    ids: &[String],
) -> Result<Vec<(Claimed, Target)>, sqlx::Error> {
    let rows = claim_rows!(
        r#"WITH ready AS (
               SELECT d.id FROM deliveries d
               WHERE d.id = ANY($1) AND d.status = 'PENDING' AND d.parked_at IS NOT NULL
                 AND NOT EXISTS (
                     SELECT 1 FROM railhook_ordered_ahead(d.endpoint_id, d.sequence_number))
           ), claimed AS (
               UPDATE deliveries d
               SET status = 'PROCESSING', claim_token = gen_random_uuid(),
                   last_attempt_at = now(), parked_at = NULL, next_retry_at = NULL,
                   updated_at = now(), version = d.version + 1
               FROM ready r
               WHERE d.id = r.id AND d.status = 'PENDING' AND d.parked_at IS NOT NULL
               RETURNING d.id, d.claim_token AS token, 'go' AS verdict, d.attempt_count,
                         d.event_id, d.endpoint_id, d.direction, d.sequence_number,
                         d.ladder_started_at,
                         (d.ordered AND d.ordering_skipped_at IS NULL) AS ordered, d.deferral_count
           )"#,
        ids
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(ClaimRow::split).collect())
}

/// The hand-off (ordering.rs): claims the next parked Delivery of the endpoint (the smallest
/// number above `sequence_number`) for the resolving worker, if nothing else unresolved is
/// ahead of it (the gate's own condition, so it goes without the gate), and returns it with
/// what its Attempt needs, in one statement. Runs in the resolution's transaction under the
/// endpoint's lock, and once more after its commit (the resolver's second look), so the
/// update re-checks the row itself (PENDING and parked) on the version it locks: of two
/// looks, one gets it. If something else is still ahead, nothing is released: whichever of
/// those resolves last releases it, and its own wake-up stays set.
///
/// Crash safety: the successor is PROCESSING when the statement commits, like any claimed
/// Delivery, so a worker that dies before delivering it leaves it to the processing sweep
/// (PENDING and due again after `processing_timeout_seconds`), as a worker that dies
/// mid-Attempt does.
pub async fn hand_off_next(
    db: impl sqlx::PgExecutor<'_>,
    endpoint_id: &str,
    sequence_number: i64,
) -> Result<Option<(Claimed, Target)>, sqlx::Error> {
    let row = claim_rows!(
        r#"WITH next AS (
               SELECT id, sequence_number FROM railhook_parked_successor($1, $2)
           ), claimed AS (
               UPDATE deliveries d
               SET status = 'PROCESSING', claim_token = gen_random_uuid(),
                   last_attempt_at = now(), updated_at = now(), version = d.version + 1,
                   parked_at = NULL, next_retry_at = NULL
               FROM next
               WHERE d.id = next.id AND d.status = 'PENDING' AND d.parked_at IS NOT NULL
                 AND NOT EXISTS (
                     SELECT 1 FROM railhook_ordered_ahead($1, next.sequence_number))
               RETURNING d.id, d.claim_token AS token, 'go' AS verdict, d.attempt_count,
                         d.event_id, d.endpoint_id, d.direction, d.sequence_number,
                         d.ladder_started_at,
                         (d.ordered AND d.ordering_skipped_at IS NULL) AS ordered, d.deferral_count
           )"#,
        endpoint_id,
        sequence_number
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(ClaimRow::split))
}

/// Which of `ids` this transaction cannot see at all: a hint that came ahead of its row.
///
/// Why it happens: Postgres writes a transaction's commit record to the WAL, which the
/// relay may decode, publish and Kafka deliver, before the committing backend has made the
/// transaction visible to other snapshots. On a loaded machine the committing backend can
/// be descheduled in between for milliseconds, and the Claim then matches nothing although
/// the row is about to be PENDING (seen: 1 in 3,000 at 300 Events/s on 2 cores). Without a
/// second look its hint would be taken for a duplicate, and the Delivery would wait for the
/// stranded sweep (an hour). With a synchronous standby that stalls, the wait is as long as
/// the stall (review #34 item 1; dispatch.rs, `look_again`).
pub async fn invisible(pool: &PgPool, ids: &[String]) -> Result<Vec<String>, sqlx::Error> {
    sqlx::query_scalar!(
        r#"SELECT w.id AS "id!" FROM unnest($1::text[]) AS w(id)
           WHERE NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.id = w.id)"#,
        ids
    )
    .fetch_all(pool)
    .await
}

/// Records hints that came ahead of their rows (dispatch.rs, `look_again`), so that a
/// Delivery whose hint this worker gave up on, or whose worker died looking, is found by
/// the missed-hints sweep. Committed locally only (`synchronous_commit = local`): the
/// record exists for the very case where commits wait on a stalled synchronous standby,
/// and it must not wait with them; a record lost with a failover costs at most the
/// stranded sweep's hour, as before it existed.
pub async fn record_misses(pool: &PgPool, ids: &[String]) -> Result<(), sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query_scalar!("SELECT set_config('synchronous_commit', 'local', true)")
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query!(
        "INSERT INTO hint_misses (delivery_id) SELECT unnest($1::text[])
         ON CONFLICT (delivery_id) DO NOTHING",
        ids
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// The retry path (duplicate window 5 on the retry topic): the scheduler claimed each row
/// under its own token and published that token; the consumer takes a row over only while
/// it still carries that token, so a redelivered RetryHint claims nothing. A batch of hints
/// is swapped in one statement (one commit), like [`claim_batch`], and the swap restamps
/// the Claim: its processing window starts now.
#[tracing::instrument(level = "debug", skip_all, fields(hints = hints.len()))]
pub async fn swap_batch(
    pool: &PgPool,
    hints: &[(String, Uuid)],
) -> Result<Vec<(Claimed, Target)>, sqlx::Error> {
    let ids: Vec<&str> = hints.iter().map(|(id, _)| id.as_str()).collect();
    let scheduler_tokens: Vec<Uuid> = hints.iter().map(|(_, t)| *t).collect();
    let tokens: Vec<Uuid> = hints.iter().map(|_| Uuid::new_v4()).collect();
    let rows = claim_rows!(
        r#"WITH want AS (
               SELECT * FROM unnest($1::text[], $2::uuid[], $3::uuid[]) AS w(id, held, token)
           ), claimed AS (
               UPDATE deliveries d
               SET claim_token = w.token, last_attempt_at = now(), hinted_at = NULL,
                   updated_at = now(), version = d.version + 1
               FROM want w
               WHERE d.id = w.id AND d.status = 'PROCESSING' AND d.claim_token = w.held
               RETURNING d.id, d.claim_token AS token, 'claim' AS verdict, d.attempt_count,
                         d.event_id, d.endpoint_id, d.direction, d.sequence_number,
                         d.ladder_started_at,
                         (d.ordered AND d.ordering_skipped_at IS NULL) AS ordered, d.deferral_count
           )"#,
        &ids as &[&str],
        &scheduler_tokens,
        &tokens
    )
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(ClaimRow::split).collect())
}

/// The retry scheduler's Claim: due rows, in batches, skipping rows another scheduler holds.
/// Returns (delivery id, endpoint id, scheduler token) per row.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn claim_due(
    pool: &PgPool,
    batch: i64,
) -> Result<Vec<(String, String, Uuid)>, sqlx::Error> {
    let rows = sqlx::query!(
        r#"UPDATE deliveries d
           SET status = 'PROCESSING', claim_token = gen_random_uuid(), last_attempt_at = now(),
               hinted_at = now(), updated_at = now(), version = version + 1
           FROM (SELECT id FROM deliveries
                 WHERE status = 'PENDING' AND next_retry_at <= now()
                 ORDER BY next_retry_at LIMIT $1
                 FOR UPDATE SKIP LOCKED) due
           WHERE d.id = due.id
           RETURNING d.id, d.endpoint_id, d.claim_token AS "token!""#,
        batch
    )
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.id, r.endpoint_id, r.token))
        .collect())
}
