//! One claimed Delivery's turn, off the consumer's loop: the ordering gate and the
//! endpoint's limits (or a Deferral), the re-stamp of an aged Claim, the Attempt, the
//! decision, the outcome behind the Fence, and the ordering hand-off to the next Delivery.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use railhook_common::Word;
use railhook_common::endpoint_auth::{self, Authentication, ClientCertificate};
use railhook_common::headers::Extra;
use railhook_common::metrics_http::FinalOutcome;
use railhook_common::retry::{Ladder, LadderOverride};
use railhook_common::signing::SigningKey;
use railhook_common::trace_context::{self, TraceParent};
use railhook_common::transport::{TransportSettings, sealing_id};
use railhook_common::vocabulary::InternalError;
use tracing::Instrument;

use crate::attempt::{Attempt, Report};
use crate::claim::{self, Claimed};
use crate::fence;
use crate::limits::{Admission, BreakerState, EndpointLimits, Reason, Verdict, rate_hold};
use crate::ordering::{self, Gate};
use crate::resolution::{Released, Resolved, defer, finalise_with_retry, give_up, skip};
use crate::retry_policy::{Climb, Decision};
use crate::runtime::Shared;
use crate::transform::{self, Transformed};

/// Delivers a claimed Delivery, then, while each one resolved and released the next parked
/// ordered Delivery of its endpoint, claims that one and delivers it too, in the same task
/// and under the same permit (the ordering hand-off, ordering.rs). A hand-off that loses its
/// Claim (another worker took the Outbox hint first) simply ends the chain here.
pub(crate) async fn turns(shared: &Shared, claimed: Claimed, target: claim::Target) {
    let mut next = Some((claimed, target));
    while let Some((claimed, target)) = next.take() {
        let id = claimed.id.clone();
        if let Ok(mut running) = shared.running.lock() {
            running.insert(id.clone(), claimed.token);
        }
        // One span per Attempt, with the ids as fields (never as metric labels): every log
        // line of the Claim's turn carries them.
        let span = tracing::info_span!(
            "attempt",
            delivery_id = %claimed.id,
            event_id = %claimed.event_id,
            endpoint_id = %claimed.endpoint_id,
            attempt = claimed.attempt_count + 1,
            direction = %claimed.direction,
        );
        // The Attempt continues the Event's trace: its span's parent is the context stored
        // with the Event (the ingest request), whichever hint brought the Delivery here.
        if let Some(parent) = target.traceparent.as_deref().and_then(TraceParent::parse) {
            trace_context::adopt(&span, &parent, target.tracestate.as_deref());
        }
        let released = deliver(shared, claimed, target).instrument(span).await;
        if let Ok(mut running) = shared.running.lock() {
            running.remove(&id);
        }
        let Some(Released::HandedOff(taken)) = released else {
            return;
        };
        let (claimed, target) = *taken;
        if shared.draining.load(Ordering::SeqCst) {
            // Told to stop after the hand-off was claimed: give it back at once.
            let claims = [(claimed.id, claimed.token)];
            let release = railhook_common::db::answered(
                railhook_common::db::ANSWER_WITHIN,
                "a hand-off's release",
                fence::release(&shared.pool, &claims),
            );
            if let Err(e) = release.await {
                tracing::warn!(error = %e, "hand-off not given back; the processing sweep will");
            }
            return;
        }
        shared.metrics.ordering_handoffs.inc();
        next = Some((claimed, target));
    }
}

async fn breaker_changed(shared: &Shared, endpoint_id: &str, state: BreakerState) {
    shared
        .metrics
        .breaker_transitions
        .with_label_values(&[state.as_str()])
        .inc();
    tracing::info!(
        endpoint_id,
        state = state.as_str(),
        "circuit breaker changed"
    );
    let write = crate::limits::set_breaker(&shared.pool, endpoint_id, state.as_str());
    if let Err(e) = railhook_common::db::answered(
        railhook_common::db::ANSWER_WITHIN,
        "a breaker's state",
        write,
    )
    .await
    {
        tracing::warn!(error = %e, "breaker state not mirrored to the endpoint row");
    }
}

/// What the checks before a request decided for one claimed Delivery.
enum Admitted {
    /// Send it. `lease`: the concurrency lease to give back after the Attempt (none when the
    /// endpoint has no concurrency limit, or Redis did not answer and the limits failed open).
    Send { lease: Option<String> },
    /// Deferred or parked (the Claim is released), or the gate failed and the sweep will
    /// hand it back: nothing is sent.
    Held,
}

