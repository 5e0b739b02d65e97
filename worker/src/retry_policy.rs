//! Every retry decision, in one place: how an Attempt's result reads ([`classify`]), which
//! ladder a Delivery climbs ([`RetryPolicy::ladder`]), what happens to it next
//! ([`RetryPolicy::decide`]) and what the endpoint's breaker and pause make of it
//! ([`RetryPolicy::breaker`]). Each is a pure function with a table test below; a new rule is
//! one more function and one more table. `fence::finalise` writes the decision.
//!
//! The rules:
//! - 2xx is delivered; 408, 429, 5xx, a timeout and a connect or reset error are worth
//!   another Attempt; other 4xx and 3xx are not (a person must change something); 410 also
//!   disables the endpoint; a target the SSRF guard refused is not (nothing was sent).
//! - The ladder is the direction's (outgoing or incoming, common/src/retry.rs) with the
//!   endpoint's own waits and Attempt count where it has them; the waits are jittered to
//!   50–150 %.
//! - `Retry-After` on a 429 or 503 is honoured, clamped between the ladder's next wait and
//!   twice it: a receiver may slow Railhook down, not push a Delivery past its hard cap or
//!   pull it into a hot loop.
//! - After a timeout or a 429 (a receiver that says it is overloaded), the next wait is at
//!   least the overload floor, whatever an endpoint's short ladder says.
//! - No Attempt starts past the ladder's hard cap after the Delivery's ladder began.
//! - A broker's acknowledgement is delivered; a broker that refused the message (no such
//!   topic, queue or exchange, access refused, too large) is not worth another Attempt; an
//!   unreachable or throttling broker is, and throttling counts as overload, as a 429 does
//!   ([`classify_broker`]).
//! - A 429 pauses the whole endpoint for its `Retry-After` (1 s without one), and a 503 with
//!   one does too; neither counts against the breaker as a failure would, except the 503.

use std::time::Duration;

use chrono::{DateTime, Utc};
use railhook_common::retry::{Ladder, LadderOverride};
use railhook_common::vocabulary::Direction;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};

use crate::attempt::{ErrorClass, Outcome, Report};
use crate::limits::Verdict;

/// What happens to a Delivery after an Attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Succeeded,
    /// Back to PENDING, due again after this wait.
    RetryAfter(Duration),
    /// To Failed Messages, with the reason a person will read.
    Failed {
        reason: String,
        disable_endpoint: bool,
    },
}

/// Where a Delivery stands on its ladder when an Attempt ends.
#[derive(Debug, Clone, Copy)]
pub struct Climb {
    /// Attempts made, this one included.
    pub attempts: u32,
    /// Time since the Delivery's ladder began.
    pub age: Duration,
    /// Drawn from [0, 1): where in 50–150 % the wait falls.
    pub jitter: f64,
}

/// The worker's retry settings; see the module doc for the rules.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    pub outgoing: Ladder,
    pub incoming: Ladder,
    /// The longest a 429 or 503 pauses an endpoint, and the longest any Deferral waits
    /// (`RAILHOOK_DEFERRAL_MAX_SECONDS`; `resolution::defer` reads it here too).
    pub deferral_max: Duration,
    /// The shortest wait after a timeout or a 429.
    pub overload_floor: Duration,
}

impl RetryPolicy {
    /// The direction's ladder, with the endpoint's own waits and Attempt count.
    pub fn ladder(&self, direction: Direction, own: &LadderOverride) -> Ladder {
        let base = match direction {
            Direction::Outgoing => &self.outgoing,
            Direction::Incoming => &self.incoming,
        };
        base.clone().with_override(own)
    }

    /// What happens to the Delivery after `report`.
    pub fn decide(&self, report: &Report, ladder: &Ladder, climb: Climb) -> Decision {
        match &report.outcome {
            Outcome::Delivered => Decision::Succeeded,
            Outcome::Failed { gone } => Decision::Failed {
                reason: failure_reason(*gone, report.status, report.error),
                disable_endpoint: *gone,
            },
            Outcome::Retry { retry_after } => {
                let Some(next) = ladder.delay(climb.attempts, climb.jitter) else {
                    return Decision::Failed {
                        reason: format!("gave up after {} attempts", climb.attempts),
                        disable_endpoint: false,
                    };
                };
                let mut wait = match retry_after {
                    Some(asked) => (*asked).clamp(next, next * 2),
                    None => next,
                };
                if overloaded(report) {
                    wait = wait.max(self.overload_floor);
                }
                if climb.age + wait > ladder.hard_cap {
                    return Decision::Failed {
                        reason: format!(
                            "the {} h hard cap would pass before the next attempt",
                            ladder.hard_cap.as_secs() / 3600
                        ),
                        disable_endpoint: false,
                    };
                }
                Decision::RetryAfter(wait)
            }
        }
    }

