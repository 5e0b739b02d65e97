//! Endpoint transformations (docs/ROUTING.md): a small JavaScript program, written by whoever
//! manages the endpoint, that reshapes what one endpoint receives, or skips it.
//!
//! The program declares `function handler(webhook)`. It gets `{method, url, eventType,
//! payload, headers}` (Svix's shape, so a Svix transformation runs unchanged; `headers` is
//! empty: a program never sees the endpoint's custom headers or its credentials, which
//! are often secrets, issue #53) and returns that object changed: `payload` becomes the body
//! (as JSON), `method` may be `POST` or `PUT`, `url` may change its path and query but not its
//! scheme, host or port, `headers` adds headers (never one Railhook sets), and
//! `cancel = true` skips the Delivery.
//!
//! Invariant: a program can neither hang nor exhaust the worker, nor reach anything outside
//! its input. It runs in QuickJS (rquickjs; docs/ROUTING.md has the measurement behind the
//! choice), in a runtime of its own made for this one run and dropped after it, with
//! - a CPU-time limit ([`Limits::time`]): the CPU time of the thread that runs it, from the
//!   sandbox's start (loading the program, parsing its input, the handler, the result's
//!   JSON), enforced by QuickJS's interrupt handler, which the interpreter polls inside
//!   loops and calls: `for(;;){}` ends with "time limit". CPU time, not wall-clock time, so
//!   a busy machine (a program waiting for a core) does not turn an accepted Event into a
//!   FAILED `time_limit`, and the same program on the same Event fails the same way (issue
//!   #53); a wall-clock backstop ([`Limits::wall`], ten times as long) ends a run that a
//!   starved thread would stretch further;
//! - slots ([`run_in_slot`], common/src/fair_slots.rs): at most [`SANDBOXES`] runs at once in a
//!   process, [`SANDBOXES_PER_TENANT`] of them for one tenant, so the heaps together stay
//!   under `SANDBOXES` × [`Limits::memory_bytes`] and one tenant's programs never hold every
//!   slot. A native built-in (`Array.prototype.sort` on a million items) does not poll the
//!   interrupt handler; its work is bounded by what the heap can hold, and the thread keeps
//!   its slot until it ends, so what such a program delays is its own tenant's slots;
//! - a memory limit ([`Limits::memory_bytes`]) on the runtime's allocator and a stack limit:
//!   an allocation past it fails inside the program ("memory limit");
//! - an output limit ([`Limits::output_bytes`]) on what it returns;
//! - no host functions at all: the context has the language's own objects (JSON, RegExp,
//!   Map/Set) and nothing else: no `Date` or `performance` (no clock), no module loader, no
//!   `require`, no `std`/`os` (no file or network). A program that reaches for one gets a
//!   `ReferenceError` and fails.
//!
//! Every failure is a [`Failure`] with a short reason in the API's words; none panics.
//! A run is CPU work of up to [`Limits::time`]: callers run it on a blocking thread.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rquickjs::context::intrinsic;
use rquickjs::{CatchResultExt, CaughtError, Context, Function, Runtime, Value};
use serde::{Deserialize, Serialize};

/// The sandbox's limits for one run.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// CPU time of the running thread for the whole run: loading the program, its input,
    /// calling the handler, reading its result.
    pub time: Duration,
    /// Wall-clock time for the whole run: a backstop for a thread that gets little CPU.
    pub wall: Duration,
    /// The runtime's heap (the input object included).
    pub memory_bytes: usize,
    /// The interpreter's stack (deep recursion ends with "stack overflow").
    pub stack_bytes: usize,
    /// The returned object, as JSON.
    pub output_bytes: usize,
}

/// The limits every transformation runs under (docs/ROUTING.md gives them as measured).
pub const LIMITS: Limits = Limits {
    time: Duration::from_millis(100),
    wall: Duration::from_secs(1),
    memory_bytes: 32 << 20,
    stack_bytes: 256 << 10,
    output_bytes: 1 << 20,
};

/// Sandboxes that may run at once in one process, across tenants: with [`LIMITS`]' heap
/// each, at most 256 MiB for every program together (issue #53: the worker ran up to 96
/// at once, and the API's test and PUT routes without a bound).
pub const SANDBOXES: usize = 8;
/// Sandboxes one tenant may run at once (the worker: an endpoint's program; the API: a
/// project's requests).
pub const SANDBOXES_PER_TENANT: usize = 2;

