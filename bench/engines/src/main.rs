//! Engine choice for endpoint transformations (issue #42): the same Slack-style
//! transformation run N times, a fresh sandbox per run (what the worker does), in rquickjs
//! (QuickJS) and boa_engine; then what each can do about a loop and an allocation.
use std::time::{Duration, Instant};

const CODE: &str = r#"
function handler(webhook) {
  const p = webhook.payload;
  webhook.payload = {
    text: `Order ${p.order_id} paid: ${(p.amount_cents / 100).toFixed(2)} ${p.currency}`,
    blocks: [{ type: "section", text: { type: "mrkdwn", text: `*${webhook.eventType}* from ${p.customer.name}` } }],
  };
  return webhook;
}
"#;
const INPUT: &str = r#"{"method":"POST","url":"https://hooks.example.com/T1/B2","eventType":"order.paid","headers":{},"payload":{"order_id":"ord_123","amount_cents":12550,"currency":"EUR","customer":{"name":"Ada","email":"ada@example.com"},"items":[{"sku":"A1","qty":2},{"sku":"B7","qty":1}]}}"#;

fn quickjs(code: &str, input: &str, limit: Duration) -> Result<String, String> {
    use rquickjs::{Context, Function, Runtime, context::intrinsic};
    let rt = Runtime::new().map_err(|e| e.to_string())?;
    rt.set_memory_limit(16 << 20);
    rt.set_max_stack_size(512 << 10);
    let deadline = Instant::now() + limit;
    rt.set_interrupt_handler(Some(Box::new(move || Instant::now() > deadline)));
    let ctx = Context::custom::<(intrinsic::Eval, intrinsic::Json, intrinsic::RegExp, intrinsic::RegExpCompiler, intrinsic::MapSet)>(&rt)
        .map_err(|e| e.to_string())?;
    ctx.with(|ctx| {
        let run = || -> rquickjs::Result<String> {
            ctx.eval::<(), _>(code)?;
            let handler: Function = ctx.globals().get("handler")?;
            let arg = ctx.json_parse(input)?;
            let out: rquickjs::Value = handler.call((arg,))?;
            Ok(ctx.json_stringify(out)?.map(|s| s.to_string()).transpose()?.unwrap_or_default())
        };
        run().map_err(|e| match e {
            rquickjs::Error::Exception => format!("{:?}", ctx.catch()),
            e => e.to_string(),
        })
    })
}

fn boa(code: &str, input: &str) -> Result<String, String> {
    use boa_engine::{Context, JsValue, Source, js_string};
    let mut ctx = Context::default();
    ctx.runtime_limits_mut().set_loop_iteration_limit(10_000_000);
    ctx.eval(Source::from_bytes(code)).map_err(|e| e.to_string())?;
    let handler = ctx.global_object().get(js_string!("handler"), &mut ctx).map_err(|e| e.to_string())?;
    let json: serde_json::Value = serde_json::from_str(input).unwrap();
    let arg = JsValue::from_json(&json, &mut ctx).map_err(|e| e.to_string())?;
    let out = handler.as_callable().ok_or("no handler")?.call(&JsValue::undefined(), &[arg], &mut ctx).map_err(|e| e.to_string())?;
    Ok(out.to_json(&mut ctx).map_err(|e| e.to_string())?.map(|v| v.to_string()).unwrap_or_default())
}

fn time(name: &str, n: u32, f: impl Fn() -> Result<String, String>) {
    let first = Instant::now();
    let out = f().expect(name);
    let cold = first.elapsed();
    let mut samples = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let t = Instant::now();
        f().unwrap();
        samples.push(t.elapsed());
    }
    samples.sort();
    let p = |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize];
    println!("{name:8} first {:>8.1?}  p50 {:>8.1?}  p99 {:>8.1?}  out {} bytes", cold, p(0.5), p(0.99), out.len());
}

fn main() {
    let n: u32 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(2000);
    time("quickjs", n, || quickjs(CODE, INPUT, Duration::from_millis(100)));
    time("boa", n, || boa(CODE, INPUT));
    let forever = "function handler(w){ for(;;){} }";
    let t = Instant::now();
    println!("quickjs loop: {:?} after {:.1?}", quickjs(forever, INPUT, Duration::from_millis(100)).err(), t.elapsed());
    let t = Instant::now();
    println!("boa loop (iteration limit 1e7): {:?} after {:.1?}", boa(forever, INPUT).err(), t.elapsed());
    let hog = "function handler(w){ const a=[]; for(;;){ a.push('x'.repeat(1<<16)); } }";
    let t = Instant::now();
    println!("quickjs allocation: {:?} after {:.1?}", quickjs(hog, INPUT, Duration::from_secs(5)).err(), t.elapsed());
    println!("boa allocation: no memory limit exists; not run (it would take the host's memory)");
}
