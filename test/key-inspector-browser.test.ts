// @module-tag redis
/**
 * The key inspector in a real browser: Debian's headless Chromium (`/usr/bin/chromium`, or
 * `CHROMIUM_PATH`) driven by playwright-core, which downloads no browser; without one, the
 * tests are skipped outside CI (support/system-tools.ts). One browser for the
 * file, a fresh context (so a fresh sessionStorage) per test. `INSPECTOR_SCREENSHOT=<file.png>`
 * also saves the key page as shown (the picture in docs/observability.md).
 */
import { Queue } from 'bullmq';
import { sql } from 'kysely';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, expect, it as anyIt } from 'vitest';
import { IdempotencyKeys, JobSteps, createHttpApi, type HttpApi } from '../src/index.js';
import { systemToolForTests } from './support/system-tools.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const CHROMIUM = systemToolForTests('chromium');
/** Every test here drives Chromium: without it (outside CI) each is skipped, and so are the hooks. */
const it = anyIt.skipIf(CHROMIUM === undefined);
const ADMIN = 'adm_alice_0123456789abcdef';
const TENANT = 'tok_acme_0123456789abcdef';
const HOSTILE_KEY = '<script>alert(1)</script>';
const HOSTILE_RESULT = { html: '<img src=x onerror=alert(2)>' };

let env: TestEnv;
let keys: IdempotencyKeys;
let api: HttpApi;
let baseUrl: string;
let queue: Queue;
let browser: Browser;
let context: BrowserContext | undefined;

