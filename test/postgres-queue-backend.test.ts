// @module-tag redis
/**
 * The BullMQ adapter on BullMQ's PostgreSQL backend: worker and producer with the queue in a
 * schema of this file's, the sweeper's lookup, and the enqueue inside a caller's transaction
 * (no outbox, no relay), which binds BullMQ's backend to that transaction's connection.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { pino } from 'pino';
import { IdempotencyKeys, IdempotentProducer, OutboxRelay, createHttpApi, createIdempotentWorker, jobIdFor, toWireJobData, type IdempotentWorker, type IdempotentWorkerOptions, type JobHandler } from '../src/index.js';
import { httpClient } from './support/http-client.js';
import { BullmqJobLookup } from '../src/process/index.js';
import { pingBullWorker } from '../src/bullmq/job-lookup.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';
import { waitFor, waitForJobState } from './support/queue-helpers.js';

let env: TestEnv;
let queueSchema: string;
let producer: IdempotentProducer;
const QUEUE = 'pg-orders';

beforeAll(async () => {
  env = await createTestEnv('pg-queue');
  queueSchema = `${env.schema}_q`;
  await sql`create table ${sql.id(env.schema, 'orders')} (id text primary key, cents int not null)`.execute(env.db);
  await sql`create table ${sql.id(env.schema, 'ledger')} (key text primary key, cents int not null)`.execute(env.db);
  producer = new IdempotentProducer({ queue: QUEUE, backend: 'postgres', connection: env.databaseDirectUrl, prefix: queueSchema, schema: env.schema });
});
afterAll(async () => {
  await producer?.close();
  if (queueSchema) await sql`drop schema if exists ${sql.id(queueSchema)} cascade`.execute(env.db);
  await env?.teardown();
});

const jobCount = async (jobId: string) =>
  Number((await sql<{ n: string }>`select count(*) as n from ${sql.id(queueSchema, 'job')} where id = ${jobId}`.execute(env.db)).rows[0]!.n);

describe('enqueue in the caller\'s transaction (Postgres backend)', () => {
  it('adds no job when the transaction rolls back', async () => {
    await expect(
      env.db.transaction().execute(async (tx) => {
        await tx.insertInto(`${env.schema}.orders`).values({ id: 'o-1', cents: 100 }).execute();
        const result = await producer.enqueue({ name: 'charge', scope: 's', key: 'o-1', data: { cents: 100 } }, { tx });
        expect(result.status).toBe('added');
        // Inside the transaction the job is there; outside it, not yet.
        expect(await producer.queue.getJobState(result.jobId)).toBe('unknown');
        throw new Error('roll back');
      }),
    ).rejects.toThrow('roll back');
    expect(await producer.queue.getJobState(jobIdFor('s', 'o-1'))).toBe('unknown');
    expect(await jobCount(jobIdFor('s', 'o-1'))).toBe(0);
  });

  it('adds exactly one job when it commits, with no outbox row and no relay running', async () => {
    await env.db.transaction().execute(async (tx) => {
      await tx.insertInto(`${env.schema}.orders`).values({ id: 'o-2', cents: 200 }).execute();
      await producer.enqueue({ name: 'charge', scope: 's', key: 'o-2', data: { cents: 200 } }, { tx });
      // A duplicate in the same transaction adds nothing.
      expect((await producer.enqueue({ name: 'charge', scope: 's', key: 'o-2', data: { cents: 200 } }, { tx })).status).toBe('duplicate');
    });
    const jobId = jobIdFor('s', 'o-2');
    expect(await producer.queue.getJobState(jobId)).toBe('waiting');
    expect(await jobCount(jobId)).toBe(1);
    const job = await producer.queue.getJob(jobId);
    expect(job!.data).toMatchObject({ idempotencyKey: 'o-2', scope: 's', payload: { cents: 200 } });
    const outbox = await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'outbox')} where job_id = ${jobId}`.execute(env.db);
    expect(Number(outbox.rows[0]!.n)).toBe(0);
  });

  it('leaves the caller\'s search_path as it was', async () => {
    await env.db.transaction().execute(async (tx) => {
      await sql`set local search_path to ${sql.id(env.schema)}, public`.execute(tx);
      await producer.enqueue({ name: 'charge', scope: 's', key: 'o-3', data: { cents: 300 } }, { tx });
      const { rows } = await sql<{ path: string }>`select current_setting('search_path') as path`.execute(tx);
      expect(rows[0]!.path).toBe(`${env.schema}, public`);
      // An unqualified name still finds the caller's table.
      await sql`insert into orders (id, cents) values ('o-3', 300)`.execute(tx);
    });
    expect(await producer.queue.getJobState(jobIdFor('s', 'o-3'))).toBe('waiting');
  });

  it('refuses a transaction in a database without the queue, saying to use the outbox', async () => {
    const other = `${queueSchema}_none`;
    const stranger = new IdempotentProducer({ queue: QUEUE, backend: 'postgres', connection: env.databaseDirectUrl, prefix: other });
    try {
      // The schema is created by the queue's own connection's migrations; drop it after they ran.
      await stranger.queue.waitUntilReady();
      await sql`drop schema ${sql.id(other)} cascade`.execute(env.db);
      await expect(
        env.db.transaction().execute((tx) => stranger.enqueue({ name: 'charge', scope: 's', key: 'o-4', data: {} }, { tx })),
      ).rejects.toThrow(/no BullMQ queue schema .*use the outbox/s);
    } finally {
      await stranger.close();
      await sql`drop schema if exists ${sql.id(other)} cascade`.execute(env.db);
    }
  });

  it('goes through the outbox when told to, and the relay adds the job to the Postgres queue', async () => {
    const viaOutbox = new IdempotentProducer({
      queue: QUEUE,
      backend: 'postgres',
      connection: env.databaseDirectUrl,
      prefix: queueSchema,
      schema: env.schema,
      enqueueInTransaction: 'outbox',
    });
    const relay = new OutboxRelay({ db: env.db, schema: env.schema, backend: 'postgres', connection: env.databaseDirectUrl, prefix: queueSchema, pollIntervalMs: 20, logger: pino({ level: 'silent' }) });
    try {
      const result = await env.db.transaction().execute((tx) => viaOutbox.enqueue({ name: 'charge', scope: 's', key: 'o-5', data: { cents: 500 } }, { tx }));
      expect(result.status).toBe('outboxed');
      expect(await jobCount(result.jobId)).toBe(0);
      relay.start();
      await waitForJobState(viaOutbox.queue, result.jobId, ['waiting']);
      expect(await jobCount(result.jobId)).toBe(1);
    } finally {
      await relay.stop();
      await viaOutbox.close();
    }
  });

  it('refuses enqueueInTransaction: \'queue\' on Redis', () => {
    expect(() => new IdempotentProducer({ queue: QUEUE, connection: { url: env.redisUrl }, enqueueInTransaction: 'queue' })).toThrow(/needs the queue in Postgres/);
  });
});

describe('bulk enqueues racing on the Postgres backend', () => {
  it('batches of the same keys in different orders never deadlock: each job is added once', async () => {
    // Before the batches were sent in id order, such batches deadlocked on the job table's
    // unique index in the first rounds (Postgres ends one of them with 40P01).
    for (let round = 0; round < 10; round++) {
      const requests = Array.from({ length: 300 }, (_, i) => ({ name: 'charge', scope: 'race', key: `r${round}-${i}`, data: { i } }));
      // Nine batches at once: the keys forward, backward and from the middle, each order split in three interleaved slices.
      const slices = (list: typeof requests) => [0, 1, 2].map((k) => list.filter((_, i) => i % 3 === k));
      const batches = [...slices(requests), ...slices([...requests].reverse()), ...slices(requests.slice(150).concat(requests.slice(0, 150)))];
      const outcomes = (await Promise.all(batches.map((batch) => producer.enqueueBulk(batch)))).flat();
      expect(outcomes.every((r) => r.status === 'added' || r.status === 'duplicate')).toBe(true);
      for (const key of [`r${round}-0`, `r${round}-150`, `r${round}-299`]) expect(await jobCount(jobIdFor('race', key))).toBe(1);
    }
  });
});

describe('worker and sweeper lookup on the Postgres backend', () => {
  let worker: IdempotentWorker<{ cents: number }, { booked: number }> | undefined;
  afterAll(async () => {
    await worker?.close();
  });

  it('runs each key\'s effect once, and the lookup sees the jobs through BullMQ\'s API', async () => {
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
    const queue = 'pg-ledger';
    const ledgerProducer = new IdempotentProducer({ queue, backend: 'postgres', connection: env.databaseDirectUrl, prefix: queueSchema });
    const lookup = new BullmqJobLookup({ backend: 'postgres', connection: env.databaseDirectUrl, prefix: queueSchema });
    try {
      const first = await ledgerProducer.enqueue({ name: 'book', scope: 's', key: 'k1', data: { cents: 5 } });
      expect(await lookup.presence(queue, [first.jobId])).toBe('pending');
      expect(await lookup.presence(queue, [jobIdFor('s', 'nothing')])).toBe('missing');
      worker = createIdempotentWorker<{ cents: number }, { booked: number }>({
        queue,
        backend: 'postgres',
        connection: env.databaseDirectUrl,
        prefix: queueSchema,
        keys,
        concurrency: 4,
        logger: pino({ level: 'silent' }),
        handler: {
          transaction: async (tx, ctx) => {
            await tx.insertInto(`${env.schema}.ledger`).values({ key: ctx.key, cents: ctx.data.cents }).execute();
            return { booked: ctx.data.cents };
          },
        },
      });
      // The health check (/healthz) asks the queue through BullMQ's API, not Redis.
      await expect(pingBullWorker(worker.bullWorker)).resolves.toBeUndefined();
      const second = await ledgerProducer.enqueue({ name: 'book', scope: 's', key: 'k2', data: { cents: 7 } });
      const done = await Promise.all([first, second].map(({ jobId }) => waitForJobState(ledgerProducer.queue, jobId, ['completed'])));
      expect(done.map(({ job }) => job.returnvalue)).toEqual([{ booked: 5 }, { booked: 7 }]);
      expect(await lookup.presence(queue, [first.jobId])).toBe('finished');
      expect((await ledgerProducer.enqueue({ name: 'book', scope: 's', key: 'k1', data: { cents: 5 } })).status).toBe('duplicate');
      // The sweeper's re-enqueue removes the finished job and adds a new one, which replays the key.
      expect(await lookup.reenqueue({ queue, jobId: first.jobId, name: 'book', data: toWireJobData('s', 'k1', { cents: 5 }) })).toBe('added');
      const again = await waitForJobState(ledgerProducer.queue, first.jobId, ['completed']);
      expect(again.job.returnvalue).toEqual({ booked: 5 });
      // A finished job with another payload under the key is replaced; the worker then refuses the reused key.
      expect((await ledgerProducer.enqueue({ name: 'book', scope: 's', key: 'k2', data: { cents: 8 } })).status).toBe('added');
      await waitForJobState(ledgerProducer.queue, second.jobId, ['failed']);
      const ledger = await sql<{ key: string; cents: number }>`select key, cents from ${sql.id(env.schema, 'ledger')} order by key`.execute(env.db);
      expect(ledger.rows).toEqual([
        { key: 'k1', cents: 5 },
        { key: 'k2', cents: 7 },
      ]);
    } finally {
      await ledgerProducer.close();
      await lookup.close();
    }
  });
});

describe('HTTP API on the Postgres backend', () => {
  it('enqueues the job in the request record\'s transaction: a job and no outbox row, answered 202 with its state', async () => {
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
    const api = await createHttpApi({
      keys,
      backend: 'postgres',
      connection: env.databaseDirectUrl,
      prefix: queueSchema,
      queues: ['pg-http'],
      relay: false,
      logger: pino({ level: 'silent' }),
    });
    try {
      const client = httpClient(await api.listen({ host: '127.0.0.1', port: 0 }));
      const first = await client.post('/v1/queues/pg-http/jobs?name=charge', { key: 'h-1', json: { cents: 1 } });
      expect(first.status).toBe(202);
      expect(first.body).toMatchObject({ queue: 'pg-http', key: 'h-1', jobId: jobIdFor('default', 'h-1'), state: 'queued' });
      const again = await client.post('/v1/queues/pg-http/jobs?name=charge', { key: 'h-1', json: { cents: 1 } });
      expect(again.headers.get('idempotent-replayed')).toBe('true');
      expect(await jobCount(jobIdFor('default', 'h-1'))).toBe(1);
      const outbox = await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'outbox')} where job_id = ${jobIdFor('default', 'h-1')}`.execute(env.db);
      expect(Number(outbox.rows[0]!.n)).toBe(0);
      const read = await client.get('/v1/queues/pg-http/jobs/h-1');
      expect(read.body).toMatchObject({ key: 'h-1', state: 'queued' });
    } finally {
      await api.close();
    }
  });
});

describe('the job finished in the effect\'s commit (Postgres backend)', () => {
  const ledger = () => `${env.schema}.ledger`;

  /** A producer and a worker of `queue` on the Postgres backend; the handler is made with the producer at hand. */
  function workerOnQueue<P, R>(queue: string, handlerWith: (jobs: IdempotentProducer) => JobHandler<P, R>, workerOptions?: IdempotentWorkerOptions<P, R>['workerOptions']) {
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
    const jobs = new IdempotentProducer({ queue, backend: 'postgres', connection: env.databaseDirectUrl, prefix: queueSchema });
    const worker = createIdempotentWorker<P, R>({
      queue,
      backend: 'postgres',
      connection: env.databaseDirectUrl,
      prefix: queueSchema,
      keys,
      logger: pino({ level: 'silent' }),
      handler: handlerWith(jobs),
      ...(workerOptions ? { workerOptions } : {}),
    });
    const close = async () => {
      await worker.close();
      await jobs.close();
    };
    return { keys, jobs, close };
  }

  /** Runs one job of key `key` on a worker (`finishJobInEffect` as given) and reports the job's state, read from outside, at the fault points. */
  async function statesAtFaultPoints(key: string, options: { finishJobInEffect: boolean; failBeforeCommitOnce?: boolean }) {
    const queue = `pg-finish-${options.finishJobInEffect}`;
    // The hook's throw stands for a crash, which ends every job of a group: in a group, a job
    // that threw would run again alone at once, where the hook no longer throws.
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema, ...(options.failBeforeCommitOnce ? { groupCommit: false } : {}) });
    const jobs = new IdempotentProducer({ queue, backend: 'postgres', connection: env.databaseDirectUrl, prefix: queueSchema });
    const jobId = jobIdFor('s', key);
    const seen: Record<string, string> = {};
    let failed = false;
    const worker = createIdempotentWorker<{ cents: number }, { booked: number }>({
      queue,
      backend: 'postgres',
      connection: env.databaseDirectUrl,
      prefix: queueSchema,
      keys,
      finishJobInEffect: options.finishJobInEffect,
      logger: pino({ level: 'silent' }),
      handler: {
        transaction: async (tx, ctx) => {
          await tx.insertInto(ledger()).values({ key: ctx.key, cents: ctx.data.cents }).execute();
          return { booked: ctx.data.cents };
        },
      },
      faultHook: async (point, context) => {
        if (context.key !== key) return;
        seen[point] = await jobs.queue.getJobState(jobId);
        if (point === 'before-commit' && options.failBeforeCommitOnce && !failed) {
          failed = true;
          throw new Error('crash before the COMMIT');
        }
      },
    });
    try {
      await jobs.enqueue({ name: 'book', scope: 's', key, data: { cents: 9 }, opts: { attempts: 2 } });
      const { job } = await waitForJobState(jobs.queue, jobId, ['completed']);
      return { seen, job };
    } finally {
      await worker.close();
      await jobs.close();
    }
  }

  it('completes the job in the effect\'s transaction: already completed when the COMMIT returns, never delivered again', async () => {
    const { seen, job } = await statesAtFaultPoints('f-1', { finishJobInEffect: true });
    // Inside the open transaction the move is not visible outside; once it commits, the job is
    // completed. (A database-only handler runs on the fast path: no separate claim, no after-claim.)
    expect(seen).toEqual({ 'before-commit': 'active', 'after-commit': 'completed' });
    expect(job.returnvalue).toEqual({ booked: 9 });
    expect(job.attemptsStarted).toBe(1);
    // Without it, BullMQ is told after the COMMIT: a crash in between leaves the job active, to be delivered again.
    const plain = await statesAtFaultPoints('f-2', { finishJobInEffect: false });
    expect(plain.seen['after-commit']).toBe('active');
  });

  it('rolls the move back with the effect: a failure before the COMMIT leaves the job to BullMQ\'s retry, and the effect runs once', async () => {
    const { seen, job } = await statesAtFaultPoints('f-3', { finishJobInEffect: true, failBeforeCommitOnce: true });
    expect(seen['after-commit']).toBe('completed');
    expect(job.attemptsMade).toBe(2);
    const rows = await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'ledger')} where key = 'f-3'`.execute(env.db);
    expect(Number(rows.rows[0]!.n)).toBe(1);
  });

  it('defers a job whose BullMQ lock was lost before its effect committed: the effect rolls back, the key is not failed, the job runs again', async () => {
    let runs = 0;
    const { keys, jobs, close } = workerOnQueue<{ cents: number }, { booked: number }>('pg-finish-lock', (producer) => async (ctx) => {
      if (++runs === 1) {
        // The lock goes away under the running job (as when it stalled): back to waiting.
        const outside = await producer.queue.getJob(ctx.job.id!);
        await outside!.moveToWait();
      }
      return ctx.transaction(async (tx) => {
        await tx.insertInto(ledger()).values({ key: ctx.key, cents: ctx.data.cents }).execute();
        return { booked: ctx.data.cents };
      });
    });
    try {
      // One attempt: a lock loss counted as the handler's failure would fail the key for good.
      const { jobId } = await jobs.enqueue({ name: 'book', scope: 's', key: 'f-4', data: { cents: 4 }, opts: { attempts: 1 } });
      const { job } = await waitForJobState(jobs.queue, jobId, ['completed']);
      expect(job.returnvalue).toEqual({ booked: 4 });
      expect(runs).toBe(2);
      const rows = await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'ledger')} where key = 'f-4'`.execute(env.db);
      expect(Number(rows.rows[0]!.n)).toBe(1);
      expect((await keys.get('s', 'f-4'))?.status).toBe('completed');
    } finally {
      await close();
    }
  });

  it('a job removed while its effect ran (its lock lost first) is not failed: the effect rolls back, the key is released, no attempt is stored as a failure', async () => {
    let runs = 0;
    const { keys, jobs, close } = workerOnQueue<{ cents: number }, { booked: number }>('pg-finish-removed', (producer) => async (ctx) => {
      runs++;
      // The lock goes away (the job back to waiting), then an operator removes the job.
      const outside = await producer.queue.getJob(ctx.job.id!);
      await outside!.moveToWait();
      await producer.queue.remove(ctx.job.id!);
      return ctx.transaction(async (tx) => {
        await tx.insertInto(ledger()).values({ key: ctx.key, cents: ctx.data.cents }).execute();
        return { booked: ctx.data.cents };
      });
    });
    try {
      const { jobId } = await jobs.enqueue({ name: 'book', scope: 's', key: 'f-removed', data: { cents: 7 }, opts: { attempts: 1 } });
      await waitFor('the run to end', async () => (runs === 1 && (await keys.get('s', 'f-removed'))?.owner === null ? true : undefined));
      expect(await jobs.queue.getJob(jobId)).toBeUndefined();
      expect(await keys.get('s', 'f-removed')).toMatchObject({ status: 'processing', owner: null });
      const rows = await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'ledger')} where key = 'f-removed'`.execute(env.db);
      expect(Number(rows.rows[0]!.n)).toBe(0);
    } finally {
      await close();
    }
  });

  it('a result Postgres cannot store fails the job once, as RESULT_NOT_STORABLE, before BullMQ\'s move could use up its attempts', async () => {
    let runs = 0;
    const { keys, jobs, close } = workerOnQueue<{ cents: number }, unknown>('pg-finish-unstorable', () => async (ctx) =>
      ctx.transaction(async (tx) => {
        runs++;
        await tx.insertInto(ledger()).values({ key: ctx.key, cents: ctx.data.cents }).execute();
        return { note: 'a\u0000b' };
      }),
    );
    try {
      const { jobId } = await jobs.enqueue({ name: 'book', scope: 's', key: 'f-unstorable', data: { cents: 8 }, opts: { attempts: 3 } });
      const { state, job } = await waitForJobState(jobs.queue, jobId, ['failed', 'completed']);
      expect(state).toBe('failed');
      expect(job.attemptsMade).toBe(1);
      expect(job.failedReason).toMatch(/NUL character/);
      // In its group, then alone (a group's failure runs its culprit alone): never again after.
      expect(runs).toBeLessThanOrEqual(2);
      expect(await keys.get('s', 'f-unstorable')).toMatchObject({ status: 'failed', error: { code: 'RESULT_NOT_STORABLE' } });
    } finally {
      await close();
    }
  });

  it('honours the worker\'s removeOnComplete for a job finished in its effect', async () => {
    const { jobs, close } = workerOnQueue<{ cents: number }, { booked: number }>(
      'pg-finish-remove-on-complete',
      () => async (ctx) =>
        ctx.transaction(async (tx) => {
          await tx.insertInto(ledger()).values({ key: ctx.key, cents: ctx.data.cents }).execute();
          return { booked: ctx.data.cents };
        }),
      { removeOnComplete: { count: 0 } },
    );
    try {
      const { jobId } = await jobs.enqueue({ name: 'book', scope: 's', key: 'f-removed-on-complete', data: { cents: 9 } });
      await waitFor('the effect to commit', async () => {
        const rows = await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'ledger')} where key = 'f-removed-on-complete'`.execute(env.db);
        return Number(rows.rows[0]!.n) === 1 || undefined;
      });
      await waitFor('the completed job to be removed', async () => ((await jobs.queue.getJob(jobId)) === undefined ? true : undefined));
    } finally {
      await close();
    }
  });

  it('passes ctx.transaction\'s options on when it finishes the job in the effect: a bad runsAlone is refused, a good one runs', async () => {
    const { jobs, close } = workerOnQueue<{ cents: number; runsAlone: unknown }, { booked: number }>('pg-finish-options', () => async (ctx) =>
      ctx.transaction(
        async (tx) => {
          await tx.insertInto(ledger()).values({ key: ctx.key, cents: ctx.data.cents }).execute();
          return { booked: ctx.data.cents };
        },
        { runsAlone: ctx.data.runsAlone as boolean },
      ),
    );
    try {
      const bad = await jobs.enqueue({ name: 'book', scope: 's', key: 'f-5', data: { cents: 5, runsAlone: 'yes' }, opts: { attempts: 1 } });
      const good = await jobs.enqueue({ name: 'book', scope: 's', key: 'f-6', data: { cents: 6, runsAlone: true }, opts: { attempts: 1 } });
      const refused = await waitForJobState(jobs.queue, bad.jobId, ['failed', 'completed']);
      expect(refused.state).toBe('failed');
      expect(refused.job.failedReason).toMatch(/runsAlone must be true or false/);
      const ran = await waitForJobState(jobs.queue, good.jobId, ['completed']);
      expect(ran.job.returnvalue).toEqual({ booked: 6 });
      const rows = await sql<{ key: string }>`select key from ${sql.id(env.schema, 'ledger')} where key in ('f-5', 'f-6') order by key`.execute(env.db);
      expect(rows.rows.map((row) => row.key)).toEqual(['f-6']);
    } finally {
      await close();
    }
  });

  it.each([
    { variant: 'defaults', workerOptions: {} },
    { variant: 'the worker\'s metrics on (BullMQ collects them after the move)', workerOptions: { metrics: { maxDataPoints: 10 } } },
  ])('a function handler\'s callback runs once per job with group commit on ($variant): the move to completed and what goes with it share the group as its job\'s postludes, so gathered groups never run again one job after another', async ({ workerOptions }) => {
    // Each job sends its insert, then the move (and the metrics); were the move an ordinary
    // statement, the first gathered group would be interleaved and run again (group-commit.ts).
    // A queue schema of its own, read from the catalog for the first time by these jobs'
    // transactions (that read must not count as a statement of the job's either).
    const JOBS = 500;
    let runs = 0;
    const queue = 'pg-finish-grouped';
    const prefix = `${queueSchema}_g${Object.keys(workerOptions).length}`;
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema, groupCommit: { maxGroups: 2, maxJobs: 32 } });
    const jobs = new IdempotentProducer({ queue, backend: 'postgres', connection: env.databaseDirectUrl, prefix });
    const worker = createIdempotentWorker<{ cents: number }, { booked: number }>({
      queue,
      backend: 'postgres',
      connection: env.databaseDirectUrl,
      prefix,
      keys,
      concurrency: 32,
      workerOptions,
      logger: pino({ level: 'silent' }),
      handler: (ctx) =>
        ctx.transaction(async (tx) => {
          runs++;
          await tx.insertInto(ledger()).values({ key: ctx.key, cents: ctx.data.cents }).execute();
          return { booked: ctx.data.cents };
        }),
    });
    try {
      const added = await jobs.enqueueBulk(Array.from({ length: JOBS }, (_, i) => ({ name: 'book', scope: `grouped-${prefix}`, key: `g-${i}`, data: { cents: i } })));
      expect(added.every((job) => job.status === 'added')).toBe(true);
      await waitFor('every job completed', async () => ((await jobs.queue.getJobCounts('completed')).completed === JOBS ? true : undefined), 50_000);
      const booked = await sql<{ n: string }>`select count(*) as n from ${sql.id(env.schema, 'ledger')} where key like 'g-%'`.execute(env.db);
      expect(Number(booked.rows[0]!.n)).toBe(JOBS);
      expect(runs).toBe(JOBS);
    } finally {
      await worker.close();
      await jobs.close();
      await sql`delete from ${sql.id(env.schema, 'ledger')} where key like 'g-%'`.execute(env.db);
      await sql`drop schema if exists ${sql.id(prefix)} cascade`.execute(env.db);
    }
  });

  it('refuses finishJobInEffect on Redis', () => {
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
    expect(() =>
      createIdempotentWorker({ queue: 'x', connection: { url: env.redisUrl }, keys, finishJobInEffect: true, handler: async () => null }),
    ).toThrow(/needs the queue in Postgres/);
  });
});