/// The sandbox slots, taken by [`run_in_slot`] for every check and run.
static SLOTS: std::sync::LazyLock<crate::fair_slots::FairSlots> =
    std::sync::LazyLock::new(|| crate::fair_slots::FairSlots::new(SANDBOXES, SANDBOXES_PER_TENANT));

/// Why [`run_in_slot`] has no answer from the thread it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unanswered {
    /// Not done within twice [`Limits::wall`]: a native built-in that does not yield. Its
    /// thread keeps its slot until it ends; the caller answers [`Failure::time_limit`].
    TooLong,
    /// The thread panicked.
    Panicked,
}

/// Runs `work` (a program's check or run) on a blocking thread that holds one of `tenant`'s
/// sandbox slots until it ends, and waits for it at most twice [`LIMITS`]' wall-clock
/// backstop. The worker and the API's routes all run programs through here, so the slots and
/// the wait are one rule.
pub async fn run_in_slot<T: Send + 'static>(
    tenant: &str,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Unanswered> {
    let slot = SLOTS.acquire(tenant).await;
    let thread = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        work()
    });
    match tokio::time::timeout(LIMITS.wall * 2, thread).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(_)) => Err(Unanswered::Panicked),
        Err(_) => Err(Unanswered::TooLong),
    }
}

/// A run's budget: the CPU time of the thread it started on, and a wall-clock backstop.
#[derive(Clone, Copy)]
struct Budget {
    cpu_at_start: Option<cpu_time::ThreadTime>,
    cpu: Duration,
    wall_deadline: Instant,
}

impl Budget {
    /// Starts counting on the calling thread, which must be the one that runs the program.
    fn start(limits: &Limits) -> Self {
        Self {
            cpu_at_start: cpu_time::ThreadTime::try_now().ok(),
            cpu: limits.time,
            wall_deadline: Instant::now() + limits.wall,
        }
    }

    fn spent(&self) -> bool {
        let cpu_spent = self
            .cpu_at_start
            .is_some_and(|t| t.try_elapsed().is_ok_and(|used| used >= self.cpu));
        cpu_spent || Instant::now() >= self.wall_deadline
    }
}

/// The longest program accepted, in bytes.
pub const MAX_CODE_BYTES: usize = 64 << 10;

/// What the program is given.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Input<'a> {
    pub method: &'a str,
    pub url: &'a str,
    pub event_type: &'a str,
    /// The Event's payload (JSON text).
    pub payload: &'a serde_json::value::RawValue,
    /// Always `{}`: what the program may add to. Private, so no caller can hand a program
    /// a header value (custom headers and credentials are often secrets, and a program can
    /// put anything it reads into an error the API and the portal show).
    headers: BTreeMap<String, String>,
    /// The names (lowercase) of the headers the endpoint sets itself: its custom headers and
    /// its `authorization`. A program may not set them; it never sees their values.
    #[serde(skip)]
    own_headers: std::collections::BTreeSet<String>,
}

impl<'a> Input<'a> {
    pub fn new(
        method: &'a str,
        url: &'a str,
        event_type: &'a str,
        payload: &'a serde_json::value::RawValue,
        own_headers: impl IntoIterator<Item = String>,
    ) -> Self {
        Self {
            method,
            url,
            event_type,
            payload,
            headers: BTreeMap::new(),
            own_headers: own_headers
                .into_iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
        }
    }
}

crate::words! {
    /// What a run came to: the `outcome` label of the worker's
    /// `railhook_worker_transformation_duration_seconds`, and the word the endpoint's last
    /// result and the test route use.
    RunOutcome { Send, Skip, Failed }
}

/// What the program decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Send(Request),
    /// `cancel = true`: nothing is sent for this Delivery.
    Skip,
}

/// What a transformed Attempt sends: recorded with the Attempt as it was sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub method: String,
    pub url: String,
    /// The headers the program added (besides the endpoint's own and Railhook's).
    pub headers: BTreeMap<String, String>,
    /// The body: the returned `payload` as JSON.
    pub body: String,
}