/// The application's rate (docs/APPLICATIONS.md), before the endpoint's own checks: a near
/// slot is waited for here, as for the endpoint's rate; a far one is a `rate` Deferral.
/// `false`: deferred. Redis away: fail open, as the endpoint's checks do.
async fn admit_application(
    shared: &Shared,
    claimed: &mut Claimed,
    application: &str,
    rate: u32,
) -> bool {
    let hold = rate_hold(rate);
    for _ in 0..4 {
        match shared.limits.admit_application(application, rate).await {
            Admission::Defer { wait, .. } if wait <= hold => tokio::time::sleep(wait).await,
            Admission::Defer { reason, wait } => {
                defer(shared, claimed, reason, wait.saturating_sub(hold)).await;
                return false;
            }
            Admission::Go { .. } => return true,
            Admission::Unavailable => {
                shared.metrics.limits_unavailable.inc();
                return true;
            }
        }
    }
    defer(shared, claimed, Reason::Rate, hold).await;
    false
}

/// The checks before a request is built: the ordering gate, the application's rate, then
/// the endpoint's breaker and limits.
async fn admit(shared: &Shared, claimed: &mut Claimed, limits: &EndpointLimits) -> Admitted {
    if claimed.ordered && !claimed.gated {
        let gate = railhook_common::db::answered(
            railhook_common::db::ANSWER_WITHIN,
            "the ordering gate",
            ordering::gate(&shared.pool, claimed, shared.gap_timeout),
        );
        match gate.await {
            Ok(Gate::Go { sequence_number }) => claimed.sequence_number = Some(sequence_number),
            Ok(Gate::GoAfterGap { sequence_number }) => {
                shared.metrics.ordering_gap_timeouts.inc();
                claimed.sequence_number = Some(sequence_number);
            }
            Ok(Gate::Parked) => {
                shared
                    .metrics
                    .deferrals
                    .with_label_values(&[Reason::Ordering.as_str()])
                    .inc();
                return Admitted::Held;
            }
            Err(e) => {
                tracing::warn!(error = %e, delivery_id = %claimed.id, "ordering gate failed; the sweep will hand the delivery back");
                return Admitted::Held;
            }
        }
    }
    if let Some((application, rate)) = &limits.application_rate
        && !admit_application(shared, claimed, application, *rate).await
    {
        return Admitted::Held;
    }
    let lease_token = claimed.token.to_string();
    let hold = rate_hold(limits.rate_per_second.unwrap_or(0));
    // A reserved rate slot within `hold` is waited for here (the Claim is held, nothing is
    // in flight), then admitted again: the reservation redeems at its slot. Three waits at
    // most; a slot that moved farther (another check refused meanwhile) is deferred.
    let mut waits = 0;
    loop {
        match shared
            .limits
            .admit(&claimed.endpoint_id, &claimed.id, &lease_token, limits)
            .await
        {
            Admission::Go { lease, changed } => {
                if let Some(state) = changed {
                    breaker_changed(shared, &claimed.endpoint_id, state).await;
                }
                return Admitted::Send { lease };
            }
            Admission::Defer {
                reason: Reason::Rate,
                wait,
            } if wait <= hold && waits < 3 => {
                waits += 1;
                tokio::time::sleep(wait).await;
            }
            Admission::Defer { reason, wait } => {
                // A far rate slot: come back `hold` early and wait out the rest here.
                let wait = if reason == Reason::Rate {
                    wait.saturating_sub(hold)
                } else {
                    wait
                };
                defer(shared, claimed, reason, wait).await;
                return Admitted::Held;
            }
            Admission::Unavailable => {
                shared.metrics.limits_unavailable.inc();
                return Admitted::Send { lease: None };
            }
        }
    }
}

/// One claimed Delivery, in four stages: [`prepare`] (is there anything to send, and
/// what), [`admit`] (the ordering gate and the endpoint's limits, or a Deferral), [`send`]
/// (the re-stamp through the Fence, then the Attempt) and [`conclude`] (the decision,
/// written behind the Fence, and the final-state metrics). Returns the ordered Delivery
/// its resolution released, if any.
async fn deliver(shared: &Shared, mut claimed: Claimed, target: claim::Target) -> Option<Released> {
    let mut ready = match prepare(shared, &claimed, target).await {
        Ok(ready) => ready,
        Err(ended) => return ended,
    };
    let Admitted::Send { lease } = admit(shared, &mut claimed, &ready.limits).await else {
        return None;
    };
    ready.attempt.sequence_number = claimed.sequence_number;
    let report = send(shared, &claimed, &ready.attempt, lease.as_deref()).await?;
    conclude(shared, &claimed, &report, &ready).await
}

