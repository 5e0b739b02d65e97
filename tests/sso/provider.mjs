// A real OpenID Connect provider (node-oidc-provider, pinned in package.json) for the
// dashboard's single sign-on test (tests/it/sso.rs). Its development login form signs in
// any account id; the accounts below give the claims the test maps to roles. Settings come
// from the environment; it prints "ready" once it listens.
import { createPrivateKey } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { SignJWT } from 'jose';
import Provider from 'oidc-provider';

const port = Number(process.env.PORT);
const issuer = `http://127.0.0.1:${port}`;
const accounts = {
  alice: { email: 'alice@example.com', groups: ['platform'] },
  olga: { email: 'olga@example.com', groups: ['oncall'] },
  bob: { email: 'bob@elsewhere.example', groups: [] },
};

// Its signing key (the throwaway test key of ingest/testdata), so that the hostile modes
// below can sign tokens the provider's own published keys verify.
const pem = readFileSync(new URL('../../ingest/testdata/oidc_test_key.pem', import.meta.url));
const signingKey = createPrivateKey(pem);
const jwk = { ...signingKey.export({ format: 'jwk' }), kid: 'sso-test', alg: 'RS256', use: 'sig' };

const provider = new Provider(issuer, {
  jwks: { keys: [jwk] },
  clients: [{
    client_id: process.env.CLIENT_ID,
    client_secret: process.env.CLIENT_SECRET,
    redirect_uris: [process.env.REDIRECT_URI],
    grant_types: ['authorization_code'],
    response_types: ['code'],
  }],
  // The claims go in the ID token itself, where Railhook reads them.
  conformIdTokenClaims: false,
  claims: { openid: ['sub', 'groups'], email: ['email', 'email_verified'], profile: ['name'] },
  findAccount: async (_ctx, id) => ({
    accountId: id,
    claims: async () => ({
      sub: id,
      email: accounts[id]?.email ?? `${id}@unknown.example`,
      email_verified: true,
      groups: accounts[id]?.groups ?? [],
      name: id,
    }),
  }),
  cookies: { keys: ['railhook-sso-test-cookie-key'] },
  features: { devInteractions: { enabled: true } },
});
// The hostile answers the test asks for (GET /test-mode/<mode>): the token endpoint's ID
// token re-signed with this provider's own key but for another audience, already expired,
// or with another nonce; or changed after signing ("tampered"). "honest" turns them off.
let mode = 'honest';
provider.use(async (ctx, next) => {
  const set = ctx.path.match(/^\/test-mode\/(\w+)$/);
  if (set) {
    mode = set[1];
    ctx.body = { mode };
    return;
  }
  await next();
  if (ctx.path !== '/token' || mode === 'honest' || !ctx.body?.id_token) return;
  const [header, payload, signature] = ctx.body.id_token.split('.');
  const claims = JSON.parse(Buffer.from(payload, 'base64url'));
  if (mode === 'tampered') {
    claims.sub = 'mallory';
    const changed = Buffer.from(JSON.stringify(claims)).toString('base64url');
    ctx.body.id_token = [header, changed, signature].join('.');
    return;
  }
  const now = Math.floor(Date.now() / 1000);
  if (mode === 'audience') claims.aud = 'someone-else';
  if (mode === 'expired') Object.assign(claims, { iat: now - 1200, exp: now - 600 });
  if (mode === 'nonce') claims.nonce = 'a-nonce-from-another-sign-in';
  ctx.body.id_token = await new SignJWT(claims)
    .setProtectedHeader(JSON.parse(Buffer.from(header, 'base64url')))
    .sign(signingKey);
});

provider.proxy = false;
provider.listen(port, '127.0.0.1', () => console.log('ready'));