/// Why a run produced nothing to send. Each is permanent for the Delivery: the same program
/// on the same Event fails the same way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    #[error("the program does not compile: {0}")]
    Syntax(String),
    #[error("the program declares no `function handler(webhook)`")]
    NoHandler,
    #[error("the handler threw: {0}")]
    Threw(String),
    #[error("the program ran past its time limit of {0} ms")]
    TimeLimit(u128),
    #[error("the program used more than its memory limit of {0} MiB")]
    MemoryLimit(usize),
    #[error("the program's result is larger than {0} bytes")]
    OutputTooLarge(usize),
    #[error("the program's result is invalid: {0}")]
    InvalidResult(String),
}

impl Failure {
    /// The time limit of [`LIMITS`], as a Failure.
    pub fn time_limit() -> Self {
        Failure::TimeLimit(LIMITS.time.as_millis())
    }

    /// A stable code for the Failure (API responses, the Delivery's failure reason).
    pub fn code(&self) -> &'static str {
        match self {
            Failure::Syntax(_) => "syntax",
            Failure::NoHandler => "no_handler",
            Failure::Threw(_) => "threw",
            Failure::TimeLimit(_) => "time_limit",
            Failure::MemoryLimit(_) => "memory_limit",
            Failure::OutputTooLarge(_) => "output_too_large",
            Failure::InvalidResult(_) => "invalid_result",
        }
    }
}

/// What the handler may return, read from its JSON.
#[derive(Deserialize)]
struct Returned {
    method: Option<String>,
    url: Option<String>,
    payload: Option<serde_json::Value>,
    #[serde(default)]
    headers: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    cancel: bool,
}

/// A fresh runtime with the limits, and a context with the language only.
fn sandbox(limits: &Limits, budget: Budget) -> Result<(Runtime, Context), Failure> {
    let internal = |e: rquickjs::Error| Failure::Threw(format!("the sandbox did not start: {e}"));
    let runtime = Runtime::new().map_err(internal)?;
    runtime.set_memory_limit(limits.memory_bytes);
    runtime.set_max_stack_size(limits.stack_bytes);
    runtime.set_interrupt_handler(Some(Box::new(move || budget.spent())));
    let context = Context::custom::<(
        intrinsic::Eval,
        intrinsic::Json,
        intrinsic::RegExpCompiler,
        intrinsic::RegExp,
        intrinsic::MapSet,
    )>(&runtime)
    .map_err(internal)?;
    Ok((runtime, context))
}

/// What QuickJS raised, as text: the error's name, message and where it was thrown.
fn caught(error: &CaughtError<'_>) -> String {
    match error {
        CaughtError::Exception(e) => {
            let message = e.message().unwrap_or_default();
            let stack = e.stack().unwrap_or_default();
            let at = stack.lines().next().unwrap_or("").trim().to_owned();
            let name = e
                .get::<_, Option<String>>("name")
                .ok()
                .flatten()
                .unwrap_or_else(|| "Error".to_owned());
            if at.is_empty() {
                format!("{name}: {message}")
            } else {
                format!("{name}: {message} ({at})")
            }
        }
        CaughtError::Value(v) => format!("a non-error value: {}", describe(v)),
        CaughtError::Error(e) => e.to_string(),
    }
}

fn describe(v: &Value<'_>) -> String {
    v.as_string()
        .and_then(|s| s.to_string().ok())
        .unwrap_or_else(|| v.type_name().to_owned())
}

/// Turns what QuickJS raised into a Failure: its interrupt (the budget spent) is the time
/// limit, an allocation refused is the memory limit, anything else is the program's own.
fn classify(text: String, limits: &Limits, budget: Budget) -> Failure {
    if text.contains("interrupted") && budget.spent() {
        return Failure::TimeLimit(limits.time.as_millis());
    }
    if text.contains("out of memory") || text.contains("Allocation") {
        return Failure::MemoryLimit(limits.memory_bytes >> 20);
    }
    Failure::Threw(truncate(text, 300))
}

fn truncate(mut text: String, max: usize) -> String {
    if crate::text::truncate_at_char(&mut text, max) {
        text.push('…');
    }
    text
}

