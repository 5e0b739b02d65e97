//! An endpoint's transformation, run right before its Attempt (docs/ROUTING.md; the
//! sandbox and its limits are common/src/transformation.rs).
//!
//! Invariants:
//! - The program runs on a blocking thread, never on the runtime's workers: it may take its
//!   whole time limit, and a turn's neighbours must not wait for it. It holds one of its
//!   endpoint's sandbox slots (at most 2 of the process's 8) until the thread ends.
//! - What it returned is what is signed and sent: the body, method, URL and added headers
//!   replace the Attempt's before the signature is made (the transport signs `attempt.body`),
//!   and the same request is recorded with the Attempt (`attempts.request`).
//! - A failure or a limit hit is permanent for the Delivery (the same program on the same
//!   Event fails the same way): it ends FAILED with the reason, never retried, never a crash.
//!   A skip (`cancel`) ends it without an Attempt and without counting as a failure.
//! - It runs for outgoing HTTP Deliveries only: a forwarded provider webhook keeps the
//!   provider's bytes (its own signature may cover them), and a broker target has no URL or
//!   method to shape.

use std::time::Instant;

use railhook_common::Word;
use railhook_common::transformation::{self as sandbox, Input, LIMITS, Outcome, RunOutcome};
use railhook_common::vocabulary::Direction;

use crate::attempt::Attempt;
use crate::claim::{Claimed, Target};
use crate::runtime::Shared;

/// What the turn does after the program ran.
pub(crate) enum Transformed {
    /// Nothing to run, or the Attempt now carries the program's request.
    Send,
    /// `cancel = true`: end the Delivery unsent.
    Skip,
    /// End the Delivery FAILED with this reason.
    Failed(String),
}

/// The failure reason a Delivery ends with when its skip is recorded.
pub(crate) const SKIPPED: &str = "transformation_skipped";

/// Runs the endpoint's transformation, if it has one on, and applies its result to `attempt`.
pub(crate) async fn apply(
    shared: &Shared,
    claimed: &Claimed,
    target: &Target,
    attempt: &mut Attempt,
) -> Transformed {
    let Some(code) = target.transformation.clone() else {
        return Transformed::Send;
    };
    if claimed.direction != Direction::Outgoing || attempt.via.is_some() {
        return Transformed::Send;
    }
    let url = target.url.clone();
    let event_type = target.event_type.clone();
    let payload = target.payload.clone();
    // The names of the endpoint's own headers (custom ones and its Basic authorization):
    // the program may not set them, and never sees their values.
    let own: Vec<String> = attempt
        .extra
        .headers
        .iter()
        .map(|(k, _)| k.clone())
        .collect();
    let started = Instant::now();
    // In one of the endpoint's sandbox slots (common/src/transformation.rs, `run_in_slot`):
    // a program whose native built-in outlasts the wait keeps only its own endpoint's slots.
    let ran = sandbox::run_in_slot(&claimed.endpoint_id, move || {
        let payload = serde_json::value::RawValue::from_string(payload).map_err(|e| {
            sandbox::Failure::InvalidResult(format!("the payload is not JSON: {e}"))
        })?;
        let input = Input::new("POST", &url, &event_type, &payload, own);
        sandbox::run(&code, &input, &LIMITS)
    })
    .await
    .or_else(|unanswered| match unanswered {
        sandbox::Unanswered::TooLong => Ok(Err(sandbox::Failure::time_limit())),
        sandbox::Unanswered::Panicked => Err(()),
    });
    let took = started.elapsed().as_secs_f64();
    let (outcome, next, error) = match ran {
        Ok(Ok(Outcome::Send(request))) => match into_attempt(attempt, &request) {
            Ok(()) => (RunOutcome::Send, Transformed::Send, None),
            Err(why) => (RunOutcome::Failed, failed(&why), Some(why)),
        },
        Ok(Ok(Outcome::Skip)) => (RunOutcome::Skip, Transformed::Skip, None),
        Ok(Err(f)) => {
            let why = format!("{} ({})", f, f.code());
            (RunOutcome::Failed, failed(&why), Some(why))
        }
        Err(_) => {
            let why = "the sandbox's thread ended without an answer".to_owned();
            (RunOutcome::Failed, failed(&why), Some(why))
        }
    };
    shared
        .metrics
        .transformation_duration
        .with_label_values(&[outcome.as_str()])
        .observe(took);
    if let Some(why) = &error {
        tracing::info!(reason = %why, "the endpoint's transformation failed; the delivery fails");
    }
    record(shared, claimed, target, outcome, error.as_deref()).await;
    next
}

fn failed(why: &str) -> Transformed {
    Transformed::Failed(format!("transformation_failed: {why}"))
}

/// The program's request, in place of the Attempt's own.
fn into_attempt(attempt: &mut Attempt, r: &sandbox::Request) -> Result<(), String> {
    attempt.method = match r.method.as_str() {
        "PUT" => reqwest::Method::PUT,
        _ => reqwest::Method::POST,
    };
    attempt.url = url::Url::parse(&r.url).map_err(|e| format!("the URL is invalid: {e}"))?;
    attempt.body = bytes::Bytes::from(r.body.clone().into_bytes());
    attempt
        .extra
        .headers
        .extend(r.headers.iter().map(|(k, v)| (k.clone(), v.clone())));
    attempt.transformed = serde_json::to_string(r).ok();
    Ok(())
}

/// Writes the endpoint's last result when it changes: its outcome, or a failure's reason.
/// Never on every Attempt: a busy endpoint's row (or one whose program fails every Event the
/// same way) is not rewritten per Delivery. Best effort: the Delivery's own outcome is
/// written behind the Fence either way.
async fn record(
    shared: &Shared,
    claimed: &Claimed,
    target: &Target,
    outcome: RunOutcome,
    error: Option<&str>,
) {
    let now = format!("{}:{}", outcome.as_str(), error.unwrap_or(""));
    if target.transformation_last.as_deref() == Some(now.as_str()) {
        return;
    }
    let wrote = sqlx::query!(
        "UPDATE endpoints
         SET transformation_last = jsonb_build_object('outcome', $2::text, 'at', now(),
                                                      'delivery_id', $3::text, 'error', $4::text)
         WHERE id = $1",
        claimed.endpoint_id,
        outcome.as_str(),
        claimed.id,
        error
    )
    .execute(&shared.pool)
    .await;
    if let Err(e) = wrote {
        tracing::warn!(error = %e, "the transformation's last result was not recorded");
    }
}
