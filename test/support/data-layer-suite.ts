/**
 * The tests every data layer's adapter passes, on real Postgres, through the runner that every
 * broker's consumer uses: a leased function handler (`ctx.transaction(dataLayer, fn)`) and a
 * database-only handler on the fast path (`databaseOnly(dataLayer, fn)`). The effect is written
 * with the data layer's own API (the fixture's `insert`); a ledger without a unique constraint
 * shows a second effect as a second row. The tests that start a BullMQ worker or producer carry
 * the `redis` tag: a run without Redis skips them, and runs the rest on Postgres alone.
 */
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  AbortedEffectTransactionError,
  DataLayerElsewhereError,
  IdempotencyKeys,
  IdempotentProducer,
  KeyedJobRunner,
  StoreUnavailableError,
  ValidationError,
  createIdempotentWorker,
  databaseOnly,
  identityFromWireContract,
  kyselyIn,
  resolveWorkerTiming,
  type DataLayer,
  type Delivery,
  type JobLike,
  type KeyedJobContext,
  type RunOutcome,
} from '../../src/index.js';
import { createGate, expireLease } from './protocol-fixtures.js';
import { REDIS_TAG } from './redis-files.js';
import { createTestEnv, type TestEnv } from './test-env.js';

/** One data layer, opened by a test file on a database and a schema. */
export interface DataLayerFixture<Tx> {
  readonly layer: DataLayer<Tx>;
  /** Inserts one row into `<schema>.ledger` with the data layer's own API. */
  insert(tx: Tx, row: { key: string; fence: number; worker: string }): Promise<void>;
  /** Runs `text` with the data layer's own API (rejecting as the data layer does). */
  query(tx: Tx, text: string): Promise<unknown>;
  close(): Promise<void>;
}

/** Opens the data layer on `databaseUrl`, its ledger in `schema`. */
export type OpenDataLayer<Tx> = (databaseUrl: string, schema: string) => Promise<DataLayerFixture<Tx>>;

/** What a delivery's run does, apart from its payload (duplicates carry the same payload). */
interface Behavior {
  readonly worker: string;
  readonly mode?: 'plain' | 'hold' | 'throw' | 'swallow' | 'terminate';
}

type Payload = Record<string, never>;

const silent = pino({ level: 'silent' });

/** What a data layer cannot be put through, and why. */
export interface DataLayerLimits {
  /**
   * Why a backend terminated inside its transaction is not tested: the data layer's own driver
   * crashes the process (an upstream bug the adapter cannot reach).
   */
  readonly backendTermination?: string;
}

