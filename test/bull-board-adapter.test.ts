// @module-tag redis
/**
 * `idempotent-jobs/bull-board` through Bull Board's own API, mounted in Express and in Fastify,
 * for a queue on Redis and one on the Postgres backend: each job carries its key's view (status,
 * whose run made the effect, fence, lease, steps, result, tombstone) in its progress, its name
 * says the key's state, and its link opens the key's page in the key inspector. The NestJS mount
 * is in test/nestjs/bull-board-nestjs.test.ts; the page in Chromium in bull-board-browser.test.ts.
 */
import type { AddressInfo } from 'node:net';
import { createBullBoard } from '@bull-board/api';
import { ExpressAdapter } from '@bull-board/express';
import { FastifyAdapter } from '@bull-board/fastify';
import express from 'express';
import Fastify from 'fastify';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotentJobsAdapter, keyInspectorLink, type JobKeyView } from '../src/bull-board/index.js';
import type { QueueConnectionOptions } from '../src/index.js';
import { HOSTILE_KEY, boardFixture, type BoardFixture } from './support/bull-board-fixture.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const INSPECTOR = 'http://inspector.test/ui/';
let env: TestEnv;

beforeAll(async () => {
  env = await createTestEnv('bull-board-adapter');
});
afterAll(async () => {
  await env?.teardown();
});

interface BoardJob {
  id: string;
  name: string;
  progress: { idempotencyKey: JobKeyView; jobProgress?: unknown };
  externalUrl?: { href: string; displayText?: string };
  returnValue: unknown;
}

/** Bull Board's API of a mounted board: the active queue's jobs of one status, and one job. */
function boardApi(baseUrl: string) {
  return {
    async jobs(queue: string, status: string): Promise<BoardJob[]> {
      const response = await fetch(`${baseUrl}/api/queues?activeQueue=${encodeURIComponent(queue)}&status=${status}&page=1&jobsPerPage=50`);
      expect(response.status).toBe(200);
      const body = (await response.json()) as { queues: Array<{ name: string; jobs: BoardJob[] }> };
      return body.queues.find((q) => q.name === queue)!.jobs;
    },
    async job(queue: string, id: string): Promise<BoardJob> {
      const response = await fetch(`${baseUrl}/api/queues/${encodeURIComponent(queue)}/${encodeURIComponent(id)}`);
      expect(response.status).toBe(200);
      return ((await response.json()) as { job: BoardJob }).job;
    },
  };
}

