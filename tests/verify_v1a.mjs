// Verifies one received webhook's v1a (Ed25519) signature with Node's own crypto, never with
// Railhook's code. Usage: node verify_v1a.mjs whpk_... < request.json, where request.json is
// {"headers": {...}, "body": "..."}. Exits 0 when one v1a entry verifies, 1 otherwise.
import { createPublicKey, verify } from 'node:crypto';
import { readFileSync } from 'node:fs';

const publicKey = process.argv[2];
const { headers, body } = JSON.parse(readFileSync(0, 'utf8'));
const raw = Buffer.from(publicKey.replace(/^whpk_/, ''), 'base64');
const key = createPublicKey({
  key: { kty: 'OKP', crv: 'Ed25519', x: raw.toString('base64url') },
  format: 'jwk',
});
const signed = Buffer.from(`${headers['webhook-id']}.${headers['webhook-timestamp']}.${body}`);
const ok = headers['webhook-signature'].split(' ').some((entry) => {
  const [version, signature] = entry.split(',');
  return version === 'v1a' && verify(null, signed, key, Buffer.from(signature, 'base64'));
});
process.exit(ok ? 0 : 1);
