//! Per-endpoint protection shared by every worker process: the circuit breaker, the
//! concurrency limit and the rate limit, kept in Redis and checked before a request is built.
//!
//! A refusal here is a **Deferral**, not an Attempt: the caller releases the Claim and puts
//! the Delivery back with a `next_retry_at`, and `attempt_count` does not move. That is what
//! lets an endpoint that was broken or throttled for an hour come out of it with its retry
//! ladder intact.
//!
//! Each check is one Lua script (atomic in Redis, one round trip), using Redis' own clock so
//! that workers on different machines agree on time:
//!
//! - **Breaker** (`rh:ep:{id}:cb`, a hash): `closed` → `open` after
//!   `consecutive_failures` failures in a row, or a failure rate of at least `failure_rate`
//!   over at least `min_requests` Attempts inside a tumbling window of `window_ms`. While
//!   open, everything is deferred until `cooldown_ms` has passed; then `half_open` lets one
//!   probe through (the probe holds a lease of `probe_ms`, so a worker that dies mid-probe
//!   does not wedge the endpoint). The probe's success closes the breaker, its failure opens
//!   it again. Only retryable failures count (5xx, 408, timeouts, connection errors); a 4xx
//!   means the endpoint is up.
//! - **Throttle** (`rh:ep:{id}:th`): a 429 with `Retry-After` pauses the whole endpoint, not
//!   only the Delivery that got it.
//! - **Concurrency** (`rh:ep:{id}:cc`, a sorted set of leases scored by expiry): at most
//!   `max_concurrency` requests in flight across all workers; a lease expires by itself after
//!   the endpoint's timeout and a margin, so a killed worker does not leak a slot.
//! - **Rate** (`rh:ep:{id}:rl`, GCRA): `rate` requests/s with a burst. A refused Delivery
//!   *reserves* the next free slot (`rh:rsv:{delivery}`); when it comes back it redeems the
//!   reservation instead of queueing again (one that comes back early is told the time left
//!   and keeps its slot), so a backlog drains at the configured rate instead of churning.
//!   A slot close enough ([`rate_hold`]) is waited for in the worker, holding the Claim,
//!   and a farther one is deferred to come back that much early: the request then leaves at
//!   its slot, not at the retry scheduler's next tick, so slots that came due during one
//!   tick do not reach the receiver together.
//!
//! If Redis cannot be reached the checks fail open (the Delivery goes) and
//! `railhook_worker_limits_unavailable_total` counts it: limits protect receivers, they must
//! not stop deliveries.

use std::sync::Arc;
use std::time::Duration;

use railhook_common::redis_client::{Lazy, RedisClient};
use sqlx::PgPool;

const ADMIT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local maxc = tonumber(ARGV[3])
local lease_ms = tonumber(ARGV[4])
local token = ARGV[5]
local cooldown = tonumber(ARGV[6])
local probe_ms = tonumber(ARGV[7])

local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
local probe = false
if state == 'open' then
  local opened = tonumber(redis.call('HGET', KEYS[1], 'opened_at') or '0')
  if now < opened + cooldown then return {'breaker', opened + cooldown - now, ''} end
  probe = true
elseif state == 'half_open' then
  local pu = tonumber(redis.call('HGET', KEYS[1], 'probe_until') or '0')
  if pu > now then return {'breaker', pu - now, ''} end
  probe = true
end

local th = tonumber(redis.call('GET', KEYS[4]) or '0')
if th > now then return {'throttled', th - now, ''} end

if maxc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  if redis.call('ZCARD', KEYS[3]) >= maxc then return {'concurrency', 0, ''} end
end

if rate > 0 then
  local interval = 1000 / rate
  local tolerance = interval * (burst - 1)
  local reserved = tonumber(redis.call('GET', KEYS[5]) or '-1')
  if reserved >= 0 and reserved <= now + 50 then
    redis.call('DEL', KEYS[5])
  elseif reserved >= 0 then
    return {'rate', reserved - now, ''}
  else
    local tat = tonumber(redis.call('GET', KEYS[2]) or '0')
    if tat < now then tat = now end
    local ttl = math.ceil(tat + interval - now) + 1000
    redis.call('SET', KEYS[2], tostring(tat + interval), 'PX', ttl)
    if tat - now > tolerance then
      local slot = math.ceil(tat - tolerance)
      redis.call('SET', KEYS[5], tostring(slot), 'PX', slot - now + 600000)
      return {'rate', slot - now, ''}
    end
  end
end

local changed = ''
if probe then
  if state == 'open' then changed = 'half_open' end
  redis.call('HSET', KEYS[1], 'state', 'half_open', 'probe_until', now + probe_ms)
  redis.call('PEXPIRE', KEYS[1], 604800000)