/// Loads `code` and checks that it declares a handler, under the limits (a program's top
/// level runs too, so it could loop): what the API does before it stores a program.
pub fn check(code: &str, limits: &Limits) -> Result<(), Failure> {
    if code.len() > MAX_CODE_BYTES {
        return Err(Failure::Syntax(format!(
            "the program is {} bytes; the limit is {MAX_CODE_BYTES}",
            code.len()
        )));
    }
    let budget = Budget::start(limits);
    let (_runtime, context) = sandbox(limits, budget)?;
    context.with(|ctx| {
        let loaded: rquickjs::Result<()> = ctx.eval(code);
        if let Err(e) = loaded.catch(&ctx) {
            let text = caught(&e);
            return Err(match classify(text, limits, budget) {
                Failure::Threw(t) if t.starts_with("SyntaxError") => Failure::Syntax(t),
                other => other,
            });
        }
        match ctx.globals().get::<_, Value>("handler") {
            Ok(v) if v.is_function() => Ok(()),
            _ => Err(Failure::NoHandler),
        }
    })
}

/// Runs `code` on `input` under `limits`. The result's URL must keep the scheme, host and
/// port of `input.url` (the endpoint's).
pub fn run(code: &str, input: &Input<'_>, limits: &Limits) -> Result<Outcome, Failure> {
    let budget = Budget::start(limits);
    let input_json =
        serde_json::to_string(input).map_err(|e| Failure::InvalidResult(e.to_string()))?;
    let (_runtime, context) = sandbox(limits, budget)?;
    let output = context.with(|ctx| -> Result<String, Failure> {
        let fail = |e: CaughtError<'_>| classify(caught(&e), limits, budget);
        let loaded: rquickjs::Result<()> = ctx.eval(code);
        loaded.catch(&ctx).map_err(|e| match fail(e) {
            Failure::Threw(t) if t.starts_with("SyntaxError") => Failure::Syntax(t),
            other => other,
        })?;
        let handler: Function = ctx
            .globals()
            .get::<_, Value>("handler")
            .ok()
            .and_then(|v| v.into_function())
            .ok_or(Failure::NoHandler)?;
        let argument = ctx
            .json_parse(input_json.as_str())
            .catch(&ctx)
            .map_err(fail)?;
        let returned: Value = handler.call((argument,)).catch(&ctx).map_err(fail)?;
        if !returned.is_object() {
            return Err(Failure::InvalidResult(format!(
                "the handler must return the webhook object; it returned {}",
                returned.type_name()
            )));
        }
        let text = ctx.json_stringify(returned).catch(&ctx).map_err(fail)?;
        let text = text
            .map(|s| s.to_string())
            .transpose()
            .map_err(|e| Failure::InvalidResult(e.to_string()))?
            .unwrap_or_default();
        Ok(text)
    })?;
    if output.len() > limits.output_bytes {
        return Err(Failure::OutputTooLarge(limits.output_bytes));
    }
    decide(&output, input)
}

/// Reads the handler's returned object: what to send, or skip.
fn decide(output: &str, input: &Input<'_>) -> Result<Outcome, Failure> {
    let invalid = |s: String| Failure::InvalidResult(s);
    let r: Returned = serde_json::from_str(output).map_err(|e| invalid(e.to_string()))?;
    if r.cancel {
        return Ok(Outcome::Skip);
    }
    let method = r.method.unwrap_or_else(|| input.method.to_owned());
    if method != "POST" && method != "PUT" {
        return Err(invalid(format!(
            "method must be POST or PUT, not {method:?}"
        )));
    }
    let url = match r.url {
        None => input.url.to_owned(),
        Some(u) => same_origin(input.url, &u)?,
    };
    let payload = r.payload.ok_or_else(|| {
        invalid("payload is missing: return the webhook object with a payload".to_owned())
    })?;
    let mut headers = BTreeMap::new();
    for (name, value) in r.headers {
        let name = name.to_ascii_lowercase();
        let serde_json::Value::String(value) = value else {
            return Err(invalid(format!("header {name} must be a string")));
        };
        check_header(&name, &value, input)?;
        headers.insert(name, value);
    }
    Ok(Outcome::Send(Request {
        method,
        url,
        headers,
        body: payload.to_string(),
    }))
}

/// A returned header must be a valid name and value, not one Railhook sets itself, and not
/// one of the endpoint's own (those stay as configured).
fn check_header(name: &str, value: &str, input: &Input<'_>) -> Result<(), Failure> {
    let invalid = |s: String| Failure::InvalidResult(s);
    let token = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !token {
        return Err(invalid(format!("{name:?} is not a valid header name")));
    }
    if value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
        return Err(invalid(format!("header {name} holds a line break")));
    }
    if crate::headers::is_reserved(name) || name == "authorization" {
        return Err(invalid(format!("header {name} is set by Railhook")));
    }
    if input.own_headers.contains(name) {
        return Err(invalid(format!("header {name} is the endpoint's own")));
    }
    Ok(())
}

