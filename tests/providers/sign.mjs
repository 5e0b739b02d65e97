// Signs a webhook body (stdin) the way the provider does, with the provider's own library,
// and prints the signature header's value. Used by tests/incoming.rs.
//   node sign.mjs github <secret>              -> X-Hub-Signature-256
//   node sign.mjs stripe <secret> [timestamp]  -> Stripe-Signature
//   node sign.mjs shopify <secret>             -> X-Shopify-Hmac-Sha256 (Shopify publishes
//     no signing library; this is its documented recipe: base64 HMAC-SHA256 of the body)
import { createHmac } from "node:crypto";
import { readFileSync } from "node:fs";
import { sign } from "@octokit/webhooks-methods";
import Stripe from "stripe";

const [provider, secret, timestamp] = process.argv.slice(2);
const body = readFileSync(0, "utf8");
if (provider === "github") {
  process.stdout.write(await sign(secret, body));
} else if (provider === "stripe") {
  const stripe = new Stripe("sk_test_unused");
  const header = stripe.webhooks.generateTestHeaderString({
    payload: body,
    secret,
    ...(timestamp ? { timestamp: Number(timestamp) } : {}),
  });
  process.stdout.write(header);
} else if (provider === "shopify") {
  process.stdout.write(createHmac("sha256", secret).update(body, "utf8").digest("base64"));
} else {
  console.error(`unknown provider ${provider}`);
  process.exit(2);
}
