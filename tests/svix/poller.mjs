// A polling endpoint read by the official Svix JavaScript SDK, unchanged (issue #56): one
// consumer reads 40 messages in pages of 7 with `message.poller.consumerPoll`, in order and
// once; a seek back re-reads; a malformed iterator is refused. Run by tests/it/poller.rs with
// RAILHOOK_URL and RAILHOOK_KEY; exits 0 when every step held.

import { ApiException, Svix } from "svix";

const URL_ = process.env.RAILHOOK_URL;
const KEY = process.env.RAILHOOK_KEY;
const DEADLINE_MS = 120_000;
const MESSAGES = 40;

function check(ok, ...what) {
  if (!ok) throw new Error(`check failed: ${JSON.stringify(what)}`);
}

async function main() {
  const svix = new Svix(KEY, { serverUrl: URL_ });
  const app = (await svix.application.create({ name: "poller-js" })).id;
  const res = await fetch(`${URL_}/api/v1/app/${app}/endpoint`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
    body: JSON.stringify({ type: "poller" }),
  });
  check(res.status === 201, "create poller", res.status);
  const sink = (await res.json()).id;
  for (let i = 0; i < MESSAGES; i++) {
    await svix.message.create(app, { eventType: "order.paid", payload: { n: i } });
  }

  const seen = [];
  const end = Date.now() + DEADLINE_MS;
  while (seen.length < MESSAGES) {
    check(Date.now() < end, "40 messages in time", seen.length);
    const page = await svix.message.poller.consumerPoll(app, sink, "js", { limit: 7 });
    check(page.data.length <= 7, "page size", page.data.length);
    seen.push(...page.data);
    if (page.data.length === 0) await new Promise((r) => setTimeout(r, 200));
  }
  check(
    JSON.stringify(seen.map((m) => m.payload.n)) === JSON.stringify([...Array(MESSAGES).keys()]),
    "in order, once",
    seen.map((m) => m.payload.n),
  );
  const last = await svix.message.poller.consumerPoll(app, sink, "js", { limit: 7 });
  check(last.data.length === 0 && last.done, "nothing more", last);

  const seek = await svix.message.poller.consumerSeek(app, sink, "js", {
    after: seen[20].timestamp,
  });
  check(seek.iterator.startsWith("itr_"), "seek iterator", seek);
  const again = await svix.message.poller.consumerPoll(app, sink, "js", { limit: 100 });
  const first = again.data[0].payload.n;
  check(first <= 20 && again.data.length === MESSAGES - first, "re-read", first, again.data.length);

  try {
    await svix.message.poller.poll(app, sink, { iterator: "garbage" });
    throw new Error("a malformed iterator was accepted");
  } catch (e) {
    check(e instanceof ApiException && e.code === 422, "422", String(e));
  }
}

main().then(
  () => process.exit(0),
  (e) => {
    console.error(e);
    process.exit(1);
  },
);