async function expressBoard(adapters: IdempotentJobsAdapter[]): Promise<{ url: string; close(): Promise<void> }> {
  const serverAdapter = new ExpressAdapter();
  serverAdapter.setBasePath('/admin/queues');
  createBullBoard({ queues: adapters, serverAdapter });
  const app = express();
  app.use('/admin/queues', serverAdapter.getRouter());
  const server = app.listen(0, '127.0.0.1');
  await new Promise((resolve) => server.once('listening', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/admin/queues`,
    close: () => new Promise((resolve) => server.close(() => resolve())),
  };
}

const backends: Array<[string, () => QueueConnectionOptions]> = [
  ['Redis', () => ({ connection: { url: env.redisUrl }, prefix: env.redisPrefix })],
  ['Postgres', () => ({ backend: 'postgres', connection: env.databaseDirectUrl, prefix: `${env.schema}_queue` })],
];

describe.each(backends)('a queue on %s, in Bull Board mounted in Express', (backend, connectionOf) => {
  let fixture: BoardFixture;
  let board: Awaited<ReturnType<typeof expressBoard>>;
  const name = `board-${backend.toLowerCase()}`;

  beforeAll(async () => {
    fixture = await boardFixture(env, name, connectionOf());
    board = await expressBoard([
      new IdempotentJobsAdapter(fixture.queue, { keys: fixture.keys, inspectorUrl: INSPECTOR }),
      new IdempotentJobsAdapter(fixture.idle, { keys: fixture.keys, inspectorUrl: INSPECTOR }),
    ]);
  }, 120_000);
  afterAll(async () => {
    await board?.close();
    await fixture?.close();
  });

  it('a key run twice: one effect, shown on the job that ran it; the other job replays it', async () => {
    const api = boardApi(board.url);
    const jobs = await api.jobs(name, 'completed');
    const byId = new Map(jobs.map((job) => [job.id, job]));
    expect(await fixture.effectsOfOrder1()).toBe(1);

    const ran = byId.get('a')!;
    expect(ran.name).toBe('charge · key completed, fence 1');
    expect(ran.progress.idempotencyKey).toMatchObject({
      scope: name,
      key: 'order-1',
      status: 'completed',
      effect: "this job's run",
      owner: expect.any(String),
      fence: 1,
      claims: 1,
      lease: 'none (the key is settled)',
      steps: [{ name: 'charge-card', state: 'recorded', starts: 1, result: { chargeId: 'ch_1999' } }],
      result: { receipt: 'r-order-1', chargeId: 'ch_1999' },
      inspector: `${INSPECTOR}#/key?scope=${name}&key=order-1`,
    });
    expect(ran.externalUrl).toEqual({ href: `${INSPECTOR}#/key?scope=${name}&key=order-1`, displayText: 'Key in the key inspector' });

    const replay = byId.get('b')!;
    expect(replay.name).toBe('charge · key completed by another job (replayed)');
    expect(replay.progress.idempotencyKey.effect).toBe(`replays job a's run (queue ${name}): this job ran no effect of its own`);
    expect(replay.returnValue).toEqual({ receipt: 'r-order-1', chargeId: 'ch_1999' });
  });

  it('a deleted key shows its tombstone; a waiting job shows a key not claimed yet; a hostile key is data, its link encoded', async () => {
    const api = boardApi(board.url);
    const gone = await api.job(name, 't');
    expect(gone.progress.idempotencyKey).toMatchObject({
      key: 'gone-1',
      status: 'deleted (tombstone)',
      tombstone: { outcome: 'completed', finishedAt: expect.any(String), refusesDuplicatesUntil: expect.any(String) },
    });
    const waiting = await api.job(`${name}-idle`, 'w');
    expect(waiting.name).toBe('charge · key not claimed yet');
    expect(waiting.progress.idempotencyKey).toEqual({ scope: name, key: 'waiting-1', status: 'not claimed yet', inspector: `${INSPECTOR}#/key?scope=${name}&key=waiting-1` });
    const hostile = await api.job(name, 'h');
    expect(hostile.progress.idempotencyKey.key).toBe(HOSTILE_KEY);
    expect(hostile.externalUrl!.href).toBe(`${INSPECTOR}#/key?scope=${name}&key=${encodeURIComponent(HOSTILE_KEY)}`);
  });
});

describe('other mounts and options', () => {
  let fixture: BoardFixture;
  beforeAll(async () => {
    fixture = await boardFixture(env, 'board-fastify', { connection: { url: env.redisUrl }, prefix: env.redisPrefix });
  }, 120_000);
  afterAll(async () => {
    await fixture?.close();
  });

  it('Bull Board mounted in Fastify shows the same key views; keyInspectorLink is the link for boards that build the adapter themselves', async () => {
    const serverAdapter = new FastifyAdapter();
    serverAdapter.setBasePath('/admin/queues');
    createBullBoard({ queues: [new IdempotentJobsAdapter(fixture.queue, { keys: fixture.keys, externalJobUrl: keyInspectorLink('/ui/') })], serverAdapter });
    const app = Fastify();
    await app.register(serverAdapter.registerPlugin(), { prefix: '/admin/queues' });
    const url = await app.listen({ host: '127.0.0.1', port: 0 });
    try {
      const page = await fetch(`${url}/admin/queues/`);
      expect(await page.text()).toContain('<div id="root">');
      const job = await boardApi(`${url}/admin/queues`).job('board-fastify', 'b');
      expect(job.progress.idempotencyKey).toMatchObject({ key: 'order-1', status: 'completed', effect: expect.stringMatching(/^replays job a's run/) });
      expect(job.externalUrl).toEqual({ href: '/ui/#/key?scope=board-fastify&key=order-1', displayText: 'Key in the key inspector' });
    } finally {
      await app.close();
    }
  });

  it('refuses an option it does not know, and a queue whose keys it cannot find, saying what to pass', () => {
    expect(() => new IdempotentJobsAdapter(fixture.queue, { keys: fixture.keys, inspectorURL: '/ui/' } as never)).toThrow(
      /IdempotentJobsAdapter\(queue, options\): unknown option "inspectorURL"\. Did you mean "inspectorUrl"\?/,
    );
    expect(() => new IdempotentJobsAdapter(fixture.queue)).toThrow(
      /IdempotentJobsAdapter for queue "board-fastify" needs the keys its workers claim: pass \{ keys \}, or register the queue with IdempotentJobsModule\.registerQueue/,
    );
  });
});