/// What a claimed Delivery will send, and the endpoint's terms for it.
struct Ready {
    attempt: Attempt,
    limits: EndpointLimits,
    /// The endpoint's own ladder as stored: read by [`conclude`] only, after a request.
    retry_delays: Option<String>,
    max_attempts: Option<i32>,
    /// When the Event committed: the start of the delivery latency.
    event_created_at: chrono::DateTime<chrono::Utc>,
}

/// Stage 1: whether anything can be sent, and what. `Err` when nothing can: the Delivery
/// ended FAILED (with what that released) or was deferred.
async fn prepare(
    shared: &Shared,
    claimed: &Claimed,
    mut target: claim::Target,
) -> Result<Ready, Option<Released>> {
    if !target.enabled {
        return Err(give_up(shared, claimed, "the endpoint is disabled or deleted").await);
    }
    // The Claim returns a Delivery whose Event row is missing rather than leave it
    // PROCESSING under a token nobody holds (claim.rs); it ends here.
    if target.event_gone {
        return Err(give_up(shared, claimed, "event_gone").await);
    }
    // The expunge fails every Delivery not sent yet in its own transaction; this guards
    // any path that could make one PENDING again.
    if target.expunged {
        return Err(give_up(shared, claimed, "payload_expunged").await);
    }
    if !open_secrets(shared, claimed, &mut target) {
        let defer = fence::defer(&shared.pool, claimed, SECRET_UNAVAILABLE_WAIT);
        let _ =
            railhook_common::db::answered(railhook_common::db::ANSWER_WITHIN, "a Deferral", defer)
                .await;
        return Err(None);
    }
    let Some(mut attempt) = build_attempt(claimed, &target) else {
        return Err(give_up(
            shared,
            claimed,
            "the endpoint's URL, secret or transport settings are invalid",
        )
        .await);
    };
    // The endpoint's transformation, if it has one on: what it returns is what is sent.
    match crate::transform::apply(shared, claimed, &target, &mut attempt).await {
        Transformed::Send => {}
        Transformed::Skip => return Err(skip(shared, claimed, transform::SKIPPED).await),
        Transformed::Failed(reason) => return Err(give_up(shared, claimed, &reason).await),
    }
    attempt.timeout = attempt.timeout.min(shared.endpoint_timeout_max);
    // Inside the Attempt's span: the receiver's parent is this Attempt.
    let stored = target.traceparent.as_deref().and_then(TraceParent::parse);
    attempt.traceparent =
        Some(trace_context::handed_on(&tracing::Span::current(), stored.as_ref()).to_string());
    attempt.tracestate = target.tracestate.clone();
    let positive = |v: Option<i32>| v.and_then(|n| u32::try_from(n).ok()).filter(|n| *n > 0);
    Ok(Ready {
        retry_delays: target.retry_delays.take(),
        max_attempts: target.max_attempts,
        limits: EndpointLimits {
            rate_per_second: positive(target.rate_limit_per_second),
            burst: positive(target.rate_limit_burst),
            max_concurrency: positive(target.max_concurrency),
            application_rate: target
                .application_id
                .clone()
                .zip(positive(target.application_rate_limit)),
            timeout: attempt.timeout,
        },
        attempt,
        event_created_at: target.event_created_at,
    })
}

/// Opens the endpoint's sealed secrets and header values in place. Secrets (and header
/// values) are stored sealed; a worker started without the key that sealed one defers the
/// Delivery (never an Attempt, never FAILED) and says why, once per Claim.
fn open_secrets(shared: &Shared, claimed: &Claimed, target: &mut claim::Target) -> bool {
    let opened = shared
        .keyring
        .open_pair(
            &claimed.endpoint_id,
            &target.secret,
            target.previous_secret.as_deref(),
        )
        .and_then(|pair| {
            let headers = shared
                .keyring
                .open_headers(&claimed.endpoint_id, &target.headers)?;
            // Each optional sealed value, under the name it was sealed for.
            let open = |name: String, sealed: &Option<String>| {
                sealed
                    .as_deref()
                    .map(|s| shared.keyring.open(&name, s))
                    .transpose()
            };
            let id = &claimed.endpoint_id;
            let transport = open(sealing_id(id), &target.transport_secret)?;
            let authentication =
                open(endpoint_auth::sealing_id(id), &target.authentication_secret)?;
            let certificate = open(
                endpoint_auth::certificate_sealing_id(id),
                &target.client_certificate_secret,
            )?;
            Ok((pair, headers, transport, authentication, certificate))
        });
    match opened {
        Ok(((secret, previous), headers, transport, authentication, certificate)) => {
            (target.secret, target.previous_secret, target.headers) = (secret, previous, headers);
            target.transport_secret = transport;
            target.authentication_secret = authentication;
            target.client_certificate_secret = certificate;
            true
        }
        Err(e) => {
            tracing::error!(delivery = %claimed.id, endpoint = %claimed.endpoint_id, error = %e,
                "cannot open the endpoint's signing secret; deferred");
            shared
                .metrics
                .internal_errors
                .with_label_values(&[InternalError::SecretUnavailable.as_str()])
                .inc();
            false
        }
    }
}

