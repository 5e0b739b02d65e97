// Drives the customer portal in headless Chromium (Debian's /usr/bin/chromium) as a customer
// would, inside the team's own page on another origin: add an endpoint, reveal its secret,
// send an example and see it delivered, send it again, read the messages and the catalogue,
// rotate the secret, disable and enable. Then: the same link opened again is refused, and a
// page of an origin that is not allowed cannot frame the portal.
//
// Called by tests/it/portal.rs with ALLOWED (the embedding page on an allowed origin),
// REFUSED (the same on an origin that is not), LINK (the one-time link ALLOWED embeds),
// RECEIVER (the receiver's URL) and SCREENSHOTS (a folder). Prints `secret-before …` and
// `secret-after …` for the test to verify signatures with, and `portal ok` at the end.
// Exits non-zero with a message on the first thing that is not as expected.
import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

const { ALLOWED, REFUSED, LINK, RECEIVER, SCREENSHOTS } = process.env;
const TIMEOUT = 30_000;

function check(cond, what) {
  if (!cond) throw new Error(`expected: ${what}`);
}

async function shot(page, name) {
  if (!SCREENSHOTS) return;
  mkdirSync(SCREENSHOTS, { recursive: true });
  await page.screenshot({ path: join(SCREENSHOTS, `${name}.png`), fullPage: true });
}

