// @module-tag redis
/**
 * The Bull Board adapter in a real browser (Debian's Chromium driven by playwright-core, as the
 * key inspector's browser test does): Bull Board's own page, mounted in Express, lists the jobs
 * of a key run twice with the key's state in their names, shows the key in the job's Progress
 * tab (one effect, the other job's replay), renders a hostile key as text, and links each job to
 * its key's page in the key inspector, served by the HTTP API with its admin tokens.
 * `BULL_BOARD_SCREENSHOT=<file.png>` also saves the job page as shown.
 */
import type { AddressInfo } from 'node:net';
import { createBullBoard } from '@bull-board/api';
import { ExpressAdapter } from '@bull-board/express';
import express from 'express';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, expect, it as anyIt } from 'vitest';
import { IdempotentJobsAdapter } from '../src/bull-board/index.js';
import { createHttpApi, type HttpApi } from '../src/index.js';
import { HOSTILE_KEY, boardFixture, type BoardFixture } from './support/bull-board-fixture.js';
import { systemToolForTests } from './support/system-tools.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const CHROMIUM = systemToolForTests('chromium');
const it = anyIt.skipIf(CHROMIUM === undefined);
const ADMIN = 'adm_board_0123456789abcdef';
const QUEUE = 'board-browser';

let env: TestEnv;
let fixture: BoardFixture;
let api: HttpApi;
let boardUrl: string;
let closeBoard: () => Promise<void>;
let browser: Browser;
let context: BrowserContext | undefined;

beforeAll(async () => {
  if (CHROMIUM === undefined) return;
  env = await createTestEnv('bull-board-browser');
  fixture = await boardFixture(env, QUEUE, { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  api = await createHttpApi({
    keys: fixture.keys,
    connection: { url: env.redisUrl },
    prefix: env.redisPrefix,
    queues: [QUEUE],
    adminTokens: { [ADMIN]: 'alice' },
    relay: false,
    logger: pino({ level: 'silent' }),
  });
  const inspectorUrl = `${await api.listen({ host: '127.0.0.1', port: 0 })}/ui/`;
  const serverAdapter = new ExpressAdapter();
  serverAdapter.setBasePath('/admin/queues');
  createBullBoard({ queues: [new IdempotentJobsAdapter(fixture.queue, { keys: fixture.keys, inspectorUrl })], serverAdapter });
  const app = express();
  app.use('/admin/queues', serverAdapter.getRouter());
  const server = app.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  boardUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/admin/queues`;
  closeBoard = () => new Promise((resolve) => server.close(() => resolve()));
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
}, 120_000);

afterEach(async () => {
  await context?.close();
  context = undefined;
});

afterAll(async () => {
  await browser?.close();
  await closeBoard?.();
  await api?.close();
  await fixture?.close();
  await env?.teardown();
});

/** A fresh browser tab; fails the test on any dialog (an alert() that ran). */
async function openTab(url: string): Promise<{ page: Page; dialogs: string[] }> {
  context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  const page = await context.newPage();
  const dialogs: string[] = [];
  page.on('dialog', (dialog) => {
    dialogs.push(dialog.message());
    void dialog.dismiss();
  });
  await page.goto(url);
  return { page, dialogs };
}

it("Bull Board's page lists the key run twice: the job that ran it and the one that replayed it, one effect", async () => {
  const { page, dialogs } = await openTab(`${boardUrl}/queue/${QUEUE}?status=completed`);
  await page.getByText('charge · key completed, fence 1').first().waitFor();
  await page.getByText('charge · key completed by another job (replayed)').first().waitFor();
  expect(await fixture.effectsOfOrder1()).toBe(1);

  await page.goto(`${boardUrl}/queue/${QUEUE}/b`);
  await page.getByRole('button', { name: 'Progress' }).or(page.getByText('Progress', { exact: true })).first().click();
  await page.getByText("replays job a's run", { exact: false }).first().waitFor();
  const text = await page.locator('body').innerText();
  expect(text).toContain('key:"order-1"');
  expect(text).toContain('fence:1');
  expect(text).toContain('receipt:"r-order-1"');
  if (process.env.BULL_BOARD_SCREENSHOT) await page.screenshot({ path: process.env.BULL_BOARD_SCREENSHOT, fullPage: true });
  expect(dialogs).toEqual([]);
});

it('a hostile key renders as text in the job view', async () => {
  const { page, dialogs } = await openTab(`${boardUrl}/queue/${QUEUE}/h`);
  await page.getByText('Progress', { exact: true }).first().click();
  await page.getByText(HOSTILE_KEY, { exact: false }).first().waitFor();
  expect(await page.locator('img[src="x"]').count()).toBe(0);
  expect(dialogs).toEqual([]);
});

it("a job's link opens its key's page in the key inspector, behind the inspector's admin token", async () => {
  const { page, dialogs } = await openTab(`${boardUrl}/queue/${QUEUE}/a`);
  const link = page.getByRole('link', { name: 'Key in the key inspector' }).first();
  await link.waitFor();
  const [inspector] = await Promise.all([context!.waitForEvent('page'), link.click()]);
  await inspector.waitForLoadState();
  expect(inspector.url()).toContain(`/ui/#/key?scope=${QUEUE}&key=order-1`);
  // The inspector's own authentication: the admin token, kept in that tab.
  await inspector.locator('#token-form input[name=token]').fill(ADMIN);
  await inspector.locator('#token-form button[type=submit]').click();
  await inspector.locator('[data-view=key]').waitFor();
  expect(await inspector.locator('.key-name').textContent()).toBe('order-1');
  expect(await inspector.locator('[data-field=status]').textContent()).toBe('completed');
  expect(await inspector.locator('[data-field=job-id]').textContent()).toBe('a');
  expect(dialogs).toEqual([]);
});
