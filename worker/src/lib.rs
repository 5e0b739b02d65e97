//! The worker: consumes Kafka hints, takes a Claim on the Delivery row, runs the Attempt and
//! records its outcome behind the Fence; the retry scheduler and the sweeps live here too.
//! See [`runtime`] for the loop, [`attempt`] for the Attempt's invariants, [`transport`] for
//! what carries it (HTTP, Kafka, SQS, RabbitMQ, NATS), [`claim`] and [`fence`]
//! for the SQL that decides, [`retry_policy`] for every retry decision.

pub mod attempt;
pub mod claim;
mod config;
mod consumer;
mod dispatch;
mod doze;
mod express;
pub mod fence;
pub mod group_watch;
mod lanes;
pub mod limits;
pub mod metrics;
pub mod ordering;
pub mod pools;
mod resolution;
pub mod retry_policy;
mod retry_publisher;
pub mod runtime;
pub mod ssrf;
pub mod successes;
pub mod sweeps;
mod transform;
pub mod transport;
mod turn;
mod warm;

pub use config::{WorkerConfig, WorkerError};
pub use metrics::WorkerMetrics;
pub use pools::Pools;
pub use runtime::run;