/// Stage 3: the re-stamp, then the Attempt; its result feeds the endpoint's breaker and
/// pause. `None` when the Claim was lost before the request started (nothing was sent).
async fn send(
    shared: &Shared,
    claimed: &Claimed,
    attempt: &Attempt,
    lease: Option<&str>,
) -> Option<Report> {
    // Invariant: a request starts only under a Claim stamped through the Fence at most
    // FRESH_CLAIM before it: the Claim itself, or a re-stamp (review #34 item 7; issue #54).
    // Between the Claim and here the turn may have waited (the gate, a rate hold, Redis),
    // and meanwhile an expunge may have failed the Delivery, the sweep taken it back or a
    // drain released it: each clears the token, so the re-stamp matches nothing and the old
    // payload is not sent. The re-stamp also restarts the processing window, so the request
    // and its finalise fit inside it (review #19 item 1; configuration refuses a window that
    // cannot hold the longest request and [`railhook_common::config::PROCESSING_MARGIN`]).
    //
    // A Claim younger than FRESH_CLAIM needs neither: the sweep cannot have taken it (its
    // window is minutes), a drain aborts turns before it releases their Claims, the
    // processing window has lost at most FRESH_CLAIM of the PROCESSING_MARGIN (5 s) it keeps
    // beyond the longest request, and an expunge committing in those milliseconds races the
    // request as one committing just after a re-stamp always did. That re-stamp was one
    // transaction, one commit and one WAL flush per delivery (issue #54: 0.17 ms of statement
    // alone at 300/s), for a window it narrowed from FRESH_CLAIM to the re-stamp's own.
    let kept = if claimed.claimed_at.elapsed() <= FRESH_CLAIM {
        shared.metrics.claims_fresh.inc();
        Ok(true)
    } else {
        railhook_common::db::answered(
            railhook_common::db::ANSWER_WITHIN,
            "a re-stamp",
            fence::restamp(&shared.pool, claimed),
        )
        .await
    };
    if !matches!(kept, Ok(true)) {
        if let Err(e) = &kept {
            tracing::warn!(error = %e, "claim not re-stamped; not sending, the sweep will hand it back");
        } else {
            shared.metrics.fence_rejections.inc();
            tracing::info!("claim lost before its request started; not sending");
        }
        let endpoint = &claimed.endpoint_id;
        shared
            .limits
            .record(endpoint, lease, Verdict::Neutral, None)
            .await;
        return None;
    }
    let mut report = shared.transports.send(attempt).await;
    report.request.clone_from(&attempt.transformed);
    let (verdict, pause) = shared.policy.breaker(&report);
    let endpoint = &claimed.endpoint_id;
    if let Some(state) = shared.limits.record(endpoint, lease, verdict, pause).await {
        breaker_changed(shared, endpoint, state).await;
    }
    if report.sent {
        let outcome = report.outcome.recorded().label();
        shared.metrics.attempts.with_label_values(&[outcome]).inc();
    }
    shared
        .metrics
        .attempt_duration
        .with_label_values(&[report.result().as_str()])
        .observe(report.duration.as_secs_f64());
    Some(report)
}

