//! What happens to a Delivery after an Attempt: the pure decision, from the outcome, the
//! ladder and the Delivery's age. `fence::finalise` writes it.

use std::time::Duration;

use railhook_common::retry::Ladder;

use crate::attempt::Outcome;

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

/// `attempts` counts this Attempt; `age` is the Delivery's age now; `jitter` ∈ [0, 1).
///
/// `Retry-After` (429/503) is honoured but clamped between the ladder's next wait and twice
/// it: a receiver may slow Railhook down, not push a Delivery past its hard cap or pull it
/// forward into a hot loop.
pub fn decide(
    outcome: &Outcome,
    status: Option<u16>,
    attempts: u32,
    age: Duration,
    ladder: &Ladder,
    jitter: f64,
) -> Decision {
    match outcome {
        Outcome::Delivered => Decision::Succeeded,
        Outcome::Failed { gone } => Decision::Failed {
            reason: match (gone, status) {
                (true, _) => "the endpoint answered 410 Gone; it was disabled".to_owned(),
                (false, Some(code)) => {
                    format!("the endpoint answered {code}, which a retry will not change")
                }
                (false, None) => {
                    "the target address is not allowed (private or non-global)".to_owned()
                }
            },
            disable_endpoint: *gone,
        },
        Outcome::Retry { retry_after } => {
            let Some(next) = ladder.delay(attempts, jitter) else {
                return Decision::Failed {
                    reason: format!("gave up after {attempts} attempts"),
                    disable_endpoint: false,
                };
            };
            let wait = match retry_after {
                Some(asked) => (*asked).clamp(next, next * 2),
                None => next,
            };
            if age + wait > ladder.hard_cap {
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

#[cfg(test)]
mod tests {
    use super::*;

    const RETRY: Outcome = Outcome::Retry { retry_after: None };

    #[test]
    fn the_outgoing_ladder_gives_seven_attempts_then_fails() {
        let l = Ladder::outgoing();
        let mut age = Duration::ZERO;
        for attempt in 1..7 {
            match decide(&RETRY, Some(500), attempt, age, &l, 0.5) {
                Decision::RetryAfter(d) => age += d,
                other => panic!("attempt {attempt}: {other:?}"),
            }
        }
        assert!(matches!(
            decide(&RETRY, Some(500), 7, age, &l, 0.5),
            Decision::Failed { .. }
        ));
    }

    #[test]
    fn retry_after_is_clamped_between_next_and_twice_next() {
        let l = Ladder::outgoing();
        let asked = |s| Outcome::Retry {
            retry_after: Some(Duration::from_secs(s)),
        };
        assert_eq!(
            decide(&asked(1), Some(429), 1, Duration::ZERO, &l, 0.5),
            Decision::RetryAfter(Duration::from_secs(60))
        );
        assert_eq!(
            decide(&asked(90), Some(429), 1, Duration::ZERO, &l, 0.5),
            Decision::RetryAfter(Duration::from_secs(90))
        );
        assert_eq!(
            decide(&asked(9999), Some(503), 1, Duration::ZERO, &l, 0.5),
            Decision::RetryAfter(Duration::from_secs(120))
        );
    }

    #[test]
    fn the_hard_cap_ends_retries() {
        let l = Ladder::incoming();
        let old = Duration::from_secs(24 * 3600 - 30);
        assert!(matches!(
            decide(&RETRY, Some(500), 1, old, &l, 0.5),
            Decision::Failed { .. }
        ));
    }

    #[test]
    fn gone_disables_and_4xx_fails() {
        let l = Ladder::outgoing();
        assert!(matches!(
            decide(
                &Outcome::Failed { gone: true },
                Some(410),
                1,
                Duration::ZERO,
                &l,
                0.5
            ),
            Decision::Failed {
                disable_endpoint: true,
                ..
            }
        ));
        assert!(matches!(
            decide(
                &Outcome::Failed { gone: false },
                Some(400),
                1,
                Duration::ZERO,
                &l,
                0.5
            ),
            Decision::Failed {
                disable_endpoint: false,
                ..
            }
        ));
    }
}
