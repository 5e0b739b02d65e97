//! Slots for tenant-supplied programs (issue #53): a JSON Schema validation, a
//! transformation. Each runs on a thread of its own and may use it for its whole cost bound;
//! a fixed number run at once in a process, and one tenant may hold only its own share of
//! them, so however costly one tenant's programs are, another tenant always finds a slot that
//! none of them holds, and its answers and latency do not depend on the first tenant's input.
//!
//! A slot is held by the thread that runs the program until that thread ends, not by the
//! request that waits for it: a request that gave up (its deadline passed) frees nothing
//! that is still in use.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Slots shared by every tenant, at most `per_tenant` of them to one tenant.
#[derive(Debug)]
pub struct FairSlots {
    shared: Arc<Semaphore>,
    per_tenant: usize,
    by_tenant: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// One slot: the tenant's share and the shared pool's, released together when dropped.
#[derive(Debug)]
pub struct FairSlot {
    _tenant: Option<OwnedSemaphorePermit>,
    _shared: Option<OwnedSemaphorePermit>,
}

/// Idle tenants' entries are dropped once the table holds more than this many.
const PRUNE_ABOVE: usize = 1_000;

impl FairSlots {
    pub fn new(total: usize, per_tenant: usize) -> Self {
        Self {
            shared: Arc::new(Semaphore::new(total)),
            per_tenant: per_tenant.clamp(1, total.max(1)),
            by_tenant: Mutex::new(HashMap::new()),
        }
    }

    fn share_of(&self, tenant: &str) -> Arc<Semaphore> {
        let mut map = self
            .by_tenant
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(share) = map.get(tenant) {
            return share.clone();
        }
        if map.len() > PRUNE_ABOVE {
            let full = self.per_tenant;
            map.retain(|_, s| Arc::strong_count(s) > 1 || s.available_permits() < full);
        }
        map.entry(tenant.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_tenant)))
            .clone()
    }

    /// Waits for a slot of `tenant`'s share, then for one of the shared pool: a tenant
    /// queues behind its own programs first, so it never holds a shared slot while waiting.
    pub async fn acquire(&self, tenant: &str) -> FairSlot {
        let tenant = self.share_of(tenant).acquire_owned().await.ok();
        let shared = self.shared.clone().acquire_owned().await.ok();
        FairSlot {
            _tenant: tenant,
            _shared: shared,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn one_tenant_holds_its_share_and_another_still_finds_a_slot() {
        let slots = FairSlots::new(4, 2);
        let a1 = slots.acquire("a").await;
        let _a2 = slots.acquire("a").await;
        // A third for `a` waits for its own share, not for the pool.
        let third = tokio::time::timeout(Duration::from_millis(50), slots.acquire("a")).await;
        assert!(third.is_err(), "a tenant got more than its share");
        // Another tenant gets one at once, twice.
        let b = tokio::time::timeout(Duration::from_millis(50), async {
            (slots.acquire("b").await, slots.acquire("b").await)
        })
        .await;
        assert!(
            b.is_ok(),
            "another tenant waited for the first one's programs"
        );
        drop(a1);
        let again = tokio::time::timeout(Duration::from_millis(50), slots.acquire("a")).await;
        assert!(again.is_ok(), "a released slot was not given back");
    }
}
