//! The limits and the quota on a real three-node Redis Cluster (`deploy/local/redis.sh
//! cluster`). Before the keys had a hash tag, every limit script touched keys in several
//! slots and the cluster refused it with CROSSSLOT; the limits, failing open, then silently
//! stopped limiting. Here a rate limit must actually defer, and the quota must count.

use std::time::Duration;

use crate::support::local_setting;
use railhook_common::redis_client::{RedisClient, RedisTls, redis_client};
use railhook_worker::limits::{Admission, BreakerPolicy, EndpointLimits, Limits, Reason, Verdict};
use secrecy::SecretString;

fn cluster() -> RedisClient {
    let url = local_setting("RAILHOOK_TEST_REDIS_CLUSTER_URL");
    let client =
        redis_client(&SecretString::from(url), &RedisTls::default(), true).expect("cluster client");
    assert!(matches!(client, RedisClient::Cluster(_)));
    client
}

fn policy() -> BreakerPolicy {
    BreakerPolicy {
        consecutive_failures: 3,
        failure_rate: 0.5,
        min_requests: 100,
        window: Duration::from_secs(60),
        cooldown: Duration::from_secs(30),
        probe_lease: Duration::from_secs(60),
    }
}

#[tokio::test]
async fn limits_hold_on_a_redis_cluster_for_endpoints_in_every_slot() {
    let limits = Limits::new(cluster(), policy()).expect("limits");
    // Enough endpoints that their keys land on all three nodes.
    for e in 0..12 {
        let endpoint = format!("ep_cluster_{}_{e}", ulid::Ulid::new());
        let rate = EndpointLimits {
            rate_per_second: Some(1),
            burst: Some(1),
            max_concurrency: Some(5),
            application_rate: None,
            timeout: Duration::from_secs(5),
        };
        let mut go = 0;
        let mut deferred = 0;
        for d in 0..3 {
            match limits
                .admit(
                    &endpoint,
                    &format!("dlv_{e}_{d}"),
                    &format!("lease-{e}-{d}"),
                    &rate,
                )
                .await
            {
                Admission::Go { .. } => go += 1,
                Admission::Defer {
                    reason: Reason::Rate,
                    ..
                } => deferred += 1,
                Admission::Defer { reason, .. } => panic!("{endpoint}: deferred for {reason:?}"),
                Admission::Unavailable => {
                    panic!("{endpoint}: the limit script failed on the cluster (fail-open)")
                }
            }
        }
        assert_eq!(
            (go, deferred),
            (1, 2),
            "{endpoint}: one per second, burst 1"
        );

        // The breaker's record script, on the same slot: three failures open it.
        let breaker = EndpointLimits {
            rate_per_second: None,
            burst: None,
            max_concurrency: None,
            application_rate: None,
            timeout: Duration::from_secs(5),
        };
        let breaker_endpoint = format!("{endpoint}_b");
        for _ in 0..3 {
            limits
                .record(&breaker_endpoint, None, Verdict::Fail, None)
                .await;
        }
        match limits
            .admit(&breaker_endpoint, "dlv_b", "lease-b", &breaker)
            .await
        {
            Admission::Defer {
                reason: Reason::Breaker,
                ..
            } => {}
            other => panic!("{breaker_endpoint}: expected the open breaker, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn the_quota_counts_on_a_redis_cluster() {
    use railhook_ingest::quota::{Quota, Reservation};
    let metrics = railhook_ingest::metrics::IngestMetrics::new();
    let quota = Quota::new(cluster(), Duration::from_secs(2), metrics.clone());
    for o in 0..6 {
        let org = format!("org_cluster_{}_{o}", ulid::Ulid::new());
        // Five reserved, two of them refunded (not created): three used of six.
        let five = quota.reserve(&org, 6, 5).await;
        assert!(matches!(five, Reservation::Reserved { .. }), "{org}");
        quota.settle(&org, five, 3).await;
        assert!(
            matches!(quota.reserve(&org, 6, 4).await, Reservation::Exceeded),
            "{org}"
        );
        let three = quota.reserve(&org, 6, 3).await;
        assert!(matches!(three, Reservation::Reserved { .. }), "{org}");
        assert!(
            matches!(quota.reserve(&org, 6, 1).await, Reservation::Exceeded),
            "{org}"
        );
    }
    let skipped: u64 = ["check", "charge", "refund"]
        .iter()
        .map(|s| metrics.quota_charge_skipped.with_label_values(&[s]).get())
        .sum();
    assert_eq!(skipped, 0, "a quota call failed on the cluster");
}

/// An application's bucket has a key of its own, in whatever slot its id hashes to; on a
/// cluster it holds like the endpoints' (a burst of one second, then the rate).
#[tokio::test]
async fn application_rates_hold_on_a_redis_cluster() {
    let limits = Limits::new(cluster(), policy()).expect("limits");
    for a in 0..6 {
        let application = format!("app_cluster_{}_{a}", ulid::Ulid::new());
        let mut go = 0;
        let mut deferred = 0;
        for _ in 0..4 {
            match limits.admit_application(&application, 2).await {
                Admission::Go { .. } => go += 1,
                Admission::Defer {
                    reason: Reason::Rate,
                    wait,
                } => {
                    assert!(
                        wait <= Duration::from_millis(600),
                        "{application}: {wait:?}"
                    );
                    deferred += 1;
                }
                other => panic!("{application}: {other:?}"),
            }
        }
        assert_eq!(
            (go, deferred),
            (2, 2),
            "{application}: two per second, burst 2"
        );
    }
}