/** The suite for one data layer. */
export function describeDataLayer<Tx>(name: string, open: OpenDataLayer<Tx>, limits: DataLayerLimits = {}): void {
  describe(`${name}: the guarantee in its own transaction`, () => {
    let env: TestEnv;
    let fixture: DataLayerFixture<Tx>;
    let keys: IdempotencyKeys;
    const gates = new Map<string, { reached: () => void; wait: Promise<void> }>();
    let ids = 0;

    beforeAll(async () => {
      env = await createTestEnv(`dl_${name}`);
      await sql`create table ${sql.id(env.schema, 'ledger')} (
        id bigint generated always as identity primary key,
        key text not null, fence int not null, worker text not null)`.execute(env.db);
      fixture = await open(env.databaseUrl, env.schema);
      keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 30_000 });
    });

    afterAll(async () => {
      await fixture?.close();
      await env?.teardown();
    });

    /** The effect, the same on both paths: a ledger row, then what the payload's mode asks. */
    async function effect(tx: Tx, ctx: { key: string; fence: number; message: JobLike }) {
      const behavior = behaviors.get(ctx.message.id!)!;
      await fixture.insert(tx, { key: ctx.key, fence: ctx.fence, worker: behavior.worker });
      switch (behavior.mode) {
        case 'hold': {
          const gate = gates.get(ctx.key)!;
          gate.reached();
          await gate.wait;
          break;
        }
        case 'throw':
          throw new Error('the effect failed');
        case 'swallow':
          // A failed statement whose error is caught: the transaction is aborted.
          await fixture.query(tx, 'select * from no_such_table_anywhere').catch(() => undefined);
          break;
        case 'terminate':
          await fixture.query(tx, 'select pg_terminate_backend(pg_backend_pid())');
          break;
      }
      return { booked: ctx.key, worker: behavior.worker };
    }

    const leased = (layer: DataLayer<Tx>) =>
      runner(async (ctx: KeyedJobContext<Payload, JobLike>) => ctx.transaction(layer, (tx) => effect(tx, ctx)), false);
    const fast = (layer: DataLayer<Tx>) => runner(databaseOnly<Payload, unknown, { key: string; fence: number; message: JobLike }, Tx>(layer, (tx, ctx) => effect(tx, ctx)), undefined);

    function runner(handler: ConstructorParameters<typeof KeyedJobRunner<Payload, unknown, JobLike>>[0]['handler'], fastPath: boolean | undefined) {
      return new KeyedJobRunner<Payload, unknown, JobLike>({
        keys,
        timing: resolveWorkerTiming({ deferMinMs: 20, storeRetryMinMs: 20 }, keys.options.leaseMs),
        handler,
        identityOf: (message) => identityFromWireContract(message) as never,
        logger: silent,
        fastPath,
      });
    }

    const behaviors = new Map<string, Behavior>();

    function delivery(key: string, behavior: Behavior): Delivery<JobLike> {
      const id = String(++ids);
      behaviors.set(id, behavior);
      const message: JobLike = { id, name: 'ledger', data: { idempotencyKey: key, scope: 'dl', payload: {} } };
      return { message, id, label: `Job ${id}`, queue: 'ledger', name: 'ledger', lastAttempt: false, deferrals: 0 };
    }

    /**
     * Runs a delivery again while it is deferred (another run holds its key) or met a store
     * fault (a connection an earlier test's backend termination left behind), as a broker would.
     */
    async function runToEnd(r: KeyedJobRunner<Payload, unknown, JobLike>, d: Delivery<JobLike>): Promise<RunOutcome> {
      for (let i = 0; ; i++) {
        const outcome = await r.run(d);
        if ((outcome.kind !== 'deferred' && outcome.kind !== 'store-unavailable') || i > 200) return outcome;
        await sleep(10);
      }
    }

    async function ledgerRows(key: string) {
      const { rows } = await sql<{ worker: string; fence: number }>`select worker, fence from ${sql.id(env.schema, 'ledger')} where key = ${key} order by id`.execute(env.db);
      return rows;
    }

    const unique = (label: string) => `${label}-${randomBytes(3).toString('hex')}`;

    for (const path of ['leased', 'fast path'] as const) {
      const make = (layer: DataLayer<Tx>) => (path === 'leased' ? leased(layer) : fast(layer));

      describe(path, () => {
        it('runs each key once under duplicates and concurrent claims, and replays the stored result', async () => {
          const r = make(fixture.layer);
          const names = Array.from({ length: 6 }, () => unique('dup'));
          const deliveries = names.flatMap((key) => [0, 1, 2].map((n) => delivery(key, { worker: `w${n}` })));
          const outcomes = await Promise.all(deliveries.map((d) => runToEnd(r, d)));
          expect(outcomes.filter((o) => o.kind === 'completed')).toHaveLength(names.length);
          expect(outcomes.filter((o) => o.kind === 'replayed')).toHaveLength(names.length * 2);
          for (const key of names) {
            const rows = await ledgerRows(key);
            expect(rows).toHaveLength(1);
            const record = await keys.get('dl', key);
            expect(record?.status).toBe('completed');
            expect(record?.result).toEqual({ booked: key, worker: rows[0]!.worker });
          }
          // A later duplicate replays the stored result without running the effect.
          const again = await r.run(delivery(names[0]!, { worker: 'late' }));
          expect(again).toMatchObject({ kind: 'replayed', result: { booked: names[0] } });
          expect(await ledgerRows(names[0]!)).toHaveLength(1);
        });

        it('rolls back an effect that throws inside the transaction, and runs it again', async () => {
          const r = make(fixture.layer);
          const key = unique('throw');
          const failed = await r.run(delivery(key, { worker: 'a', mode: 'throw' }));
          expect(failed.kind).toBe('retry');
          expect(failed.kind === 'retry' && (failed.error as Error).message).toBe('the effect failed');
          expect(await ledgerRows(key)).toHaveLength(0);
          expect((await r.run(delivery(key, { worker: 'b' }))).kind).toBe('completed');
          expect((await ledgerRows(key)).map((row) => row.worker)).toEqual(['b']);
        });

        it('never reports a transaction aborted by a caught error as committed', async () => {
          const r = make(fixture.layer);
          const key = unique('swallow');
          const failed = await r.run(delivery(key, { worker: 'a', mode: 'swallow' }));
          expect(failed.kind).toBe('retry');
          expect(failed.kind === 'retry' && failed.error).toBeInstanceOf(AbortedEffectTransactionError);
          expect(await ledgerRows(key)).toHaveLength(0);
          const record = await keys.get('dl', key);
          expect(record?.status ?? 'none').not.toBe('completed');
          expect((await r.run(delivery(key, { worker: 'b' }))).kind).toBe('completed');
          expect(await ledgerRows(key)).toHaveLength(1);
        });

        // Not defined at all where the driver crashes the process (limits.backendTermination says why).
        (limits.backendTermination === undefined ? it : ((() => undefined) as unknown as typeof it))('defers a job whose backend was terminated, without an attempt, and completes it later', async () => {
          const r = make(fixture.layer);
          const key = unique('terminated');
          const cut = await r.run(delivery(key, { worker: 'a', mode: 'terminate' }));
          expect(cut.kind).toBe('store-unavailable');
          expect(cut.kind === 'store-unavailable' && cut.error).toBeInstanceOf(StoreUnavailableError);
          expect(await ledgerRows(key)).toHaveLength(0);
          // The pool replaced the broken connection: the next run completes.
          expect((await runToEnd(r, delivery(key, { worker: 'b' }))).kind).toBe('completed');
          expect((await ledgerRows(key)).map((row) => row.worker)).toEqual(['b']);
        });
      });
    }

    it("refuses a zombie's commit: its writes roll back, the new owner's stay", async () => {
      const r = leased(fixture.layer);
      const key = unique('zombie');
      let reached!: () => void;
      const atGate = new Promise<void>((resolve) => (reached = resolve));
      const gate = createGate();
      gates.set(key, { reached, wait: gate.wait });
      const zombie = r.run(delivery(key, { worker: 'zombie', mode: 'hold' }));
      await atGate;
      await expireLease(env.db, env.schema, 'dl', key);
      const taker = await r.run(delivery(key, { worker: 'taker' }));
      expect(taker.kind).toBe('completed');
      gate.open();
      const fenced = await zombie;
      // Fenced: deferred, to replay the new owner's result.
      expect(fenced.kind).toBe('deferred');
      expect((await ledgerRows(key)).map((row) => row.worker)).toEqual(['taker']);
      expect((await keys.get('dl', key))?.result).toEqual({ booked: key, worker: 'taker' });
    });

    it('commits an external step\'s record before the data layer\'s transaction, then the effect and the key', async () => {
      let charges = 0;
      const r = runner(async (ctx: KeyedJobContext<Payload, JobLike>) => {
        const charge = await ctx.step('charge', async () => ({ charge: ++charges }));
        return ctx.transaction(fixture.layer, async (tx) => ({ ...(await effect(tx, ctx)), ...charge }));
      }, false);
      const key = unique('steps');
      const outcome = await r.run(delivery(key, { worker: 'a' }));
      expect(outcome).toMatchObject({ kind: 'completed', result: { booked: key, worker: 'a', charge: 1 } });
      const { rows } = await sql<{ name: string; result: unknown }>`select name, result from ${sql.id(env.schema, 'job_steps')} where scope = 'dl' and key = ${key}`.execute(env.db);
      expect(rows).toEqual([{ name: 'charge', result: { charge: 1 } }]);
      expect(await ledgerRows(key)).toHaveLength(1);
      // A duplicate replays: neither the step nor the effect runs again.
      expect((await r.run(delivery(key, { worker: 'b' }))).kind).toBe('replayed');
      expect(charges).toBe(1);
    });

    it("refuses a data layer's transaction inside a function handler's fast path (the Kysely one holds the key)", async () => {
      const r = runner(async (ctx: KeyedJobContext<Payload, JobLike>) => ctx.transaction(fixture.layer, (tx) => effect(tx, ctx)), true);
      const key = unique('fast-function');
      const refused = await r.run(delivery(key, { worker: 'a' }));
      expect(refused.kind).toBe('failed-permanently');
      const error = (refused as { error?: unknown }).error;
      expect(error).toBeInstanceOf(ValidationError);
      expect((error as ValidationError).field).toBe('fastPath');
      expect(await ledgerRows(key)).toHaveLength(0);
    });

    it("writes the outbox's row in the data layer's transaction: kept with its commit, gone with its rollback", { tags: [REDIS_TAG] }, async () => {
      const producer = new IdempotentProducer({ queue: 'dl-outbox', connection: { url: env.redisUrl }, prefix: env.redisPrefix, schema: env.schema });
      try {
        const kept = unique('outbox-kept');
        await fixture.layer.transaction(async (tx) => {
          await fixture.insert(tx, { key: kept, fence: 0, worker: 'producer' });
          await producer.enqueue({ name: 'charge', key: kept, data: { cents: 1 } }, { tx: kyselyIn(fixture.layer, tx) });
        });
        const dropped = unique('outbox-dropped');
        await expect(
          fixture.layer.transaction(async (tx) => {
            await fixture.insert(tx, { key: dropped, fence: 0, worker: 'producer' });
            await producer.enqueue({ name: 'charge', key: dropped, data: { cents: 1 } }, { tx: kyselyIn(fixture.layer, tx) });
            throw new Error('changed my mind');
          }),
        ).rejects.toThrow('changed my mind');
        const { rows } = await sql<{ data: { idempotencyKey: string } }>`select data from ${sql.id(env.schema, 'outbox')} where queue = 'dl-outbox'`.execute(env.db);
        const outboxKeys = rows.map((row) => row.data.idempotencyKey);
        expect(outboxKeys).toContain(kept);
        expect(outboxKeys).not.toContain(dropped);
        expect(await ledgerRows(kept)).toHaveLength(1);
        expect(await ledgerRows(dropped)).toHaveLength(0);
      } finally {
        await producer.close();
      }
    });

    describe('database steps in the data layer (ctx.step(name, { dataLayer, transaction }))', () => {
      /** How a step's transaction behaves, by key. */
      const stepModes = new Map<string, 'hold' | 'throw' | 'terminate'>();
      let stepRuns = 0;
      let charges = 0;

      /** An external step, a database step in the data layer, then the completion in it. */
      const stepped = (layer: DataLayer<Tx>) =>
        runner(async (ctx: KeyedJobContext<Payload, JobLike>) => {
          const charge = await ctx.step('charge', async () => ({ charge: ++charges }));
          const booked = await ctx.step('book', {
            dataLayer: layer,
            transaction: async (tx, step) => {
              stepRuns++;
              const worker = behaviors.get(ctx.message.id!)!.worker;
              await fixture.insert(tx, { key: ctx.key, fence: step.fence, worker: `step:${worker}` });
              const mode = stepModes.get(ctx.key);
              if (mode === 'hold') {
                const gate = gates.get(ctx.key)!;
                gate.reached();
                await gate.wait;
              } else if (mode === 'throw') {
                stepModes.delete(ctx.key);
                throw new Error('the step failed');
              } else if (mode === 'terminate') {
                stepModes.delete(ctx.key);
                await fixture.query(tx, 'select pg_terminate_backend(pg_backend_pid())');
              }
              return { bookedBy: worker, position: step.position };
            },
          });
          return ctx.transaction(layer, async (tx) => ({ ...(await effect(tx, ctx)), ...charge, ...booked }));
        }, false);

      async function stepRecords(key: string) {
        const { rows } = await sql<{ name: string; result: unknown; fence: number }>`
          select name, result, fence::int as fence from ${sql.id(env.schema, 'job_steps')} where scope = 'dl' and key = ${key} order by position`.execute(env.db);
        return rows;
      }

      it("commits the step's writes with its record, and a later run replays it without running it", async () => {
        const r = stepped(fixture.layer);
        const key = unique('step-once');
        const before = stepRuns;
        // The completion fails: the key is released, the steps stay recorded.
        const failed = await r.run(delivery(key, { worker: 'a', mode: 'throw' }));
        expect(failed.kind).toBe('retry');
        expect(await stepRecords(key)).toEqual([
          { name: 'charge', result: { charge: expect.any(Number) }, fence: 1 },
          { name: 'book', result: { bookedBy: 'a', position: 2 }, fence: 1 },
        ]);
        expect((await ledgerRows(key)).map((row) => row.worker)).toEqual(['step:a']);
        // The next run replays both steps and completes: the step's writes are there once.
        const done = await r.run(delivery(key, { worker: 'b' }));
        expect(done).toMatchObject({ kind: 'completed', result: { booked: key, worker: 'b', bookedBy: 'a', position: 2 } });
        expect(stepRuns - before).toBe(1);
        expect((await ledgerRows(key)).map((row) => row.worker)).toEqual(['step:a', 'b']);
        // Duplicates replay the stored result.
        expect((await r.run(delivery(key, { worker: 'c' }))).kind).toBe('replayed');
        expect(await ledgerRows(key)).toHaveLength(2);
      });

      it("rolls back a step that throws inside the data layer's transaction: not recorded, run again", async () => {
        const r = stepped(fixture.layer);
        const key = unique('step-throw');
        stepModes.set(key, 'throw');
        const failed = await r.run(delivery(key, { worker: 'a' }));
        expect(failed.kind).toBe('retry');
        expect(failed.kind === 'retry' && (failed.error as Error).message).toBe('the step failed');
        expect(await ledgerRows(key)).toHaveLength(0);
        expect((await stepRecords(key)).map((step) => step.name)).toEqual(['charge']);
        expect((await r.run(delivery(key, { worker: 'b' }))).kind).toBe('completed');
        expect((await ledgerRows(key)).map((row) => row.worker)).toEqual(['step:b', 'b']);
      });

      it("refuses a zombie's step: its writes roll back, the new owner's step and completion stay", async () => {
        const r = stepped(fixture.layer);
        const key = unique('step-zombie');
        let reached!: () => void;
        const atGate = new Promise<void>((resolve) => (reached = resolve));
        const gate = createGate();
        gates.set(key, { reached, wait: gate.wait });
        stepModes.set(key, 'hold');
        const zombie = r.run(delivery(key, { worker: 'zombie' }));
        await atGate;
        stepModes.delete(key);
        await expireLease(env.db, env.schema, 'dl', key);
        const taker = await r.run(delivery(key, { worker: 'taker' }));
        expect(taker.kind).toBe('completed');
        gate.open();
        const fenced = await zombie;
        expect(fenced.kind).toBe('deferred');
        expect((await ledgerRows(key)).map((row) => row.worker)).toEqual(['step:taker', 'taker']);
        expect((await stepRecords(key)).find((step) => step.name === 'book')).toMatchObject({ result: { bookedBy: 'taker' }, fence: 2 });
      });

      (limits.backendTermination === undefined ? it : ((() => undefined) as unknown as typeof it))('defers a step whose backend was terminated, without an attempt, and runs it once later', async () => {
        const r = stepped(fixture.layer);
        const key = unique('step-terminated');
        stepModes.set(key, 'terminate');
        const cut = await r.run(delivery(key, { worker: 'a' }));
        expect(cut.kind).toBe('store-unavailable');
        expect(await ledgerRows(key)).toHaveLength(0);
        expect((await runToEnd(r, delivery(key, { worker: 'b' }))).kind).toBe('completed');
        expect((await ledgerRows(key)).map((row) => row.worker)).toEqual(['step:b', 'b']);
      });

      it('refuses a step body that is no data layer, naming the three shapes', async () => {
        const r = runner(async (ctx: KeyedJobContext<Payload, JobLike>) => ctx.step('book', { dataLayer: {} as DataLayer<Tx>, transaction: async () => 1 }), false);
        const refused = await r.run(delivery(unique('step-invalid'), { worker: 'a' }));
        const error = (refused as { error?: unknown }).error;
        expect(error).toBeInstanceOf(ValidationError);
        expect((error as Error).message).toMatch(/dataLayer, transaction/);
      });
    });

    /** Runs `body` with the data layer opened on a database of its own (not the keys'), dropped after. */
    async function onAnotherDatabase(body: (elsewhere: DataLayerFixture<Tx>) => Promise<void>): Promise<void> {
      const database = `ij_dl_${randomBytes(4).toString('hex')}`;
      await sql`create database ${sql.id(database)}`.execute(env.db);
      const url = new URL(env.databaseDirectUrl);
      url.pathname = `/${database}`;
      let elsewhere: DataLayerFixture<Tx> | undefined;
      try {
        elsewhere = await open(url.toString(), env.schema);
        await body(elsewhere);
      } finally {
        await elsewhere?.close();
        await sql`drop database if exists ${sql.id(database)} with (force)`.execute(env.db);
      }
    }

    function expectRefusalNamingTheFix(error: unknown) {
      expect(error).toBeInstanceOf(DataLayerElsewhereError);
      expect((error as DataLayerElsewhereError).code).toBe('DATA_LAYER_ELSEWHERE');
      expect((error as Error).message).toMatch(/connection string/);
    }

    it('refuses a transaction on another database than the keys at its first job, naming the fix: deferred without an attempt, nothing stored on the key', async () => {
      await onAnotherDatabase(async (elsewhere) => {
        const key = unique('elsewhere');
        for (const r of [leased(elsewhere.layer), fast(elsewhere.layer)]) {
          // The last attempt too: a deployment's fault is never stored as the job's failure.
          const d = { ...delivery(key, { worker: 'a' }), lastAttempt: true };
          const refused = await r.run(d);
          expect(refused).toMatchObject({ kind: 'deferred', reason: 'data-layer-elsewhere' });
          expectRefusalNamingTheFix((refused as { error?: unknown }).error);
          expect(refused.kind === 'deferred' && refused.retryAfterMs).toBeGreaterThan(0);
          const record = await keys.get('dl', key);
          expect(record?.status ?? 'none').not.toBe('failed');
          expect(record?.status ?? 'none').not.toBe('completed');
        }
        expect(await ledgerRows(key)).toHaveLength(0);
        // Pointed at the keys' database, the same key runs, once.
        expect((await runToEnd(leased(fixture.layer), delivery(key, { worker: 'b' }))).kind).toBe('completed');
        expect((await ledgerRows(key)).map((row) => row.worker)).toEqual(['b']);
      });
    });

    describe('a worker given the data layer checks it at start', () => {
      /** The suite's effect, as the worker `queue` writes it: its jobs' ledger rows name the queue. */
      const effectOf = (queue: string) => (tx: Tx, ctx: { key: string; fence: number; job: { id?: string } }) => {
        const message = ctx.job as unknown as JobLike;
        if (!behaviors.has(message.id!)) behaviors.set(message.id!, { worker: queue });
        return effect(tx, { key: ctx.key, fence: ctx.fence, message });
      };
      const worker = (layer: DataLayer<Tx>, form: 'named' | 'database-only', queue: string) =>
        createIdempotentWorker<Payload, unknown>({
          queue,
          connection: { url: env.redisUrl },
          prefix: env.redisPrefix,
          keys,
          logger: silent,
          ...(form === 'named'
            ? { dataLayers: [layer], handler: async (ctx) => ctx.transaction(layer, (tx) => effectOf(queue)(tx, ctx)) }
            : { handler: databaseOnly(layer, (tx, ctx) => effectOf(queue)(tx, ctx)) }),
        });

      for (const form of ['named', 'database-only'] as const) {
        it(`${form === 'named' ? 'dataLayers: [layer]' : 'databaseOnly(layer, …)'}: on another database it takes no job, and waitUntilReady rejects naming the fix`, { tags: [REDIS_TAG] }, async () => {
          await onAnotherDatabase(async (elsewhere) => {
            const queue = unique('start-refused');
            const producer = new IdempotentProducer({ queue, connection: { url: env.redisUrl }, prefix: env.redisPrefix });
            const key = unique('waiting');
            const { jobId } = await producer.enqueue({ name: 'ledger', key, scope: 'dl', data: {} });
            const refused = worker(elsewhere.layer, form, queue);
            try {
              const error = await refused.waitUntilReady().then(
                () => undefined,
                (thrown: unknown) => thrown,
              );
              expectRefusalNamingTheFix(error);
              // Nothing was taken: the job waits, with no attempt used, for a worker that starts.
              await sleep(300);
              const job = await producer.queue.getJob(jobId);
              expect(await job!.getState()).toBe('waiting');
              expect(job!.attemptsMade).toBe(0);
              expect(await keys.get('dl', key)).toBeUndefined();
            } finally {
              await refused.close();
              await producer.close();
            }
          });
        });
      }

      it('on the keys\' database it starts and runs jobs', { tags: [REDIS_TAG] }, async () => {
        const queue = unique('start-ok');
        const producer = new IdempotentProducer({ queue, connection: { url: env.redisUrl }, prefix: env.redisPrefix });
        const started = worker(fixture.layer, 'named', queue);
        try {
          await started.waitUntilReady();
          const key = unique('started');
          await producer.enqueue({ name: 'ledger', key, scope: 'dl', data: {} });
          await expect.poll(async () => (await keys.get('dl', key))?.status, { timeout: 20_000 }).toBe('completed');
          expect((await ledgerRows(key)).map((row) => row.worker)).toEqual([queue]);
        } finally {
          await started.close();
          await producer.close();
        }
      });
    });
  });
}
