// The official Svix JavaScript SDK, unchanged, against a real `railhook all` (issue #37):
// the same scenario as scenario.py. Run by tests/it/svix_sdk.rs with RAILHOOK_URL and
// RAILHOOK_KEY; exits 0 when every step held.

import http from "node:http";
import { ApiException, Svix, Webhook } from "svix";

const URL_ = process.env.RAILHOOK_URL;
const KEY = process.env.RAILHOOK_KEY;
const DEADLINE_MS = 120_000;
const MESSAGES = 200;
const T0 = Date.now();

function step(name) {
  process.stderr.write(`${((Date.now() - T0) / 1000).toFixed(2).padStart(7)}s ${name}\n`);
}

function check(ok, ...what) {
  if (!ok) throw new Error(`check failed: ${JSON.stringify(what)}`);
}

const inbox = new Map();
const failing = new Set();
const of = (path) => inbox.get(path) ?? [];

const server = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    const list = inbox.get(req.url) ?? [];
    list.push({ headers: req.headers, body: Buffer.concat(chunks).toString("utf8") });
    inbox.set(req.url, list);
    res.writeHead(failing.has(req.url) ? 500 : 200, { "content-length": "0" });
    res.end();
  });
});

async function waitFor(what, probe) {
  const end = Date.now() + DEADLINE_MS;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function expectError(status, call) {
  try {
    await call();
  } catch (e) {
    check(e instanceof ApiException, "an ApiException", String(e));
    check(e.code === status, `status ${status}`, e.code, e.body);
    return e;
  }
  throw new Error(`expected an ApiException ${status}, got no error`);
}

async function all(list) {
  const seen = [];
  let iterator;
  for (;;) {
    const page = await list(iterator);
    seen.push(...page.data);
    if (page.done) return seen;
    iterator = page.iterator;
  }
}

async function main() {
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  const receiver = `http://127.0.0.1:${server.address().port}`;
  const started = new Date(Date.now() - 5000);
  const svix = new Svix(KEY, { serverUrl: URL_ });

  step("applications");
  const acme = await svix.application.getOrCreate({ name: "Acme", uid: "acme" });
  const again = await svix.application.getOrCreate({ name: "Acme", uid: "acme" });
  check(again.id === acme.id && acme.id.startsWith("app_"), acme, again);
  const beta = await svix.application.create({ name: "Beta", uid: "beta" });
  check((await svix.application.get("beta")).id === beta.id);
  await expectError(409, () => svix.application.create({ name: "x", uid: "acme" }));
  await expectError(404, () => svix.application.get("nobody"));

  step("event types");
  await svix.eventType.create({
    name: "invoice.paid",
    description: "An invoice was paid",
    schemas: { 1: { type: "object", required: ["amount"], properties: { amount: { type: "number" } } } },
  });
  await svix.eventType.create({ name: "user.created", description: "A user signed up" });
  const types = (await svix.eventType.list()).data.map((t) => t.name);
  check(types.includes("invoice.paid") && types.includes("user.created"), types);

  step("endpoints");
  await expectError(422, () => svix.endpoint.create(acme.id, { url: "not a url" }));
  const epAll = await svix.endpoint.create("acme", { url: `${receiver}/all`, uid: "all" });
  const epInv = await svix.endpoint.create(acme.id, { url: `${receiver}/invoices`, eventTypes: ["invoice.paid"] });
  check(JSON.stringify(epInv.eventTypes) === '["invoice.paid"]', epInv);
  const epEu = await svix.endpoint.create(acme.id, { url: `${receiver}/eu`, channels: ["eu"] });
  const epBeta = await svix.endpoint.create(beta.id, { url: `${receiver}/beta` });
  await expectError(409, () => svix.endpoint.create(acme.id, { url: `${receiver}/dup`, uid: "all" }));
  const secrets = {
    "/all": (await svix.endpoint.getSecret(acme.id, epAll.id)).key,
    "/invoices": (await svix.endpoint.getSecret(acme.id, epInv.id)).key,
    "/eu": (await svix.endpoint.getSecret(acme.id, epEu.id)).key,
    "/beta": (await svix.endpoint.getSecret(beta.id, epBeta.id)).key,
  };

  step("messages");
  const sent = [];
  for (let n = 0; n < MESSAGES; n++) {
    sent.push(
      await svix.message.create(acme.id, {
        eventType: n % 2 === 0 ? "invoice.paid" : "user.created",
        payload: { n, amount: n },
        channels: n % 10 === 0 ? ["eu"] : undefined,
        eventId: `order-${n}`,
      }),
    );
  }
  for (let n = 0; n < 5; n++) {
    await svix.message.create("beta", { eventType: "user.created", payload: { beta: n } });
  }
  await expectError(422, () =>
    svix.message.create(acme.id, { eventType: "invoice.paid", payload: { amount: "ten" } }),
  );
  const first = await svix.message.create(acme.id, { eventType: "user.created", payload: { k: 1 } }, { idempotencyKey: "same-key" });
  const second = await svix.message.create(acme.id, { eventType: "user.created", payload: { k: 1 } }, { idempotencyKey: "same-key" });
  check(first.id === second.id, first.id, second.id);
  const totalAcme = MESSAGES + 1;

  step("waiting for deliveries");
  const expected = { "/all": totalAcme, "/invoices": MESSAGES / 2, "/eu": MESSAGES / 10, "/beta": 5 };
  for (const [path, count] of Object.entries(expected)) {
    await waitFor(`${count} deliveries at ${path}`, () => of(path).length >= count);
  }
  await new Promise((r) => setTimeout(r, 2000));
  for (const [path, count] of Object.entries(expected)) {
    const got = of(path);
    const ids = new Set(got.map((r) => r.headers["webhook-id"]));
    check(got.length === count && ids.size === count, path, got.length, ids.size, count);
    for (const r of got) new Webhook(secrets[path]).verify(r.body, r.headers);
    const bodies = got.map((r) => JSON.parse(r.body));
    if (path === "/invoices") check(bodies.every((b) => b.n % 2 === 0), path);
    if (path === "/eu") check(bodies.every((b) => b.n % 10 === 0), path);
    if (path === "/beta") check(bodies.every((b) => "beta" in b), path);
  }
  let refused = false;
  try {
    new Webhook(secrets["/beta"]).verify(of("/all")[0].body, of("/all")[0].headers);
  } catch {
    refused = true;
  }
  check(refused, "another endpoint's secret must not verify");

  step("lists");
  const msgs = await all((iterator) => svix.message.list(acme.id, { limit: 50, iterator, withContent: true }));
  check(msgs.length === totalAcme && new Set(msgs.map((m) => m.id)).size === totalAcme, msgs.length);
  check(msgs.at(-1).eventId === "order-0" && msgs.at(-1).payload.n === 0, msgs.at(-1));
  check((await svix.message.list(acme.id, { channel: "eu", limit: 100 })).data.length === MESSAGES / 10);
  check((await svix.message.get(acme.id, "order-3")).id === sent[3].id);
  const attempts = await all((iterator) => svix.messageAttempt.listByEndpoint(acme.id, epInv.id, { limit: 30, iterator }));
  check(attempts.length === MESSAGES / 2, attempts.length);
  check(attempts.every((a) => a.responseStatusCode === 200 && a.status === 0), attempts[0]);
  const byMsg = await svix.messageAttempt.listByMsg(acme.id, sent[0].id);
  check(new Set(byMsg.data.map((a) => a.endpointId)).size === 3, byMsg.data);
  const one = await svix.messageAttempt.get(acme.id, sent[0].id, byMsg.data[0].id);
  check(one.msgId === sent[0].id, one);
  const dests = await svix.messageAttempt.listAttemptedDestinations(acme.id, sent[0].id);
  check(dests.data.length === 3, dests.data);
  check((await svix.endpoint.getStats(acme.id, epInv.id)).success === MESSAGES / 2);

  step("resend");
  let before = of("/invoices").length;
  await svix.messageAttempt.resend(acme.id, sent[2].id, epInv.id);
  await waitFor("the resent message", () => of("/invoices").length === before + 1);
  check(JSON.parse(of("/invoices").at(-1).body).n === 2);

  step("rotation");
  await svix.endpoint.rotateSecret(acme.id, epAll.id, {});
  const newSecret = (await svix.endpoint.getSecret(acme.id, epAll.id)).key;
  check(newSecret !== secrets["/all"]);
  before = of("/all").length;
  await svix.message.create(acme.id, { eventType: "user.created", payload: { after: "rotate" } });
  await waitFor("the message after rotation", () => of("/all").length === before + 1);
  new Webhook(newSecret).verify(of("/all").at(-1).body, of("/all").at(-1).headers);

  step("transformation");
  const wrap = "function handler(webhook) { webhook.payload = { wrapped: webhook.payload, type: webhook.eventType }; return webhook; }";
  await expectError(422, () => svix.endpoint.transformation.patch(acme.id, epAll.id, { code: "function handler(" }));
  await svix.endpoint.transformation.patch(acme.id, epAll.id, { code: wrap, enabled: true });
  const shown = await svix.endpoint.transformation.get(acme.id, epAll.id);
  check(shown.code === wrap && shown.enabled === true, shown);
  before = of("/all").length;
  await svix.message.create(acme.id, { eventType: "user.created", payload: { n: "shaped" } });
  await waitFor("the transformed message", () => of("/all").length === before + 1);
  const shaped = of("/all").at(-1);
  new Webhook(newSecret).verify(shaped.body, shaped.headers);
  check(JSON.parse(shaped.body).wrapped.n === "shaped" && JSON.parse(shaped.body).type === "user.created", shaped.body);
  await svix.endpoint.transformation.patch(acme.id, epAll.id, { code: null });
  check((await svix.endpoint.transformation.get(acme.id, epAll.id)).enabled === false);

  step("recover");
  const flaky = await svix.endpoint.create(acme.id, { url: `${receiver}/flaky`, eventTypes: ["user.created"] });
  failing.add("/flaky");
  for (let n = 0; n < 3; n++) {
    await svix.message.create(acme.id, { eventType: "user.created", payload: { flaky: n } });
  }
  await waitFor("three failed deliveries", async () => (await svix.endpoint.getStats(acme.id, flaky.id)).fail === 3);
  failing.delete("/flaky");
  await svix.endpoint.recover(acme.id, flaky.id, { since: started });
  await waitFor("the recovered deliveries", async () => (await svix.endpoint.getStats(acme.id, flaky.id)).success === 3);
  const flakySeen = new Set(of("/flaky").map((r) => JSON.parse(r.body).flaky));
  check(flakySeen.size === 3, [...flakySeen]);

  step("expunge");
  await svix.message.expungeContent(acme.id, sent[5].id);
  check(JSON.stringify((await svix.message.get(acme.id, sent[5].id)).payload) === "{}");

  step("portal access");
  // A portal link opens a read-only session once; logout with its token ends it.
  const access = await svix.authentication.appPortalAccess(acme.id, { readOnly: true, expiry: 600 });
  check(access.url.includes("/portal/access/"), access.url);
  const opened = await fetch(access.url); // follows the redirect into the session
  check(opened.status === 200 && opened.url.includes("/portal/s/"), opened.url);
  check((await opened.text()).includes("read-only"), "a read-only session");
  await new Svix(access.token, { serverUrl: URL_ }).authentication.logout();
  check((await fetch(opened.url)).status === 401, "the session ended at logout");
  check((await fetch(access.url)).status === 410, "the link works once");
  await svix.authentication.expireAll(acme.id, {});

  step("delete");
  await svix.application.delete(beta.id);
  await expectError(404, () => svix.endpoint.list(beta.id));
  const err = await expectError(501, () => svix.backgroundTask.list());
  const body = typeof err.body === "string" ? JSON.parse(err.body) : err.body;
  check(body.code === "not_supported_by_this_server", body);
  step("svix js sdk scenario: ok");
  server.close();
}

main().catch((e) => {
  process.stderr.write(`${e.stack ?? e}\n`);
  process.exit(1);
});
