// `sqlx::migrate!` embeds ../migrations at compile time, but on stable Rust it cannot tell
// Cargo to watch the directory: without this, a new migration file is not picked up until
// something else in the crate changes.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