// Reloads the frame until `probe` is true (pages are server-rendered; a message page on its
// way refreshes itself, this covers the rest).
async function until(frame, probe, what) {
  const deadline = Date.now() + TIMEOUT;
  for (;;) {
    try {
      if (await probe()) return;
    } catch (e) {
      // A probe during the frame's own refresh; try again.
    }
    if (Date.now() > deadline) {
      const seen = await frame.textContent('main').catch(() => '(no page)');
      throw new Error(`timed out waiting for ${what}; the page says: ${seen.replace(/\s+/g, ' ')}`);
    }
    await new Promise((r) => setTimeout(r, 500));
    await frame.goto(frame.url());
  }
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--disable-dev-shm-usage'],
});
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  const cspErrors = [];
  page.on('console', (m) => {
    if (m.type() === 'error' && /Content Security Policy|Refused/.test(m.text())) cspErrors.push(m.text());
  });

  // 1. The team's page frames the portal; the link opens a session inside the frame.
  await page.goto(ALLOWED);
  const frame = await (await page.waitForSelector('iframe#portal')).contentFrame();
  await frame.waitForSelector('#endpoints');
  check(frame.url().includes('/portal/s/') && frame.url().endsWith('/endpoints'), `the session's first page, got ${frame.url()}`);
  check((await frame.textContent('header .brand')) === 'Acme Hooks', 'the project theme names the portal');
  const base = frame.url().replace(/\/endpoints$/, '');
  await shot(page, 'portal-endpoints-empty-desktop');

  // 2. Add an endpoint for one type of the catalogue.
  await frame.click('#add-endpoint');
  await frame.waitForSelector('#endpoint-form');
  check(await frame.isVisible('text=An invoice was paid in full.'), 'the form shows the catalogue with descriptions');
  check((await frame.textContent('details.example pre')).includes('inv_1001'), 'and the type\'s example');
  await shot(page, 'portal-add-endpoint-desktop');
  await frame.fill('#url', RECEIVER);
  await frame.fill('#description', 'Invoices to our ERP');
  await frame.check('input[name=event_types][value="invoice.paid"]');
  await frame.fill('#headers', 'X-Team: billing');
  await Promise.all([frame.waitForURL('**notice=created'), frame.click('#save')]);
  check((await frame.textContent('#notice')).includes('Endpoint added'), 'the endpoint was added');
  const endpointUrl = frame.url().replace(/\?.*$/, '');

  // 3. Reveal the signing secret.
  await frame.click('#reveal');
  await frame.waitForSelector('#secret-value');
  const before = (await frame.textContent('#secret-value')).trim();
  check(before.startsWith('whsec_'), `a whsec_ secret, got ${before}`);
  console.log(`secret-before ${before}`);
  await shot(page, 'portal-endpoint-desktop');

  // 4. Send the type's example and see the request and the receiver's answer.
  await frame.selectOption('#send-example select', 'invoice.paid');
  await frame.click('#send-example button');
  await frame.waitForURL('**/messages/**');
  await until(frame, async () => (await frame.locator('.delivery .status.SUCCEEDED').count()) === 1, 'the example to be delivered');
  check(await frame.locator('.attempts td.SUCCEEDED', { hasText: 'HTTP 200' }).count() >= 1, 'the attempt shows the 200');
  check((await frame.textContent('pre.request-headers')).includes('webhook-signature'), 'the request headers are shown');
  check((await frame.textContent('#payload')).includes('inv_1001'), 'the payload is the example');
  const messageUrl = frame.url().replace(/\?.*$/, '');
  await shot(page, 'portal-message-desktop');

  // 5. Send it again: a new delivery of the same message, delivered too.
  // Each click that loads a page waits for that page's URL: the page before may hold the
  // same elements (a notice), and reading them would race the navigation.
  await Promise.all([frame.waitForURL('**resent=1'), frame.click('.resend')]);
  check((await frame.textContent('#notice')).includes('Sent again'), 'the re-send was accepted');
  await until(frame, async () => (await frame.locator('.delivery .status.SUCCEEDED').count()) === 2, 'the re-send to be delivered');

  // 6. The messages list, filtered, and the catalogue.
  await frame.click('nav >> text=Messages');
  await frame.waitForSelector('#messages');
  check((await frame.locator('#messages tbody tr').count()) === 2, 'two deliveries listed');
  await frame.selectOption('select[name=status]', 'FAILED');
  await Promise.all([frame.waitForURL('**status=FAILED**'), frame.click('form.filters button[type=submit]')]);
  check((await frame.textContent('#messages tbody')).includes('No messages match'), 'the status filter narrows');
  await frame.goto(`${base}/messages`);
  await shot(page, 'portal-messages-desktop');
  await frame.click('nav >> text=Event catalogue');
  await frame.waitForSelector('section.event-type');
  check((await frame.textContent('pre.example')).includes('inv_1001'), 'the catalogue shows the example');
  await shot(page, 'portal-catalogue-desktop');

  // 7. Rotate the secret; disable and enable.
  await frame.goto(endpointUrl);
  await Promise.all([frame.waitForURL('**notice=rotated'), frame.click('#rotate')]);
  await Promise.all([frame.waitForURL('**reveal=1'), frame.click('#reveal')]);
  await frame.waitForSelector('#secret-value');
  const after = (await frame.textContent('#secret-value')).trim();
  check(after.startsWith('whsec_') && after !== before, 'a new secret after rotation');
  console.log(`secret-after ${after}`);
  await Promise.all([frame.waitForURL('**notice=disabled'), frame.click('#disable')]);
  await frame.waitForSelector('#enable');
  check((await frame.textContent('#state')).trim() === 'disabled', 'the endpoint is disabled');
  await Promise.all([frame.waitForURL('**notice=enabled'), frame.click('#enable')]);
  await frame.waitForSelector('#disable');
  await frame.goto(`${base}/endpoints`);
  check((await frame.textContent('#endpoints tbody')).includes('100% of 2'), 'the list shows the success rate');
  await shot(page, 'portal-endpoints-desktop');
  check(cspErrors.length === 0, `no CSP violations: ${cspErrors.join(' | ')}`);

  // 8. Phone width: the same session's pages, opened directly.
  const phone = await browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true });
  const small = await phone.newPage();
  for (const [name, url] of [['endpoints', `${base}/endpoints`], ['endpoint', endpointUrl],
    ['message', messageUrl], ['messages', `${base}/messages`], ['catalogue', `${base}/event-types`]]) {
    await small.goto(url);
    await shot(small, `portal-${name}-phone`);
  }
  await phone.close();

  // 9. The same link again is refused, inside the frame.
  const again = await context.newPage();
  await again.goto(ALLOWED);
  const second = await (await again.waitForSelector('iframe#portal')).contentFrame();
  await second.waitForSelector('#refused');
  check((await second.textContent('#refused')).includes('already used'), 'a link works once');
  check(LINK && !second.url().includes('/portal/s/'), 'no session from a used link');

  // 10. An origin that is not allowed cannot frame the portal.
  const other = await context.newPage();
  const blocked = [];
  other.on('console', (m) => { if (/frame-ancestors/.test(m.text())) blocked.push(m.text()); });
  await other.goto(REFUSED);
  const third = await (await other.waitForSelector('iframe#portal')).contentFrame();
  const deadline = Date.now() + TIMEOUT;
  while (blocked.length === 0 && !third.url().startsWith('chrome-error:') && Date.now() < deadline) {
    await other.waitForTimeout(200);
  }
  check(blocked.length > 0 || third.url().startsWith('chrome-error:'), `the frame was refused (url ${third.url()})`);
  check((await third.$('header .brand')) === null, 'nothing of the portal rendered');
  await shot(other, 'portal-refused-origin-desktop');

  console.log('portal ok');
} finally {
  await browser.close();
}
