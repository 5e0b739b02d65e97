//! Retry ladders, declared once.
//!
//! Outgoing (your own Events): waits of 1m, 5m, 15m, 1h, 6h, 24h: seven Attempts over about
//! 31 h 21 m. Incoming (someone else's webhooks, forwarded): 1m, 5m, 15m, 1h, 6h with five
//! Attempts, so the waits used are 1m..1h (~81 min); the 6h rung serves a Destination that
//! raises its attempt count. Holding your own Event for a day is a reasonable promise; for a
//! provider's webhook, which the provider retries itself, a shorter give-up is the better one.
//!
//! Each wait is jittered to 50–150 % so Deliveries that failed together do not come back
//! together. Behind both ladders stands a hard cap (96 h outgoing, 24 h incoming) after which
//! anything outstanding is FAILED.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ladder {
    /// The wait after Attempt n (1-based) is `delays[n - 1]`; past the end, the last one.
    pub delays: Vec<Duration>,
    pub max_attempts: u32,
    /// No Attempt starts later than this after the Delivery was created.
    pub hard_cap: Duration,
}

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

impl Ladder {
    pub fn outgoing() -> Self {
        Self {
            delays: vec![
                secs(60),
                secs(300),
                secs(900),
                secs(3600),
                secs(21_600),
                secs(86_400),
            ],
            max_attempts: 7,
            hard_cap: secs(96 * 3600),
        }
    }

    pub fn incoming() -> Self {
        Self {
            delays: vec![secs(60), secs(300), secs(900), secs(3600), secs(21_600)],
            max_attempts: 5,
            hard_cap: secs(24 * 3600),
        }
    }

    /// The un-jittered wait after `attempts` Attempts were made, or None when the ladder is
    /// used up.
    pub fn base_delay(&self, attempts: u32) -> Option<Duration> {
        if attempts == 0 || attempts >= self.max_attempts {
            return None;
        }
        let idx = (attempts as usize - 1).min(self.delays.len().saturating_sub(1));
        self.delays.get(idx).copied()
    }

    /// The jittered wait: `base × (0.5 + jitter)`, with `jitter` drawn from [0, 1).
    pub fn delay(&self, attempts: u32, jitter: f64) -> Option<Duration> {
        let factor = 0.5 + jitter.clamp(0.0, 1.0);
        self.base_delay(attempts).map(|d| d.mul_f64(factor))
    }

    /// Parses `"60,300,900"` (seconds) for configuration overrides.
    pub fn parse_delays(raw: &str) -> Option<Vec<Duration>> {
        let delays: Option<Vec<Duration>> = raw
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|v| *v >= 0.0)
                    .map(Duration::from_secs_f64)
            })
            .collect();
        delays.filter(|d| !d.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outgoing_ladder_spans_about_31_hours() {
        let l = Ladder::outgoing();
        let total: Duration = (1..l.max_attempts).filter_map(|n| l.base_delay(n)).sum();
        assert_eq!(total, secs(60 + 300 + 900 + 3600 + 21_600 + 86_400));
        assert_eq!(total.as_secs() / 60, 31 * 60 + 21);
        assert_eq!(l.base_delay(7), None);
    }

    #[test]
    fn incoming_ladder_uses_four_waits_of_about_81_minutes() {
        let l = Ladder::incoming();
        let total: Duration = (1..l.max_attempts).filter_map(|n| l.base_delay(n)).sum();
        assert_eq!(total.as_secs() / 60, 81);
        assert_eq!(l.base_delay(5), None);
    }

    proptest::proptest! {
        #[test]
        fn jitter_stays_within_half_and_one_and_a_half(attempts in 1u32..7, jitter in 0.0f64..1.0) {
            let l = Ladder::outgoing();
            let base = l.base_delay(attempts).expect("rung");
            let d = l.delay(attempts, jitter).expect("rung");
            proptest::prop_assert!(d >= base.mul_f64(0.5) && d <= base.mul_f64(1.5));
        }
    }
}