beforeAll(async () => {
  env = await createTestEnv('key-inspector-browser');
  keys = new IdempotencyKeys({ db: env.db, schema: env.schema, retentionMs: 3_600_000 });
  api = await createHttpApi({
    keys,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    queues: ['payments'],
    tokens: { [TENANT]: 'acme' },
    adminTokens: { [ADMIN]: 'alice' },
    relay: false,
    logger: pino({ level: 'silent' }),
  });
  baseUrl = await api.listen({ host: '127.0.0.1', port: 0 });

  // A completed key with two steps, a stuck one (its worker died: lease ended long ago), and a
  // key and result that are markup.
  const fp = (key: string) => keys.fingerprint({ key });
  const paid = await keys.claim('acme', 'order-42', fp('order-42'), { jobId: 'job-order-42', queue: 'payments', jobName: 'charge' });
  if (paid.kind !== 'claimed') throw new Error(`setup: ${paid.kind}`);
  const steps = new JobSteps(keys, paid, new AbortController().signal);
  await steps.run('reserve-stock', { transaction: async () => ({ items: 2 }) });
  await steps.run('charge-card', async () => ({ chargeId: 'ch_3Kx9' }));
  await keys.runEffect(paid, async () => ({ receipt: 'r-42', amount: 1999 }));
  // Its BullMQ job, still waiting (no worker runs in this file).
  queue = new Queue('payments', { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  await queue.add('charge', { order: 42 }, { jobId: 'job-order-42' });
  const stuck = await keys.claim('acme', 'order-7', fp('order-7'), { jobId: 'job-order-7', queue: 'payments', jobName: 'charge' });
  if (stuck.kind !== 'claimed') throw new Error(`setup: ${stuck.kind}`);
  await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '20 minutes' where key = 'order-7'`.execute(env.db);
  const hostile = await keys.claim('acme', HOSTILE_KEY, fp(HOSTILE_KEY));
  if (hostile.kind !== 'claimed') throw new Error(`setup: ${hostile.kind}`);
  await keys.runEffect(hostile, async () => HOSTILE_RESULT);

  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
});

afterEach(async () => {
  await context?.close();
  context = undefined;
});

afterAll(async () => {
  await browser?.close();
  await queue?.close();
  await api?.close();
  await env?.teardown();
});

/** A fresh tab (fresh sessionStorage) on the inspector; fails the test on any dialog (an alert() that ran). */
async function openInspector(route = ''): Promise<{ page: Page; dialogs: string[] }> {
  context = await browser.newContext();
  const page = await context.newPage();
  const dialogs: string[] = [];
  page.on('dialog', (dialog) => {
    dialogs.push(dialog.message());
    void dialog.dismiss();
  });
  await page.goto(`${baseUrl}/ui${route}`);
  return { page, dialogs };
}

async function enterToken(page: Page, token: string): Promise<void> {
  await page.locator('#token-form input[name=token]').fill(token);
  await page.locator('#token-form button[type=submit]').click();
}

it('is refused without the admin token: none, an unknown one, or a tenant token', async () => {
  const { page } = await openInspector();
  // /ui redirects to /ui/, which asks for the token.
  expect(new URL(page.url()).pathname).toBe('/ui/');
  await expect.poll(() => page.locator('main [data-kind=unauthorized]').count()).toBe(1);
  expect(await page.locator('#token-form').isVisible()).toBe(true);
  expect(await page.locator('main').textContent()).toContain('needs an admin token');
  for (const token of ['adm_wrong_0123456789abcdef', TENANT]) {
    await enterToken(page, token);
    await expect.poll(() => page.locator('#token-form').isVisible()).toBe(true);
    expect(await page.locator('main [data-kind=unauthorized]').count()).toBe(1);
    expect(await page.locator('[data-view=overview]').count()).toBe(0);
  }
});

it('opens the overview, searches a key and shows its page: status, job, steps and result', async () => {
  const { page } = await openInspector('/');
  await enterToken(page, ADMIN);
  await page.locator('[data-view=overview]').waitFor();
  expect(await page.locator('#token-form').isVisible()).toBe(false);
  expect(await page.locator('[data-count=processing]').textContent()).toBe('1');
  expect(await page.locator('[data-count=completed]').textContent()).toBe('2');
  expect(await page.locator('[data-count=expired-leases]').textContent()).toBe('1');
  expect(await page.locator('[data-view=overview] table.keys').first().textContent()).toContain('order-7');

  await page.locator('#search input[name=scope]').fill('acme');
  await page.locator('#search input[name=key]').fill('order-42');
  await page.locator('#search button[type=submit]').click();
  await page.locator('[data-view=key]').waitFor();
  expect(page.url()).toContain('#/key?scope=acme&key=order-42');
  expect(await page.locator('.key-name').textContent()).toBe('order-42');
  expect(await page.locator('[data-field=status]').textContent()).toBe('completed');
  expect(await page.locator('[data-field=fence]').textContent()).toBe('1');
  expect(await page.locator('[data-field=job-id]').textContent()).toBe('job-order-42');
  expect(await page.locator('[data-field=queue]').textContent()).toBe('payments');
  expect(await page.locator('[data-field=job-state]').textContent()).toBe('waiting');
  expect(JSON.parse((await page.locator('pre[data-field=result]').textContent())!)).toEqual({ receipt: 'r-42', amount: 1999 });
  const steps = page.locator('table.steps tbody tr');
  expect(await steps.count()).toBe(2);
  expect(await steps.nth(0).getAttribute('data-step')).toBe('reserve-stock');
  expect(await steps.nth(1).textContent()).toContain('ch_3Kx9');
  if (process.env.INSPECTOR_SCREENSHOT) await page.screenshot({ path: process.env.INSPECTOR_SCREENSHOT, fullPage: true });

  // Back goes to the overview: the views are routes in the address.
  await page.goBack();
  await page.locator('[data-view=overview]').waitFor();
});

it('releases a stuck key with a reason, shows who released it and why, and then its takeover', async () => {
  const { page } = await openInspector('/');
  await enterToken(page, ADMIN);
  await page.locator('[data-view=overview]').waitFor();
  await page.locator('header nav a', { hasText: 'Processing' }).click();
  await page.locator('[data-view=list]').waitFor();
  await page.locator('table.keys a', { hasText: 'order-7' }).click();
  await page.locator('[data-view=key]').waitFor();
  expect(await page.locator('[data-field=lease]').textContent()).toMatch(/ended .* ago/);

  await page.locator('form.release textarea[name=reason]').fill('worker host lost; re-running');
  await page.locator('form.release button[type=submit]').click();
  await page.locator('.notice-done').waitFor();
  expect(await page.locator('.notice-done').textContent()).toContain('Released by alice (was processing)');
  expect(await page.locator('[data-field=owner]').textContent()).toContain('none');
  const audit = page.locator('table.audit tbody tr');
  expect(await audit.count()).toBe(1);
  expect(await audit.locator('.actor').textContent()).toBe('alice');
  expect(await audit.locator('.reason').textContent()).toBe('worker host lost; re-running');

  // A worker's next claim takes the key over; the page shows the new fence and attempt.
  const takeover = await keys.claim('acme', 'order-7', keys.fingerprint({ key: 'order-7' }), { jobId: 'job-order-7', queue: 'payments', jobName: 'charge' });
  expect(takeover).toMatchObject({ kind: 'taken-over', fence: 2 });
  await page.reload();
  await page.locator('[data-view=key]').waitFor();
  expect(await page.locator('[data-field=fence]').textContent()).toBe('2');
  expect(await page.locator('[data-field=attempts]').textContent()).toBe('2');
  expect(await page.locator('[data-field=owner]').textContent()).toBe(takeover.kind === 'taken-over' ? takeover.owner : '');
  expect(await page.locator('table.audit .reason').textContent()).toBe('worker host lost; re-running');
});

it('shows a hostile key and result as text: no script runs, no element is injected', async () => {
  const route = `/#/key?${new URLSearchParams({ scope: 'acme', key: HOSTILE_KEY })}`;
  const { page, dialogs } = await openInspector(route);
  await enterToken(page, ADMIN);
  await page.locator('[data-view=key]').waitFor();
  expect(await page.locator('.key-name').textContent()).toBe(HOSTILE_KEY);
  expect(JSON.parse((await page.locator('pre[data-field=result]').textContent())!)).toEqual(HOSTILE_RESULT);
  expect(await page.locator('main script, main img').count()).toBe(0);
  // It is listed on the overview too (recent keys are links with the key as text).
  await page.locator('header h1 a').click();
  await page.locator('[data-view=overview]').waitFor();
  expect(await page.locator('main img, main script').count()).toBe(0);
  expect(dialogs).toEqual([]);
});