/// Stage 4: the retry policy's decision, written behind the Fence, and the metrics of the
/// final state it reached (the one place they are counted for a sent Attempt).
async fn conclude(
    shared: &Shared,
    claimed: &Claimed,
    report: &Report,
    ready: &Ready,
) -> Option<Released> {
    let climb = Climb {
        attempts: u32::try_from(claimed.attempt_count).unwrap_or(0) + 1,
        age: (chrono::Utc::now() - claimed.ladder_started_at)
            .to_std()
            .unwrap_or_default(),
        jitter: rand::random::<f64>(),
    };
    let ladder = endpoint_ladder(shared, claimed, ready);
    let decision = shared.policy.decide(report, &ladder, climb);
    let metrics = &shared.metrics;
    match finalise_with_retry(shared, claimed, report, &decision).await {
        Some(Resolved {
            wrote: true,
            released,
        }) => {
            let reached = match decision {
                Decision::Succeeded => Some(FinalOutcome::Succeeded),
                Decision::Failed { .. } => Some(FinalOutcome::Failed),
                Decision::RetryAfter(_) => None,
            };
            if reached == Some(FinalOutcome::Succeeded) {
                let since_commit = chrono::Utc::now() - ready.event_created_at;
                let seconds = since_commit.to_std().unwrap_or_default().as_secs_f64();
                metrics.delivery_latency.observe(seconds);
            }
            if reached == Some(FinalOutcome::Failed) {
                metrics.failed_messages.inc();
            }
            if let Some(outcome) = reached {
                let family = &metrics.deliveries_final;
                family.with_label_values(&[outcome.as_str()]).inc();
            }
            released
        }
        Some(Resolved { wrote: false, .. }) => {
            metrics.fence_rejections.inc();
            tracing::info!(delivery_id = %claimed.id, "outcome fenced out: the claim was lost");
            None
        }
        None => {
            let kind = InternalError::OutcomeNotWritten.as_str();
            metrics.internal_errors.with_label_values(&[kind]).inc();
            tracing::error!(delivery_id = %claimed.id, "outcome not written; the sweep will hand the delivery back");
            None
        }
    }
}

/// The direction's ladder with the endpoint's own (retry_policy.rs). A stored override that
/// does not parse was written around the API: it is reported, and the direction's ladder
/// is used whole.
fn endpoint_ladder(shared: &Shared, claimed: &Claimed, ready: &Ready) -> Ladder {
    let own = LadderOverride::from_stored(ready.retry_delays.as_deref(), ready.max_attempts)
        .unwrap_or_else(|e| {
            tracing::error!(endpoint = %claimed.endpoint_id, error = %e,
                "the endpoint's stored retry ladder is invalid; the default ladder applies");
            let kind = InternalError::LadderOverrideInvalid.as_str();
            shared
                .metrics
                .internal_errors
                .with_label_values(&[kind])
                .inc();
            LadderOverride::default()
        });
    shared.policy.ladder(claimed.direction, &own)
}

/// The age under which a Claim is its own re-stamp (see [`send`]).
pub(crate) const FRESH_CLAIM: Duration = Duration::from_millis(100);

/// How long a Delivery whose secret this worker cannot open waits before another try.
const SECRET_UNAVAILABLE_WAIT: Duration = Duration::from_secs(60);

fn build_attempt(claimed: &Claimed, target: &claim::Target) -> Option<Attempt> {
    let mut keys = vec![SigningKey::parse(&target.secret).ok()?];
    if let Some(prev) = &target.previous_secret {
        keys.push(SigningKey::parse(prev).ok()?);
    }
    let mut extra = Extra::merge(target.forward_headers.as_ref(), Some(&target.headers));
    // The endpoint's authentication (opened by `open_secrets`): its Authorization header
    // replaces any other (the API refuses a custom one beside it; a forwarded one yields).
    // OAuth2's bearer token is fetched by the HTTP transport (transport/oauth.rs).
    let mut oauth = None;
    if let Some(opened) = &target.authentication_secret {
        let auth: Authentication = serde_json::from_str(opened).ok()?;
        extra
            .headers
            .retain(|(name, _)| !name.eq_ignore_ascii_case("authorization"));
        match auth {
            Authentication::OAuth2ClientCredentials(client) => oauth = Some(Arc::new(client)),
            basic => extra
                .headers
                .push(("authorization".to_owned(), basic.basic_header()?)),
        }
    }
    let identity = match &target.client_certificate_secret {
        Some(opened) => Some(Arc::new(
            serde_json::from_str::<ClientCertificate>(opened).ok()?,
        )),
        None => None,
    };
    // Opened by `open_secrets`; settings that do not parse were written around the API.
    let via = match &target.transport_secret {
        Some(opened) => Some(Arc::new(
            serde_json::from_str::<TransportSettings>(opened).ok()?,
        )),
        None => None,
    };
    let body = match &target.raw_body {
        Some(raw) => bytes::Bytes::from(raw.clone()),
        None => bytes::Bytes::from(target.payload.clone().into_bytes()),
    };
    Some(Attempt {
        delivery_id: claimed.id.clone(),
        event_id: claimed.event_id.clone(),
        event_type: target.event_type.clone(),
        method: reqwest::Method::POST,
        url: url::Url::parse(&target.url).ok()?,
        body,
        extra,
        keys,
        timeout: Duration::from_millis(u64::try_from(target.timeout_ms).unwrap_or(30_000)),
        sequence_number: claimed.sequence_number,
        traceparent: None,
        tracestate: None,
        endpoint_id: claimed.endpoint_id.clone(),
        application_id: target.application_id.clone(),
        via,
        identity,
        oauth,
        transformed: None,
    })
}