    /// How the endpoint's breaker reads `report`, and how long it pauses the whole endpoint
    /// (a 429, or a 503 with `Retry-After`).
    pub fn breaker(&self, report: &Report) -> (Verdict, Option<Duration>) {
        if !report.sent {
            return (Verdict::Neutral, None);
        }
        match &report.outcome {
            Outcome::Delivered => (Verdict::Ok, None),
            Outcome::Retry { retry_after }
                if report.status == Some(429)
                    || report.error == Some(ErrorClass::BrokerThrottled) =>
            {
                let pause = retry_after
                    .unwrap_or(Duration::from_secs(1))
                    .min(self.deferral_max);
                (Verdict::Neutral, Some(pause))
            }
            Outcome::Retry { retry_after } => {
                (Verdict::Fail, retry_after.map(|d| d.min(self.deferral_max)))
            }
            Outcome::Failed { .. } => (Verdict::Neutral, None),
        }
    }
}

/// A receiver that said it is overloaded: it timed out, or answered 429.
fn overloaded(report: &Report) -> bool {
    matches!(
        report.error,
        Some(ErrorClass::Timeout | ErrorClass::BrokerThrottled)
    ) || report.status == Some(429)
}

fn failure_reason(gone: bool, status: Option<u16>, error: Option<ErrorClass>) -> String {
    match (gone, status) {
        (true, _) => "the endpoint answered 410 Gone; it was disabled".to_owned(),
        (false, Some(code)) => {
            format!("the endpoint answered {code}, which a retry will not change")
        }
        (false, None) if error == Some(ErrorClass::BrokerRefused) => {
            "the broker refused the message (its answer is in the Attempt), which a retry \
             will not change"
                .to_owned()
        }
        (false, None) => "the target address is not allowed (private or non-global)".to_owned(),
    }
}

/// The one place an Attempt's result becomes an outcome (see the module doc).
pub fn classify(
    status: Option<StatusCode>,
    error: Option<ErrorClass>,
    headers: Option<&HeaderMap>,
) -> Outcome {
    match (status, error) {
        (Some(s), _) if s.is_success() => Outcome::Delivered,
        (Some(StatusCode::GONE), _) => Outcome::Failed { gone: true },
        (Some(s), _)
            if s == StatusCode::REQUEST_TIMEOUT
                || s == StatusCode::TOO_MANY_REQUESTS
                || s.is_server_error() =>
        {
            let honours =
                s == StatusCode::TOO_MANY_REQUESTS || s == StatusCode::SERVICE_UNAVAILABLE;
            let retry_after = if honours {
                headers.and_then(retry_after)
            } else {
                None
            };
            Outcome::Retry { retry_after }
        }
        (Some(_), _) => Outcome::Failed { gone: false },
        (None, Some(ErrorClass::TargetRefused)) => Outcome::Failed { gone: false },
        (None, _) => Outcome::Retry { retry_after: None },
    }
}

/// The one place a broker's answer becomes an outcome: acknowledged is delivered; refused
/// (no such topic, queue or exchange, access refused, too large) and an address the SSRF
/// guard refused are not worth another Attempt; unavailable and throttled are, a throttling
/// broker's hint honoured as a `Retry-After` is.
pub fn classify_broker(error: Option<ErrorClass>, retry_after: Option<Duration>) -> Outcome {
    match error {
        None => Outcome::Delivered,
        Some(ErrorClass::BrokerRefused | ErrorClass::TargetRefused) => {
            Outcome::Failed { gone: false }
        }
        Some(ErrorClass::BrokerThrottled) => Outcome::Retry { retry_after },
        Some(_) => Outcome::Retry { retry_after: None },
    }
}