end
if maxc > 0 then
  redis.call('ZADD', KEYS[3], now + lease_ms, token)
  redis.call('PEXPIRE', KEYS[3], lease_ms + 60000)
end
return {'go', 0, changed}
"#;

/// An application's rate (all of its endpoints together): a GCRA bucket of one second's
/// burst, taken only when it has room. Answers the wait in ms, 0 when taken. Its own key
/// (an application's endpoints live in many cluster slots), so it is a call of its own
/// before the endpoint's; a token taken here for a Delivery the endpoint then defers is
/// not given back, which can only make the application's rate stricter, never looser.
const APPLICATION_RATE: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate = tonumber(ARGV[1])
local interval = 1000 / rate
local tolerance = interval * (rate - 1)
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
if tat < now then tat = now end
if tat - now > tolerance then return math.ceil(tat - tolerance - now) end
redis.call('SET', KEYS[1], tostring(tat + interval), 'PX', math.ceil(tat + interval - now) + 1000)
return 0
"#;

const RECORD: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local token = ARGV[1]
local result = ARGV[2]
local throttle_ms = tonumber(ARGV[3])
local threshold = tonumber(ARGV[4])
local rate = tonumber(ARGV[5])
local min_requests = tonumber(ARGV[6])
local window = tonumber(ARGV[7])

if token ~= '' then redis.call('ZREM', KEYS[2], token) end
if throttle_ms > 0 then redis.call('SET', KEYS[3], tostring(now + throttle_ms), 'PX', throttle_ms) end
if result == 'neutral' then return '' end

local state = redis.call('HGET', KEYS[1], 'state') or 'closed'
local ws = tonumber(redis.call('HGET', KEYS[1], 'win_start') or '0')
if now - ws > window then
  redis.call('HSET', KEYS[1], 'win_start', now, 'win_total', 0, 'win_fail', 0)
end
redis.call('PEXPIRE', KEYS[1], 604800000)
redis.call('HINCRBY', KEYS[1], 'win_total', 1)
if result == 'ok' then
  redis.call('HSET', KEYS[1], 'consecutive', 0)
  if state ~= 'closed' then
    redis.call('HSET', KEYS[1], 'state', 'closed', 'probe_until', 0)
    return 'closed'
  end
  return ''
end
local fails = redis.call('HINCRBY', KEYS[1], 'win_fail', 1)
local consecutive = redis.call('HINCRBY', KEYS[1], 'consecutive', 1)
local total = tonumber(redis.call('HGET', KEYS[1], 'win_total'))
if state == 'open' then return '' end
if state == 'half_open' or consecutive >= threshold
   or (total >= min_requests and fails / total >= rate) then
  redis.call('HSET', KEYS[1], 'state', 'open', 'opened_at', now, 'probe_until', 0)
  return 'open'
end
return ''
"#;

/// The breaker's thresholds (global; see `docs/CONFIGURATION.md`).
#[derive(Debug, Clone)]
pub struct BreakerPolicy {
    pub consecutive_failures: u32,
    pub failure_rate: f64,
    pub min_requests: u32,
    pub window: Duration,
    pub cooldown: Duration,
    /// How long a half-open probe may take before another worker may probe.
    pub probe_lease: Duration,
}

/// One endpoint's limits, from its row.
#[derive(Debug, Clone, Default)]
pub struct EndpointLimits {
    pub rate_per_second: Option<u32>,
    pub burst: Option<u32>,
    pub max_concurrency: Option<u32>,
    /// The rate its application allows all of its endpoints together: (application, per
    /// second).
    pub application_rate: Option<(String, u32)>,
    /// The request timeout: a concurrency lease lives this long plus a margin.
    pub timeout: Duration,
}

use railhook_common::Word;
/// A breaker state change, mirrored to `endpoints.breaker_state` for the API and metrics.
pub use railhook_common::vocabulary::BreakerState;
/// Why a Delivery was deferred (common/src/vocabulary.rs, also the `reason` label of
/// `railhook_worker_deferrals_total`).
pub use railhook_common::vocabulary::DeferralReason as Reason;

/// What [`Limits::admit`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Send. `lease` is the concurrency lease to give back in [`Limits::record`].
    Go {
        lease: Option<String>,
        changed: Option<BreakerState>,
    },
    /// Do not send; put the Delivery back. `wait` is what the limit itself asks for (zero
    /// when it cannot tell, as for concurrency); the caller adds spacing.
    Defer { reason: Reason, wait: Duration },
    /// Redis did not answer: fail open.
    Unavailable,
}

/// How an Attempt ended, as the breaker sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    Fail,
    /// Neither (a 4xx: the endpoint is up; or nothing was sent).
    Neutral,
}

