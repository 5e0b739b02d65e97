//! One store per noun, read by the API's handlers and the dashboard's pages alike: a page
//! never has SQL of its own, so it shows exactly what the API would return.

pub mod access;
pub mod applications;
pub mod deliveries;
pub mod endpoints;
pub mod event_types;
pub mod events;
pub mod failed;
pub mod operational_endpoints;
pub mod poller;
pub mod portal;
pub mod replays;
pub mod sessions;
pub mod subscriptions;
pub mod tenants;
