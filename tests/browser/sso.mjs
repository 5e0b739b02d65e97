// Single sign-on in headless Chromium (tests/it/sso.rs): from the dashboard's sign-in page
// through the real OpenID Connect provider (tests/sso/provider.mjs) and back. Env: BASE,
// ACCOUNT (the provider's account to sign in as), EXPECT ("signed-in", "refused" for an
// unmapped person, "unverified" for an ID token that fails its checks), and
// REPLAY=1 to open the callback URL a second time after signing in.
// Prints "sso ok" and what it saw; exits non-zero on the first surprise.
import { chromium } from 'playwright-core';

const { BASE, ACCOUNT, EXPECT, REPLAY } = process.env;
const TIMEOUT = 30_000;

function check(cond, what) {
  if (!cond) throw new Error(`expected: ${what}`);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage();
  page.setDefaultTimeout(TIMEOUT);
  let callback = null;
  page.on('request', (r) => {
    if (r.url().includes('/dashboard/sso/callback')) callback = r.url();
  });
  await page.goto(`${BASE}/dashboard/login`);
  check(await page.locator('#api_key').count() === 0, 'no key form when key sign-in is off');
  await page.click('#sso');
  // The provider's development login form, then its consent form.
  await page.waitForSelector('input[name="login"]');
  await page.fill('input[name="login"]', ACCOUNT);
  await page.fill('input[name="password"]', 'any');
  const submit = () =>
    Promise.all([page.waitForNavigation(), page.click('button[type="submit"]')]);
  await submit();
  // The consent form, the first time an account meets this client.
  for (let i = 0; i < 3 && !page.url().startsWith(BASE); i++) {
    await page.waitForSelector('button[type="submit"]');
    await submit();
  }
  await page.waitForURL((u) => u.toString().startsWith(BASE));
  await page.waitForLoadState();
  const text = await page.textContent('body');
  if (EXPECT === 'signed-in') {
    check(page.url().endsWith('/dashboard/deliveries'), `the deliveries page, not ${page.url()}`);
    check(text.includes('operator') || text.includes('admin'), `the role in the header: ${text}`);
    console.log(`signed in: ${text.includes('admin') ? 'admin' : 'operator'}`);
    if (REPLAY) {
      check(callback, 'the callback URL was seen');
      const again = await page.goto(callback);
      const replayed = await page.textContent('body');
      check(again.status() === 403, `a replayed callback is refused, got ${again.status()}`);
      check(replayed.includes('already used'), `the refusal says why: ${replayed}`);
      console.log('replay refused');
    }
  } else if (EXPECT === 'unverified') {
    check(text.includes('could not be verified'), `an ID token that fails its checks is refused: ${text}`);
    console.log(`unverified: ${text.trim().slice(0, 240)}`);
  } else {
    check(text.includes('no rule gives you a role'), `an unmapped person is refused: ${text}`);
    console.log('refused');
  }
  console.log('sso ok');
} finally {
  await browser.close();
}