const REDIS_TIMEOUT: Duration = Duration::from_millis(200);
/// Added to the endpoint timeout for a concurrency lease: the excerpt wait and scheduling.
const LEASE_MARGIN: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct Limits {
    redis: Lazy,
    admit: Arc<redis::Script>,
    record: Arc<redis::Script>,
    application_rate: Arc<redis::Script>,
    policy: BreakerPolicy,
}

/// An endpoint's keys. The endpoint id is their hash tag (`{…}`): in a Redis Cluster every
/// key of one script must hash to one slot, or the script is refused with CROSSSLOT (and the
/// limits, failing open, would silently stop limiting).
fn keys(endpoint_id: &str) -> [String; 4] {
    [
        format!("rh:ep:{{{endpoint_id}}}:cb"),
        format!("rh:ep:{{{endpoint_id}}}:rl"),
        format!("rh:ep:{{{endpoint_id}}}:cc"),
        format!("rh:ep:{{{endpoint_id}}}:th"),
    ]
}

/// A Delivery's rate-slot reservation, in its endpoint's slot (see [`keys`]).
fn reservation_key(endpoint_id: &str, delivery_id: &str) -> String {
    format!("rh:ep:{{{endpoint_id}}}:rsv:{delivery_id}")
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Limits {
    /// Limits kept in Redis through `client` (built by `Settings::redis_client`: TLS and
    /// credentials come from there).
    pub fn new(client: RedisClient, policy: BreakerPolicy) -> Result<Self, redis::RedisError> {
        Ok(Self {
            redis: Lazy::new(client, REDIS_TIMEOUT),
            admit: Arc::new(redis::Script::new(ADMIT)),
            record: Arc::new(redis::Script::new(RECORD)),
            application_rate: Arc::new(redis::Script::new(APPLICATION_RATE)),
            policy,
        })
    }

    /// The checks before a request is built, in order: breaker, throttle, concurrency, rate.
    /// Nothing is taken unless everything passes (one atomic script).
    pub async fn admit(
        &self,
        endpoint_id: &str,
        delivery_id: &str,
        lease: &str,
        limits: &EndpointLimits,
    ) -> Admission {
        let Some(mut conn) = self.redis.get().await else {
            return Admission::Unavailable;
        };
        let [cb, rl, cc, th] = keys(endpoint_id);
        let rate = limits.rate_per_second.unwrap_or(0);
        let burst = limits.burst.unwrap_or(rate.max(1)).max(1);
        let max_conc = limits.max_concurrency.unwrap_or(0);
        let mut call = self.admit.prepare_invoke();
        call.key(cb)
            .key(rl)
            .key(cc)
            .key(th)
            .key(reservation_key(endpoint_id, delivery_id))
            .arg(rate)
            .arg(burst)
            .arg(max_conc)
            .arg(ms(limits.timeout + LEASE_MARGIN))
            .arg(lease)
            .arg(ms(self.policy.cooldown))
            .arg(ms(self.policy.probe_lease));
        let answer: Result<redis::RedisResult<(String, i64, String)>, _> =
            tokio::time::timeout(REDIS_TIMEOUT, call.invoke_async(&mut conn)).await;
        let (verdict, wait_ms, changed) = match answer {
            Ok(Ok(v)) => v,
            _ => {
                self.redis.forget().await;
                return Admission::Unavailable;
            }
        };
        let wait = Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0));
        let reason = match verdict.as_str() {
            "go" => {
                return Admission::Go {
                    lease: (max_conc > 0).then(|| lease.to_owned()),
                    changed: BreakerState::parse(&changed),
                };
            }
            other => Reason::parse(other).unwrap_or(Reason::Rate),
        };
        Admission::Defer { reason, wait }
    }

    /// An application's rate (`APPLICATION_RATE`): `Go` when its bucket had room (and the
    /// token is taken), else a `rate` Deferral with the wait it asks for.
    pub async fn admit_application(&self, application_id: &str, rate: u32) -> Admission {
        let Some(mut conn) = self.redis.get().await else {
            return Admission::Unavailable;
        };
        let mut call = self.application_rate.prepare_invoke();
        call.key(format!("rh:app:{{{application_id}}}:rl"))
            .arg(rate);
        let answer: Result<redis::RedisResult<i64>, _> =
            tokio::time::timeout(REDIS_TIMEOUT, call.invoke_async(&mut conn)).await;
        match answer {
            Ok(Ok(0)) => Admission::Go {
                lease: None,
                changed: None,
            },
            Ok(Ok(wait_ms)) => Admission::Defer {
                reason: Reason::Rate,
                wait: Duration::from_millis(u64::try_from(wait_ms).unwrap_or(0)),
            },
            _ => {
                self.redis.forget().await;
                Admission::Unavailable
            }
        }
    }

    /// After an Attempt: gives the concurrency lease back, pauses the endpoint after a 429
    /// with `Retry-After` (`throttle`), and feeds the breaker. Returns the breaker's new
    /// state when this outcome changed it. Best-effort: a lease that is not given back
    /// expires by itself.
    pub async fn record(
        &self,
        endpoint_id: &str,
        lease: Option<&str>,
        verdict: Verdict,
        throttle: Option<Duration>,
    ) -> Option<BreakerState> {
        let mut conn = self.redis.get().await?;
        let [cb, _, cc, th] = keys(endpoint_id);
        let result = match verdict {
            Verdict::Ok => "ok",
            Verdict::Fail => "fail",
            Verdict::Neutral => "neutral",
        };
        let mut call = self.record.prepare_invoke();
        call.key(cb)
            .key(cc)
            .key(th)
            .arg(lease.unwrap_or(""))
            .arg(result)
            .arg(throttle.map(ms).unwrap_or(0))
            .arg(self.policy.consecutive_failures)
            .arg(self.policy.failure_rate)
            .arg(self.policy.min_requests)
            .arg(ms(self.policy.window));
        match tokio::time::timeout(REDIS_TIMEOUT, call.invoke_async::<String>(&mut conn)).await {
            Ok(Ok(changed)) => BreakerState::parse(&changed),
            _ => {
                self.redis.forget().await;
                None
            }
        }
    }
}