/// The returned URL, if it keeps the endpoint's scheme, host and port.
fn same_origin(endpoint: &str, returned: &str) -> Result<String, Failure> {
    let invalid = |s: String| Failure::InvalidResult(s);
    let base = url::Url::parse(endpoint).map_err(|e| invalid(e.to_string()))?;
    let next = base
        .join(returned)
        .map_err(|e| invalid(format!("url {returned:?} is not a URL: {e}")))?;
    if next.origin() != base.origin() {
        return Err(invalid(
            "url may change the path and query only, not the scheme, host or port".to_owned(),
        ));
    }
    Ok(next.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn go(code: &str, payload: &str) -> Result<Outcome, Failure> {
        go_with(code, payload, [])
    }

    fn go_with<const N: usize>(
        code: &str,
        payload: &str,
        own: [&str; N],
    ) -> Result<Outcome, Failure> {
        let raw = serde_json::value::RawValue::from_string(payload.to_owned()).expect("json");
        let i = Input::new(
            "POST",
            "https://hooks.example.com/in?x=1",
            "order.paid",
            &raw,
            own.map(str::to_owned),
        );
        run(code, &i, &LIMITS)
    }

    #[test]
    fn a_program_never_sees_the_endpoints_headers_and_may_return_the_webhook_whole() {
        // Issue #53: the endpoint's custom header and Basic authorization were the program's
        // input, so `throw new Error(w.headers.authorization)` showed the password, and a
        // program returning the webhook object failed on the endpoint's own headers.
        let threw = go_with(
            "function handler(w) { throw new Error(JSON.stringify(w.headers)); }",
            r#"{"a":1}"#,
            ["x-api-key", "authorization"],
        );
        assert!(matches!(threw, Err(Failure::Threw(_))), "{threw:?}");
        assert!(threw_text(&threw).contains("{}"), "{threw:?}");
        let whole = go_with(
            "function handler(w) { return w; }",
            r#"{"a":1}"#,
            ["x-api-key"],
        );
        assert!(matches!(whole, Ok(Outcome::Send(_))), "{whole:?}");
        let overrides = go_with(
            "function handler(w) { w.headers['X-Api-Key'] = 'mine'; return w; }",
            r#"{"a":1}"#,
            ["x-api-key"],
        );
        assert!(
            matches!(&overrides, Err(Failure::InvalidResult(why)) if why.contains("endpoint's own")),
            "{overrides:?}"
        );
    }

    /// Issue #53 finding 7: the limit had been wall-clock time, so a program that needs 40 %
    /// of it failed `time_limit` whenever it waited for a core. Eight threads spin on the
    /// machine's cores while it runs: it waits for longer than the limit, and still sends.
    #[test]
    fn the_time_limit_counts_cpu_time_not_the_wait_for_a_core() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let program = |n: u64| {
            format!(
                "function handler(w) {{ let s = 0; for (let i = 0; i < {n}; i++) {{ s += i % 7; }} \
                 w.payload = {{s: s}}; return w; }}"
            )
        };
        let timed = |code: &str| {
            let cpu = cpu_time::ThreadTime::now();
            let wall = Instant::now();
            let r = go(code, "{}");
            (r, cpu.elapsed(), wall.elapsed())
        };
        // Calibrated alone: a loop that takes about 40 % of the limit in CPU time.
        let (_, base, _) = timed(&program(200_000));
        let n = (200_000.0 * LIMITS.time.as_secs_f64() * 0.4 / base.as_secs_f64().max(1e-6)) as u64;
        let stop = Arc::new(AtomicBool::new(false));
        let spinners: Vec<_> = (0..8)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let (r, cpu, wall) = timed(&program(n));
        stop.store(true, Ordering::Relaxed);
        for s in spinners {
            let _ = s.join();
        }
        assert!(
            matches!(r, Ok(Outcome::Send(_))),
            "{r:?} after {cpu:?} of CPU and {wall:?} of wall-clock time ({n} iterations)"
        );
        // The test means something only if the run did wait for a core.
        assert!(
            wall > LIMITS.time,
            "the run was not held up ({wall:?} of wall-clock time, {cpu:?} of CPU)"
        );
    }

    fn threw_text(r: &Result<Outcome, Failure>) -> String {
        match r {
            Err(Failure::Threw(t)) => t.clone(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn a_handler_reshapes_the_body_path_and_headers() {
        let code = r#"function handler(w) {
            w.payload = {text: `${w.eventType}: ${w.payload.amount}`};
            w.url = "/slack?team=1"; w.method = "PUT"; w.headers = {"X-Team": "ops"};
            return w; }"#;
        let Ok(Outcome::Send(r)) = go(code, r#"{"amount": 5}"#) else {
            panic!("not sent")
        };
        assert_eq!(r.body, r#"{"text":"order.paid: 5"}"#);
        assert_eq!(r.url, "https://hooks.example.com/slack?team=1");
        assert_eq!(r.method, "PUT");
        assert_eq!(r.headers.get("x-team").map(String::as_str), Some("ops"));
    }

    #[test]
    fn cancel_skips() {
        let code = "function handler(w) { w.cancel = w.payload.n < 3; return w; }";
        assert_eq!(go(code, r#"{"n": 1}"#), Ok(Outcome::Skip));
        assert!(matches!(go(code, r#"{"n": 5}"#), Ok(Outcome::Send(_))));
    }

    #[test]
    fn limits_and_refusals_are_failures_not_crashes() {
        let t = Instant::now();
        assert_eq!(
            go("function handler(w) { for (;;) {} }", "{}"),
            Err(Failure::TimeLimit(100))
        );
        assert!(t.elapsed() < Duration::from_secs(5));
        let hog = "function handler(w) { const a = []; for (;;) a.push('x'.repeat(1 << 16)); }";
        assert_eq!(go(hog, "{}"), Err(Failure::MemoryLimit(32)));
        let deep = "function f(n) { return f(n + 1) + 1; } function handler(w) { return f(0); }";
        assert!(matches!(go(deep, "{}"), Err(Failure::Threw(t)) if t.contains("stack")));
        for reach in [
            "require('fs').readFileSync('/etc/passwd')",
            "std.loadFile('/etc/passwd')",
            "os.open('/etc/passwd')",
            "Date.now()",
            "performance.now()",
            "fetch('http://127.0.0.1')",
        ] {
            let code = format!("function handler(w) {{ w.payload = {reach}; return w; }}");
            let got = go(&code, "{}");
            assert!(
                matches!(&got, Err(Failure::Threw(t)) if t.starts_with("ReferenceError")),
                "{reach}: {got:?}"
            );
        }
        assert!(matches!(
            go("function handler(w) {", "{}"),
            Err(Failure::Syntax(_))
        ));
        assert_eq!(go("const x = 1;", "{}"), Err(Failure::NoHandler));
        let huge = "function handler(w) { w.payload = 'x'.repeat(2 << 20); return w; }";
        assert_eq!(go(huge, "{}"), Err(Failure::OutputTooLarge(1 << 20)));
    }

    #[test]
    fn results_that_would_escape_the_endpoint_are_refused() {
        for (change, why) in [
            (
                "w.url = 'https://elsewhere.example.com/'",
                "scheme, host or port",
            ),
            (
                "w.url = 'http://hooks.example.com/in'",
                "scheme, host or port",
            ),
            ("w.method = 'DELETE'", "POST or PUT"),
            (
                "w.headers = {'webhook-signature': 'v1,x'}",
                "set by Railhook",
            ),
            ("w.headers = {'x-a': 'b\\r\\nx-c: d'}", "line break"),
            ("return 42", "must return"),
            ("delete w.payload", "payload is missing"),
        ] {
            let code = format!("function handler(w) {{ {change}; return w; }}");
            let got = go(&code, "{}");
            assert!(
                matches!(&got, Err(Failure::InvalidResult(t)) if t.contains(why)),
                "{change}: {got:?}"
            );
        }
    }

    #[test]
    fn check_refuses_what_cannot_run() {
        assert!(check("function handler(w) { return w; }", &LIMITS).is_ok());
        assert!(matches!(
            check("function handler(", &LIMITS),
            Err(Failure::Syntax(_))
        ));
        assert_eq!(check("let handler = 3;", &LIMITS), Err(Failure::NoHandler));
        assert_eq!(check("for (;;) {}", &LIMITS), Err(Failure::TimeLimit(100)));
    }
}
