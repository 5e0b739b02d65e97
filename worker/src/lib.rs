//! The worker: consumes Kafka hints, takes a Claim on the Delivery row, runs the Attempt and
//! records its outcome behind the Fence; the retry scheduler and the sweeps live here too.
//! See [`worker`] for the loop, [`attempt`] for the Attempt Runner's invariants, [`store`]
//! for the SQL that decides, [`schedule`] for the retry decision.

pub mod attempt;
pub mod group_watch;
pub mod hint;
pub mod limits;
pub mod metrics;
pub mod ordering;
pub mod schedule;
pub mod ssrf;
pub mod store;
pub mod worker;

pub use metrics::WorkerMetrics;
pub use worker::{WorkerConfig, WorkerError, run};