/// The longest a worker waits for a reserved rate slot while holding the Claim: two
/// seconds, or eight slots at high rates, so a throttled endpoint's sleepers never hold more
/// than a handful of the worker's in-flight places.
pub fn rate_hold(rate_per_second: u32) -> Duration {
    if rate_per_second == 0 {
        return Duration::ZERO;
    }
    Duration::from_secs(2).min(Duration::from_secs(8) / rate_per_second)
}

/// How long a deferred Delivery waits before it is tried again: what the limit asked for,
/// but at least a back-off that doubles with each deferral of the same Delivery (so a long
/// outage costs a few deferrals per Delivery, not one a second), capped at `max`, with
/// jitter (100–150 %) so a deferred backlog does not return in one lump. A rate-limit wait
/// is a reserved slot and is kept exact.
pub fn deferral_wait(
    reason: Reason,
    asked: Duration,
    deferrals: i32,
    max: Duration,
    jitter: f64,
) -> Duration {
    if reason == Reason::Rate {
        return asked;
    }
    let base = match reason {
        Reason::Concurrency => Duration::from_millis(250),
        _ => Duration::from_secs(1),
    };
    let doublings = u32::try_from(deferrals.clamp(0, 16)).unwrap_or(0);
    let backoff = base.saturating_mul(1 << doublings);
    let wait = asked.max(backoff).min(max);
    wait.mul_f64(1.0 + 0.5 * jitter.clamp(0.0, 1.0))
}

/// Mirrors a breaker change (kept in Redis, see `limits`) onto the endpoint row, where the
/// API and the metrics read it.
pub async fn set_breaker(pool: &PgPool, endpoint_id: &str, state: &str) -> Result<(), sqlx::Error> {
    sqlx::query!(
        "UPDATE endpoints SET breaker_state = $2, breaker_changed_at = now(),
                breaker_opened_at = CASE WHEN $2 = 'open' THEN now() ELSE breaker_opened_at END
         WHERE id = $1",
        endpoint_id,
        state
    )
    .execute(pool)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_hold_is_short_and_bounded_in_slots() {
        assert_eq!(rate_hold(0), Duration::ZERO);
        assert_eq!(rate_hold(1), Duration::from_secs(2));
        assert_eq!(rate_hold(4), Duration::from_secs(2));
        assert_eq!(rate_hold(8), Duration::from_secs(1));
        assert_eq!(rate_hold(100), Duration::from_millis(80));
    }

    #[test]
    fn deferral_wait_doubles_and_is_capped() {
        let max = Duration::from_secs(300);
        let w0 = deferral_wait(Reason::Breaker, Duration::ZERO, 0, max, 0.0);
        let w3 = deferral_wait(Reason::Breaker, Duration::ZERO, 3, max, 0.0);
        assert_eq!(w0, Duration::from_secs(1));
        assert_eq!(w3, Duration::from_secs(8));
        assert_eq!(
            deferral_wait(Reason::Breaker, Duration::ZERO, 40, max, 0.0),
            max
        );
        assert_eq!(
            deferral_wait(Reason::Breaker, Duration::ZERO, 40, max, 1.0),
            max.mul_f64(1.5)
        );
        // What the limit asked for wins over a shorter back-off.
        assert_eq!(
            deferral_wait(Reason::Breaker, Duration::from_secs(20), 0, max, 0.0),
            Duration::from_secs(20)
        );
        // A reserved rate slot is kept exact.
        assert_eq!(
            deferral_wait(Reason::Rate, Duration::from_millis(123), 9, max, 1.0),
            Duration::from_millis(123)
        );
    }
}
