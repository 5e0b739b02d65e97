//! The worker: consumes Kafka hints, takes a Claim on the Delivery row, runs the Attempt and
//! records its outcome behind the Fence. Not built yet: it arrives with the worker issue, and
//! until then `railhook worker` refuses to start rather than pretend to run.

/// Returned by [`run`] until the worker is built.
#[derive(Debug, thiserror::Error)]
#[error("the worker role is not part of this build yet (see the worker issue)")]
pub struct NotBuilt;

pub fn run() -> Result<(), NotBuilt> {
    Err(NotBuilt)
}