/// `Retry-After` as seconds or an HTTP date.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let raw = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = raw.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = DateTime::parse_from_rfc2822(raw).ok()?;
    (at.with_timezone(&Utc) - Utc::now()).to_std().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            outgoing: Ladder::outgoing(),
            incoming: Ladder::incoming(),
            deferral_max: Duration::from_secs(600),
            overload_floor: Duration::from_secs(5),
        }
    }

    fn report(status: Option<u16>, error: Option<ErrorClass>, outcome: Outcome) -> Report {
        Report {
            started_at: Utc::now(),
            duration: Duration::ZERO,
            status,
            outcome,
            error,
            excerpt: None,
            sent: error != Some(ErrorClass::TargetRefused),
            request: None,
        }
    }

    const RETRY: Outcome = Outcome::Retry { retry_after: None };

    fn climb(attempts: u32, age: Duration) -> Climb {
        Climb {
            attempts,
            age,
            jitter: 0.5,
        }
    }

    fn outcome(code: u16) -> Outcome {
        classify(Some(StatusCode::from_u16(code).expect("code")), None, None)
    }

    #[test]
    fn one_function_classifies_every_status() {
        for code in [200, 201, 202, 204, 299] {
            assert_eq!(outcome(code), Outcome::Delivered, "{code}");
        }
        for code in [408, 429, 500, 502, 503, 504, 599] {
            assert!(matches!(outcome(code), Outcome::Retry { .. }), "{code}");
        }
        for code in [301, 302, 307, 400, 401, 403, 404, 409, 422] {
            assert_eq!(outcome(code), Outcome::Failed { gone: false }, "{code}");
        }
        assert_eq!(outcome(410), Outcome::Failed { gone: true });
        for class in [
            ErrorClass::Timeout,
            ErrorClass::Connect,
            ErrorClass::Reset,
            ErrorClass::Request,
        ] {
            assert!(matches!(
                classify(None, Some(class), None),
                Outcome::Retry { .. }
            ));
        }
        assert_eq!(
            classify(None, Some(ErrorClass::TargetRefused), None),
            Outcome::Failed { gone: false }
        );
    }

    #[test]
    fn a_brokers_answer_is_classified_in_one_place() {
        assert_eq!(classify_broker(None, None), Outcome::Delivered);
        for class in [ErrorClass::BrokerRefused, ErrorClass::TargetRefused] {
            assert_eq!(
                classify_broker(Some(class), None),
                Outcome::Failed { gone: false }
            );
        }
        assert_eq!(
            classify_broker(
                Some(ErrorClass::BrokerUnavailable),
                Some(Duration::from_secs(9))
            ),
            RETRY,
            "only throttling carries a hint"
        );
        let hint = Some(Duration::from_secs(4));
        assert_eq!(
            classify_broker(Some(ErrorClass::BrokerThrottled), hint),
            Outcome::Retry { retry_after: hint }
        );
        // Throttling is overload (the floor applies) and pauses the endpoint without
        // counting against the breaker; a refusal ends the Delivery with the broker's reason.
        let throttled = report(
            None,
            Some(ErrorClass::BrokerThrottled),
            Outcome::Retry { retry_after: None },
        );
        let p = policy();
        assert_eq!(
            p.breaker(&throttled),
            (Verdict::Neutral, Some(Duration::from_secs(1)))
        );
        let Decision::RetryAfter(wait) =
            p.decide(&throttled, &Ladder::outgoing(), climb(1, Duration::ZERO))
        else {
            panic!("a throttled Attempt is retried");
        };
        assert!(wait >= p.overload_floor);
        let refused = report(
            None,
            Some(ErrorClass::BrokerRefused),
            Outcome::Failed { gone: false },
        );
        let Decision::Failed { reason, .. } =
            p.decide(&refused, &Ladder::outgoing(), climb(1, Duration::ZERO))
        else {
            panic!("a refusal fails the Delivery");
        };
        assert!(reason.contains("broker refused"), "{reason}");
    }

    #[test]
    fn retry_after_is_read_only_on_429_and_503() {
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, HeaderValue::from_static("120"));
        let with = |code: u16| {
            classify(
                Some(StatusCode::from_u16(code).expect("code")),
                None,
                Some(&h),
            )
        };
        let asked = Outcome::Retry {
            retry_after: Some(Duration::from_secs(120)),
        };
        assert_eq!(with(429), asked);
        assert_eq!(with(503), asked);
        assert_eq!(with(500), RETRY);
        let mut date = HeaderMap::new();
        let later = (Utc::now() + chrono::Duration::seconds(90)).to_rfc2822();
        date.insert(RETRY_AFTER, HeaderValue::from_str(&later).expect("header"));
        let Outcome::Retry {
            retry_after: Some(d),
        } = classify(Some(StatusCode::TOO_MANY_REQUESTS), None, Some(&date))
        else {
            panic!("no retry-after");
        };
        assert!(d > Duration::from_secs(80) && d <= Duration::from_secs(90));
    }

    #[test]
    fn the_direction_and_the_endpoint_pick_the_ladder() {
        let p = policy();
        let none = LadderOverride::default();
        assert_eq!(p.ladder(Direction::Outgoing, &none), Ladder::outgoing());
        assert_eq!(p.ladder(Direction::Incoming, &none), Ladder::incoming());
        let own = LadderOverride::from_stored(Some("2,4"), Some(3)).expect("valid");
        let l = p.ladder(Direction::Incoming, &own);
        assert_eq!(
            l.delays,
            vec![Duration::from_secs(2), Duration::from_secs(4)]
        );
        assert_eq!(l.max_attempts, 3);
        assert_eq!(l.hard_cap, Ladder::incoming().hard_cap);
    }

    #[test]
    fn the_outgoing_ladder_gives_seven_attempts_then_fails() {
        let (p, l) = (policy(), Ladder::outgoing());
        let mut age = Duration::ZERO;
        for attempt in 1..7 {
            match p.decide(&report(Some(500), None, RETRY), &l, climb(attempt, age)) {
                Decision::RetryAfter(d) => age += d,
                other => panic!("attempt {attempt}: {other:?}"),
            }
        }
        assert!(matches!(
            p.decide(&report(Some(500), None, RETRY), &l, climb(7, age)),
            Decision::Failed { .. }
        ));
    }

    #[test]
    fn retry_after_is_clamped_between_next_and_twice_next() {
        let (p, l) = (policy(), Ladder::outgoing());
        let asked = |status, s| {
            let outcome = Outcome::Retry {
                retry_after: Some(Duration::from_secs(s)),
            };
            p.decide(
                &report(Some(status), None, outcome),
                &l,
                climb(1, Duration::ZERO),
            )
        };
        let secs = |s| Decision::RetryAfter(Duration::from_secs(s));
        assert_eq!(asked(429, 1), secs(60));
        assert_eq!(asked(429, 90), secs(90));
        assert_eq!(asked(503, 9999), secs(120));
    }

    #[test]
    fn an_overloaded_receiver_waits_at_least_the_floor() {
        let p = policy();
        let short = p.ladder(
            Direction::Outgoing,
            &LadderOverride::from_stored(Some("0.2"), Some(5)).expect("valid"),
        );
        let wait = |r: Report| p.decide(&r, &short, climb(1, Duration::ZERO));
        let ms = |m| Decision::RetryAfter(Duration::from_millis(m));
        // Table: (status, error) → wait.
        assert_eq!(
            wait(report(None, Some(ErrorClass::Timeout), RETRY)),
            ms(5_000)
        );
        assert_eq!(wait(report(Some(429), None, RETRY)), ms(5_000));
        assert_eq!(wait(report(Some(500), None, RETRY)), ms(200));
        assert_eq!(wait(report(Some(503), None, RETRY)), ms(200));
        assert_eq!(
            wait(report(None, Some(ErrorClass::Connect), RETRY)),
            ms(200)
        );
    }

    #[test]
    fn the_hard_cap_ends_retries() {
        let (p, l) = (policy(), Ladder::incoming());
        let old = Duration::from_secs(24 * 3600 - 30);
        assert!(matches!(
            p.decide(&report(Some(500), None, RETRY), &l, climb(1, old)),
            Decision::Failed { .. }
        ));
    }

    #[test]
    fn gone_disables_and_4xx_fails() {
        let (p, l) = (policy(), Ladder::outgoing());
        let decide = |status, gone| {
            p.decide(
                &report(Some(status), None, Outcome::Failed { gone }),
                &l,
                climb(1, Duration::ZERO),
            )
        };
        assert!(matches!(
            decide(410, true),
            Decision::Failed {
                disable_endpoint: true,
                ..
            }
        ));
        assert!(matches!(
            decide(400, false),
            Decision::Failed {
                disable_endpoint: false,
                ..
            }
        ));
    }

    #[test]
    fn a_429_pauses_the_endpoint_and_a_5xx_counts_against_the_breaker() {
        let p = policy();
        let asked = |s| Outcome::Retry {
            retry_after: Some(Duration::from_secs(s)),
        };
        let refused = report(
            None,
            Some(ErrorClass::TargetRefused),
            Outcome::Failed { gone: false },
        );
        let cases = [
            (
                report(Some(200), None, Outcome::Delivered),
                Verdict::Ok,
                None,
            ),
            (report(Some(429), None, RETRY), Verdict::Neutral, Some(1)),
            (
                report(Some(429), None, asked(30)),
                Verdict::Neutral,
                Some(30),
            ),
            (
                report(Some(429), None, asked(9_999)),
                Verdict::Neutral,
                Some(600),
            ),
            (report(Some(503), None, asked(20)), Verdict::Fail, Some(20)),
            (report(Some(500), None, RETRY), Verdict::Fail, None),
            (
                report(None, Some(ErrorClass::Timeout), RETRY),
                Verdict::Fail,
                None,
            ),
            (
                report(Some(404), None, Outcome::Failed { gone: false }),
                Verdict::Neutral,
                None,
            ),
            (refused, Verdict::Neutral, None),
        ];
        for (r, verdict, pause) in cases {
            let pause = pause.map(Duration::from_secs);
            assert_eq!(
                p.breaker(&r),
                (verdict, pause),
                "{:?} {:?}",
                r.status,
                r.error
            );
        }
    }
}
