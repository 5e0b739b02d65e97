// A real OpenID Connect provider (node-oidc-provider, pinned in package.json) for the
// dashboard's single sign-on test (tests/it/sso.rs). Its development login form signs in
// any account id; the accounts below give the claims the test maps to roles. Settings come
// from the environment; it prints "ready" once it listens.
import Provider from 'oidc-provider';

const port = Number(process.env.PORT);
const issuer = `http://127.0.0.1:${port}`;
const accounts = {
  alice: { email: 'alice@example.com', groups: ['platform'] },
  olga: { email: 'olga@example.com', groups: ['oncall'] },
  bob: { email: 'bob@elsewhere.example', groups: [] },
};

const provider = new Provider(issuer, {
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
provider.proxy = false;
provider.listen(port, '127.0.0.1', () => console.log('ready'));
