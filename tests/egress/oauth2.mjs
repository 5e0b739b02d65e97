// A real OAuth2 provider and a receiver that accepts only its tokens, for tests/it/egress.rs.
//
//   node oauth2.mjs issuer <port> <dir>     oauth2-mock-server on 127.0.0.1:<port> (0: any)
//   node oauth2.mjs receiver <issuer> <dir> a webhook receiver checking bearer tokens
//
// Each prints "READY <port>" once listening, then one JSON line per request it served.
// The test steers both through files in <dir>:
//   ttl         the life of the next tokens in seconds (default 3600)
//   revoked     client ids the provider refuses with 401 invalid_client
//   not_before  the receiver refuses tokens issued before this Unix time (seconds)
// The signing key is kept in <dir>/key.json, so a restarted provider signs with it again.
import { readFileSync, writeFileSync, existsSync } from 'node:fs';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { OAuth2Server, Events } from 'oauth2-mock-server';
import { createRemoteJWKSet, jwtVerify } from 'jose';

const [mode, arg, dir] = process.argv.slice(2);
const read = (name, fallback) => {
  const path = join(dir, name);
  return existsSync(path) ? readFileSync(path, 'utf8').trim() : fallback;
};
const log = (line) => process.stdout.write(JSON.stringify(line) + '\n');

function clientOf(req) {
  const header = req.headers.authorization ?? '';
  if (header.startsWith('Basic ')) {
    const pair = Buffer.from(header.slice(6), 'base64').toString();
    return decodeURIComponent(pair.split(':')[0].replace(/\+/g, ' '));
  }
  return req.body?.client_id;
}

async function issuer() {
  const server = new OAuth2Server();
  const keyFile = join(dir, 'key.json');
  if (existsSync(keyFile)) {
    await server.issuer.keys.add(JSON.parse(readFileSync(keyFile, 'utf8')));
  } else {
    const key = await server.issuer.keys.generate('RS256');
    writeFileSync(keyFile, JSON.stringify(key));
  }
  server.service.on(Events.BeforeTokenSigning, (token, req) => {
    const ttl = Number(read('ttl', '3600'));
    token.payload.exp = token.payload.iat + ttl;
    token.payload.client_id = clientOf(req);
  });
  server.service.on(Events.BeforeResponse, (response, req) => {
    const client = clientOf(req);
    const revoked = read('revoked', '').split(/\s+/).filter(Boolean);
    const refused = revoked.includes(client);
    if (refused) {
      response.statusCode = 401;
      response.body = { error: 'invalid_client', error_description: 'the client is revoked' };
    } else {
      response.body.expires_in = Number(read('ttl', '3600'));
    }
    log({ token_request: client, grant_type: req.body?.grant_type, scope: req.body?.scope,
          audience: req.body?.audience, refused });
  });
  await server.start(Number(arg), '127.0.0.1');
  console.log(`READY ${server.address().port}`);
}

async function receiver() {
  const jwks = createRemoteJWKSet(new URL(`${arg}/jwks`), { cooldownDuration: 0 });
  const http = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      const header = req.headers.authorization ?? '';
      let status = 401;
      let client = null;
      try {
        // The provider names itself by "localhost" whatever address it listens on.
        const issuer = `http://localhost:${new URL(arg).port}`;
        const { payload } = await jwtVerify(header.replace(/^Bearer /, ''), jwks, { issuer });
        client = payload.client_id;
        status = payload.iat <= Number(read("not_before", "0")) ? 401 : 200;
      } catch (e) {
        status = 401;
        client = String(e.code ?? e);
      }
      log({ status, client, webhook_id: req.headers['webhook-id'] ?? null,
            body: Buffer.concat(chunks).toString() });
      res.writeHead(status, { 'content-type': 'text/plain' });
      res.end(status === 200 ? 'ok' : 'invalid token');
    });
  });
  http.listen(0, '127.0.0.1', () => console.log(`READY ${http.address().port}`));
}

await (mode === 'issuer' ? issuer() : receiver());
