//! The CDC relay: reads Outbox inserts from a logical replication Slot (pgoutput), publishes
//! each as an Announcement to Kafka with `acks=all`, and confirms the Slot's LSN only after
//! Kafka acknowledged. See [`relay`] for the loop and its invariants, [`window`] for the
//! confirmation rule, [`slot`] for the operator's view of the Slot.

mod config;
mod copy_watch;
mod error;
pub mod metrics;
mod outbox;
pub mod pgoutput;
mod prune;
pub mod relay;
pub mod slot;
pub mod window;

pub use metrics::RelayMetrics;
pub use relay::{Faults, RelayConfig, RelayError, run};
