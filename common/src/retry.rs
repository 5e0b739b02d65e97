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

    /// This ladder with an endpoint's own waits and Attempt count where it has them.
    pub fn with_override(mut self, own: &LadderOverride) -> Self {
        if let Some(delays) = &own.delays {
            self.delays = delays.waits().to_vec();
        }
        if let Some(n) = own.max_attempts {
            self.max_attempts = n;
        }
        self
    }
}

/// A ladder's waits as a person writes them: 1 to [`RetryDelays::MAX_WAITS`] waits of 0 s
/// to [`RetryDelays::MAX_WAIT`]. The API (`retry_delays_seconds`), the settings
/// (`RAILHOOK_RETRY_*_DELAYS`) and storage (`endpoints.retry_delays`, `"60,300,900"`) all
/// go through this type, so a bad ladder is refused where it comes in, never ignored later.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryDelays(Vec<Duration>);

/// Why waits were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must hold 1-20 waits of 0 to 604800 seconds, e.g. 60,300,900")]
pub struct BadDelays;

impl RetryDelays {
    pub const MAX_WAITS: usize = 20;
    pub const MAX_WAIT: Duration = secs(7 * 24 * 3600);

    /// Waits given in seconds (the API's form).
    pub fn from_seconds(raw: &[f64]) -> Result<Self, BadDelays> {
        let max = Self::MAX_WAIT.as_secs_f64();
        if !(1..=Self::MAX_WAITS).contains(&raw.len())
            || !raw.iter().all(|d| (0.0..=max).contains(d))
        {
            return Err(BadDelays);
        }
        Ok(Self(
            raw.iter().map(|d| Duration::from_secs_f64(*d)).collect(),
        ))
    }

    /// `"60,300,900"`: the settings' and the stored form.
    pub fn parse(raw: &str) -> Result<Self, BadDelays> {
        let seconds: Result<Vec<f64>, _> =
            raw.split(',').map(|s| s.trim().parse::<f64>()).collect();
        Self::from_seconds(&seconds.map_err(|_| BadDelays)?)
    }

    pub fn waits(&self) -> &[Duration] {
        &self.0
    }

    /// The waits in seconds (the API's form).
    pub fn seconds(&self) -> Vec<f64> {
        self.0.iter().map(Duration::as_secs_f64).collect()
    }
}

impl std::fmt::Display for RetryDelays {
    /// The stored form, which [`RetryDelays::parse`] reads back.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text: Vec<String> = self.seconds().iter().map(f64::to_string).collect();
        f.write_str(&text.join(","))
    }
}

/// An endpoint's own ladder: its waits and its Attempt count, each where it has one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LadderOverride {
    pub delays: Option<RetryDelays>,
    pub max_attempts: Option<u32>,
}

impl LadderOverride {
    /// From the endpoint row's columns. A stored ladder that does not parse (written around
    /// the API) is an error for the caller to report; it is never applied in part.
    pub fn from_stored(delays: Option<&str>, max_attempts: Option<i32>) -> Result<Self, BadDelays> {
        Ok(Self {
            delays: delays.map(RetryDelays::parse).transpose()?,
            max_attempts: max_attempts
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n > 0),
        })
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

        #[test]
        fn stored_waits_read_back_as_written(waits in proptest::collection::vec(0u32..604_800, 1..20)) {
            let seconds: Vec<f64> = waits.iter().map(|w| f64::from(*w) / 4.0).collect();
            let delays = RetryDelays::from_seconds(&seconds).expect("valid");
            proptest::prop_assert_eq!(RetryDelays::parse(&delays.to_string()), Ok(delays));
        }
    }

    #[test]
    fn bad_waits_are_refused_not_ignored() {
        for raw in [
            "",
            "60,",
            "sixty",
            "-1",
            "604801",
            &"1,".repeat(20).to_string(),
        ] {
            assert_eq!(RetryDelays::parse(raw), Err(BadDelays), "{raw:?}");
        }
        assert_eq!(
            LadderOverride::from_stored(Some("60,x"), Some(3)),
            Err(BadDelays)
        );
        let own = LadderOverride::from_stored(Some("1,2"), Some(3)).expect("valid");
        let l = Ladder::outgoing().with_override(&own);
        assert_eq!(l.delays, vec![secs(1), secs(2)]);
        assert_eq!((l.max_attempts, l.hard_cap), (3, secs(96 * 3600)));
        assert_eq!(
            Ladder::incoming().with_override(&LadderOverride::default()),
            Ladder::incoming()
        );
    }
}
