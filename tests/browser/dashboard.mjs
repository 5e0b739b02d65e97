// Drives the dashboard in headless Chromium (Debian's /usr/bin/chromium) the way a person
// would: sign in, find a failed delivery, retry it and see it succeed, run a Time Machine
// replay and watch it finish, and look at the endpoints and relay pages.
//
// Called by tests/dashboard.rs with BASE, API_KEY, FAILED_DELIVERY, FROM, TO and
// optionally SCREENSHOTS (a folder; docs/screenshots when refreshing the docs).
// Exits non-zero with a message on the first thing that is not as expected.
import { chromium } from 'playwright-core';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

const { BASE, API_KEY, FAILED_DELIVERY, FROM, TO, SCREENSHOTS } = process.env;
const TIMEOUT = 30_000;

function check(cond, what) {
  if (!cond) throw new Error(`expected: ${what}`);
}

async function shot(page, name) {
  if (!SCREENSHOTS) return;
  mkdirSync(SCREENSHOTS, { recursive: true });
  await page.screenshot({ path: join(SCREENSHOTS, `${name}.png`), fullPage: true });
}

// Reloads until `probe` is true (the pages are server-rendered; there is no live update
// except the replay page's own refresh).
async function until(page, probe, what) {
  const deadline = Date.now() + TIMEOUT;
  for (;;) {
    if (await probe()) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await page.waitForTimeout(300);
    await page.reload();
  }
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--disable-dev-shm-usage'],
});
try {
  const context = await browser.newContext({ viewport: { width: 1360, height: 900 } });
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  const consoleErrors = [];
  // Resource errors are expected (the wrong key's 401, the absent favicon); a page that
  // breaks its own Content-Security-Policy is not.
  page.on('console', (m) => {
    if (m.type() === 'error' && /Content Security Policy|Refused/.test(m.text())) consoleErrors.push(m.text());
  });

  // 1. Signed out: any page leads to the sign-in form.
  await page.goto(`${BASE}/dashboard/`);
  check(page.url().endsWith('/dashboard/login'), `redirect to sign-in, got ${page.url()}`);
  await shot(page, 'login');
  await page.fill('#api_key', 'rh_wrong_key');
  await page.click('button[type=submit]');
  check(await page.locator('.error').isVisible(), 'a wrong key is refused');
  await page.fill('#api_key', API_KEY);
  await page.click('button[type=submit]');
  await page.waitForURL('**/dashboard/deliveries');
  const cookies = await context.cookies();
  const session = cookies.find((c) => c.name === 'railhook_session');
  check(session && session.httpOnly && session.sameSite === 'Strict', 'an HttpOnly SameSite=Strict session cookie');
  check(!cookies.some((c) => c.value.includes(API_KEY)), 'the API key is not kept in a cookie');

  // 2. Deliveries: the failed one is listed; the status filter narrows to it.
  check(await page.locator(`#deliveries >> text=${FAILED_DELIVERY}`).count() === 1, 'the failed delivery is listed');
  await shot(page, 'deliveries');
  await page.selectOption('select[name=status]', 'FAILED');
  await page.click('form.filters button[type=submit]');
  const rows = await page.locator('#deliveries tbody tr').count();
  check(rows === 1, `one FAILED delivery after filtering, saw ${rows}`);

  // 3. Failed messages: retry it and see it succeed.
  await page.click('nav >> text=Failed messages');
  const row = page.locator('#failed tbody tr', { hasText: FAILED_DELIVERY });
  check(await row.count() === 1, 'the delivery is among the failed messages');
  check(await row.locator('text=400').count() >= 1, 'its last status code is shown');
  await shot(page, 'failed-messages');
  await row.locator('button.retry').click();
  await page.waitForURL(`**/dashboard/deliveries/${FAILED_DELIVERY}`);
  await until(page, async () => (await page.locator('td.status').first().innerText()) === 'SUCCEEDED',
    'the retried delivery to succeed');
  check(await page.locator('#attempts tbody tr').count() === 2, 'two attempts: the 400 and the 200');
  check(await page.locator('pre >> text=webhook-id').count() === 1, 'the request headers are shown');
  await shot(page, 'delivery');

  // 4. Time Machine: preview, replay, watch progress to the end.
  await page.click('nav >> text=Time Machine');
  await page.fill('#from', FROM);
  await page.fill('#to', TO);
  await page.click('#preview');
  const preview = await page.locator('#preview-count').innerText();
  check(/^\d+ events/.test(preview) && !preview.startsWith('0 '), `a preview count, got "${preview}"`);
  const expected = parseInt(preview, 10);
  await shot(page, 'time-machine');
  await page.click('#replay');
  await page.waitForURL(/\/dashboard\/replays\/rpl_/);
  // The page refreshes itself while the replay runs.
  await page.waitForFunction(
    () => document.querySelector('#replay-status')?.textContent === 'COMPLETED',
    null, { timeout: TIMEOUT, polling: 250 });
  const progress = await page.locator('#replay-progress').innerText();
  check(progress.includes(`${expected} / ${expected} events`), `progress ${expected}/${expected}, got "${progress}"`);
  await shot(page, 'replay');

  // 5. Endpoints and the relay.
  await page.click('nav >> text=Endpoints');
  check(await page.locator('#endpoints tbody tr').count() >= 1, 'endpoints are listed');
  await shot(page, 'endpoints');
  await page.click('nav >> text=Relay');
  await until(page, async () => (await page.locator('#relay').count()) === 1, 'the relay page to show the slot');
  check((await page.locator('#lag-bytes').innerText()).length > 0, 'slot lag in bytes');
  await shot(page, 'relay');

  // 6. Sign out ends the session.
  await page.click('header button[type=submit]');
  await page.waitForURL('**/dashboard/login');
  await page.goto(`${BASE}/dashboard/deliveries`);
  check(page.url().endsWith('/dashboard/login'), 'signed out');
  check(consoleErrors.length === 0, `no Content-Security-Policy violations: ${consoleErrors.join('; ')}`);
  console.log(`dashboard ok: retried ${FAILED_DELIVERY}, replayed ${expected} events`);
} finally {
  await browser.close();
}
