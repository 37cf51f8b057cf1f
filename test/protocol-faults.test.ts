/**
 * A store fault at every statement of the protocol (docs/architecture.md#invariants): each run
 * of a job (claim, steps, effect and completion; release; failure; the fast path; a duplicate
 * refused by a tombstone), each heartbeat and each janitor run is first run once to list the
 * statements it sends, then again once per statement and per fault — the connection cut before
 * the statement, cut after it (its reply lost), disk full (53100) or a serialization failure
 * (40001) in its place — through test/support/statement-faults.ts, on real Postgres. After each
 * faulted run the job is delivered again, as the broker would, until it ends, and the
 * invariants must hold: the faulted run was deferred without using an attempt (the deliveries
 * are their jobs' last attempts), no effect or database step committed twice, an external step
 * ran at most once per claim, and no key was left held: the next delivery ran at once, never
 * waiting out the lease.
 */
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  IdempotencyKeys,
  KeyedJobRunner,
  StoreUnavailableError,
  identityFromWireContract,
  isHeld,
  resolveWorkerTiming,
  toWireJobData,
  type DatabaseOnlyContext,
  type DatabaseOnlyHandler,
  type JobIdentity,
  type KeyedJobContext,
  type RunOutcome,
} from '../src/index.js';
import { Janitor } from '../src/process/index.js';
import { createEffectsTable, effectsOf, insertEffect } from './support/protocol-fixtures.js';
import { StatementFaults, type SentStatement, type StatementFault } from './support/statement-faults.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let faults: StatementFaults;
let keys: IdempotencyKeys;
const SCOPE = 'faults';
/** Never waited out: a key left to its lease would hold up its next delivery for all of it. */
const LEASE_MS = 600_000;
const silent = pino({ level: 'silent' });

const FAULTS: ReadonlyArray<{ readonly label: string; readonly fault: StatementFault }> = [
  { label: 'cut before', fault: { kind: 'cut', when: 'before' } },
  { label: 'cut after', fault: { kind: 'cut', when: 'after' } },
  { label: 'disk full', fault: { kind: 'error', sqlState: '53100', message: 'could not extend file "base/1/2": No space left on device' } },
  { label: 'serialization failure', fault: { kind: 'error', sqlState: '40001' } },
];

beforeAll(async () => {
  env = await createTestEnv('protocol_faults');
  await createEffectsTable(env.db, env.schema);
  faults = StatementFaults.open({ connectionString: env.databaseUrl, maxConnections: 6, applicationName: 'ij-protocol-faults', preparedStatements: env.preparedStatements });
  keys = new IdempotencyKeys({ db: faults.db, schema: env.schema, leaseMs: LEASE_MS, retentionMs: 1 });
});
afterAll(async () => {
  await faults?.close();
  await env?.teardown();
});

interface Message {
  readonly id: string;
  readonly data: unknown;
}
type Handler = (ctx: KeyedJobContext<unknown, Message>) => Promise<unknown>;

/** External calls made, by key and step, with the fence of the claim that made each. */
const externalCalls = new Map<string, number[]>();

/**
 * A runner of `handler` over keys of its own: a store reads some things once and keeps them (the
 * settings a group watches), so each run gets a fresh one and sends every statement the first
 * run sent.
 */
function runnerWith(handler: Handler | DatabaseOnlyHandler<unknown, unknown, DatabaseOnlyContext<unknown, Message>>, options: { fail?: boolean } = {}) {
  return new KeyedJobRunner<unknown, unknown, Message>({
    keys: new IdempotencyKeys({ db: faults.db, schema: env.schema, leaseMs: LEASE_MS, retentionMs: 1 }),
    timing: resolveWorkerTiming({ storeRetryMinMs: 5, storeRetryMaxMs: 20 }, LEASE_MS),
    identityOf: (message) => identityFromWireContract({ id: message.id, name: 'job', data: message.data }) as JobIdentity<unknown>,
    handler,
    ...(options.fail && { errorDisposition: () => 'fail' as const }),
    logger: silent,
  });
}

/** A delivery of `key`'s job, by default its last attempt: a fault counted as an attempt would fail it. */
const delivery = (key: string, lastAttempt = true) => ({
  message: { id: key, data: toWireJobData(SCOPE, key, { key }) },
  id: key,
  label: `Job ${key}`,
  queue: 'q',
  name: 'job',
  lastAttempt,
  deferrals: 0,
});

/** Delivers `key`'s job again until it ends (deferrals only while a release tried again frees the key), and returns the outcomes. */
async function deliverUntilDone(runner: KeyedJobRunner<unknown, unknown, Message>, key: string, lastAttempt = true): Promise<RunOutcome[]> {
  const outcomes: RunOutcome[] = [];
  for (let n = 0; n < 50; n++) {
    const outcome = await runner.run(delivery(key, lastAttempt));
    outcomes.push(outcome);
    if (outcome.kind !== 'deferred' && outcome.kind !== 'store-unavailable' && outcome.kind !== 'retry') return outcomes;
    await new Promise((resolve) => setTimeout(resolve, Math.min(outcome.kind === 'retry' ? 5 : outcome.retryAfterMs, 50)));
  }
  throw new Error(`${key} never ended: ${outcomes.map((o) => o.kind).join(', ')}`);
}

/**
 * Runs `scenario` once without a fault to list its statements, then once per statement and
 * fault, each on a key of its own, checking `after` with the faulted run's outcome.
 */
async function atEveryStatement(name: string, scenario: (key: string) => Promise<RunOutcome | void>, after: (key: string, first: RunOutcome | void, where: string) => Promise<void>) {
  faults.disarm();
  const { result, statements } = await faults.statementsOf(() => scenario(`${name}-dry`));
  expect(result.status, `${name}: the run without a fault`).toBe('fulfilled');
  await after(`${name}-dry`, (result as PromiseFulfilledResult<RunOutcome | void>).value, 'no fault');
  expect(statements.length).toBeGreaterThan(0);
  for (const [index, statement] of statements.entries()) {
    for (const { label, fault } of FAULTS) {
      const key = `${name}-${index + 1}-${label.replace(/ /g, '-')}`;
      faults.arm({ ...occurrence(statements, index), fault });
      const fired = faults.fired.length;
      const first = await scenario(key);
      faults.disarm();
      expect(faults.fired.length, `${label} at statement ${index + 1} (${statement.text}): not sent again`).toBe(fired + 1);
      await after(key, first, `${label} at statement ${index + 1} (${statement.text})`);
    }
  }
  return statements;
}

/** Matches the statement's text as it was sent (parameters differ from key to key, the text does not). */
function exactly(statement: SentStatement): RegExp {
  const cut = statement.text.endsWith('...');
  const escaped = statement.text.replace(/\.\.\.$/, '').replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  return new RegExp(`^\\s*${escaped.replace(/ /g, '\\s+')}${cut ? '' : '\\s*$'}`);
}

/** The `index`th statement of a run as a fault plan: the how-manieth statement of its text it is. */
function occurrence(statements: readonly SentStatement[], index: number): { nth: number; match: RegExp } {
  const match = exactly(statements[index]!);
  return { nth: statements.slice(0, index + 1).filter((s) => match.test(s.text)).length, match };
}

/**
 * The first outcome of a run that met a store fault: deferred, no attempt used, or what the run
 * comes to without a fault (`done`), the handler's own error when that is a retry.
 */
function expectDeferredOrDone(first: RunOutcome | void, done: RunOutcome['kind'], where: string): void {
  expect(['store-unavailable', 'deferred', done], `${where}: ${first && first.kind}`).toContain(first && first.kind);
  if (first?.kind === 'retry' || first?.kind === 'failed-permanently') expect((first.error as Error).message, where).toMatch(/^(try again|never works)$/);
}

describe('a fault at every statement of a job', () => {
  it('a leased run with an external step, a database step and its effect: each effect, step and completion once, the key never left held', async () => {
    const handler: Handler = async (ctx) => {
      await ctx.step('call', async () => {
        externalCalls.set(ctx.key, [...(externalCalls.get(ctx.key) ?? []), ctx.fence]);
        return { called: true };
      });
      await ctx.step('book', { transaction: (tx) => insertEffect(tx, env.schema, { scope: SCOPE, key: `${ctx.key}/book`, fence: ctx.fence, worker: 'step' }) });
      return ctx.transaction(async (tx) => {
        await insertEffect(tx, env.schema, { scope: SCOPE, key: ctx.key, fence: ctx.fence, worker: 'effect' });
        return { done: ctx.key };
      });
    };
    const runner = () => runnerWith(handler);
    const statements = await atEveryStatement('leased', (key) => runner().run(delivery(key)), async (key, first, where) => {
      expectDeferredOrDone(first, 'completed', where);
      const outcomes = await deliverUntilDone(runner(), key);
      expect(outcomes.at(-1)!.kind, `${where}: ${outcomes.map((o) => o.kind).join(', ')}`).toMatch(/^(completed|replayed)$/);
      expect(await effectsOf(env.db, env.schema, SCOPE, key), where).toHaveLength(1);
      expect(await effectsOf(env.db, env.schema, SCOPE, `${key}/book`), where).toHaveLength(1);
      const fences = externalCalls.get(key) ?? [];
      expect(new Set(fences).size, `${where}: the external step ran twice under one claim (${fences.join(', ')})`).toBe(fences.length);
      expect(await keys.get(SCOPE, key), where).toMatchObject({ status: 'completed', result: { done: key } });
    });
    expect(statements.length).toBeGreaterThanOrEqual(5);
  }, 120_000);

  it('a takeover after the lease, with a step recorded by the claim before it: the step replayed (steps read), never run again', async () => {
    // Set up without faults: an earlier claim recorded the step, then its worker died.
    const setup = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: LEASE_MS });
    const handler: Handler = async (ctx) => {
      const called = await ctx.step('call', async () => {
        externalCalls.set(ctx.key, [...(externalCalls.get(ctx.key) ?? []), ctx.fence]);
        return { by: ctx.fence };
      });
      return ctx.transaction(async (tx) => {
        await insertEffect(tx, env.schema, { scope: SCOPE, key: ctx.key, fence: ctx.fence, worker: 'effect' });
        return called;
      });
    };
    const runner = () => runnerWith(handler);
    const scenario = async (key: string) => {
      const faultsWere = faults.armed;
      const earlier = await setup.claim(SCOPE, key, setup.fingerprint({ name: 'job', payload: { key } }));
      if (!isHeld(earlier)) throw new Error(`set-up claim: ${earlier.kind}`);
      await setup.recordStep(earlier, { name: 'call', position: 1 }, { by: earlier.fence });
      await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 second' where scope = ${SCOPE} and key = ${key}`.execute(env.db);
      expect(faults.armed).toBe(faultsWere);
      return runner().run(delivery(key));
    };
    await atEveryStatement('takeover', scenario, async (key, first, where) => {
      expectDeferredOrDone(first, 'completed', where);
      const outcomes = await deliverUntilDone(runner(), key);
      expect(outcomes.at(-1)!.kind, `${where}: ${outcomes.map((o) => o.kind).join(', ')}`).toMatch(/^(completed|replayed)$/);
      expect(externalCalls.get(key), `${where}: the recorded step ran again`).toBeUndefined();
      expect(await effectsOf(env.db, env.schema, SCOPE, key), where).toHaveLength(1);
      expect(await keys.get(SCOPE, key), where).toMatchObject({ status: 'completed', result: { by: 1 } });
    });
  }, 120_000);

  it('a run whose handler throws a retryable error, then succeeds: released, never left to its lease', async () => {
    const thrown = new Set<string>();
    const runner = () => runnerWith(async (ctx) => {
      if (!thrown.has(ctx.key)) {
        thrown.add(ctx.key);
        throw new Error('try again');
      }
      return ctx.transaction(async (tx) => insertEffect(tx, env.schema, { scope: SCOPE, key: ctx.key, fence: ctx.fence, worker: 'effect' }));
    });
    // Not the last attempt: the handler's error is retried (a fault counted as an attempt would show as a retry of its own error).
    await atEveryStatement('released', (key) => runner().run(delivery(key, false)), async (key, first, where) => {
      expectDeferredOrDone(first, 'retry', where);
      const outcomes = await deliverUntilDone(runner(), key, false);
      expect(outcomes.at(-1)!.kind, `${where}: ${outcomes.map((o) => o.kind).join(', ')}`).toMatch(/^(completed|replayed)$/);
      expect(await effectsOf(env.db, env.schema, SCOPE, key), where).toHaveLength(1);
    });
  }, 120_000);

  it('a run that fails for good: the failure stored once, nothing committed, no attempt used by a fault', async () => {
    const runner = () => runnerWith(async () => {
      throw new Error('never works');
    }, { fail: true });
    await atEveryStatement('failed', (key) => runner().run(delivery(key)), async (key, first, where) => {
      expectDeferredOrDone(first, 'failed-permanently', where);
      const outcomes = await deliverUntilDone(runner(), key);
      expect(outcomes.at(-1)!.kind, `${where}: ${outcomes.map((o) => o.kind).join(', ')}`).toMatch(/^(failed-permanently|replayed-failure)$/);
      expect(await keys.get(SCOPE, key), where).toMatchObject({ status: 'failed', error: { message: 'never works' } });
    });
  }, 120_000);

  it('the fast path (a database-only handler): the effect and its key commit together once', async () => {
    const runner = () => runnerWith({ transaction: (tx, ctx) => insertEffect(tx, env.schema, { scope: SCOPE, key: ctx.key, fence: ctx.fence, worker: 'effect' }) });
    await atEveryStatement('fast', (key) => runner().run(delivery(key)), async (key, first, where) => {
      expectDeferredOrDone(first, 'completed', where);
      const outcomes = await deliverUntilDone(runner(), key);
      expect(outcomes.at(-1)!.kind, `${where}: ${outcomes.map((o) => o.kind).join(', ')}`).toMatch(/^(completed|replayed)$/);
      expect(await effectsOf(env.db, env.schema, SCOPE, key), where).toHaveLength(1);
    });
  }, 120_000);
});

describe('a fault at every statement of the lease and of retention', () => {
  it('a heartbeat that meets a fault is "not known yet": the claim still holds the key and completes once', async () => {
    await atEveryStatement(
      'heartbeat',
      async (key) => {
        const claim = await keys.claim(SCOPE, key, 'fp').catch((error: unknown) => {
          if (!(error instanceof StoreUnavailableError)) throw error;
          return undefined;
        });
        if (!claim) return;
        if (!isHeld(claim)) throw new Error(`not held: ${claim.kind}`);
        await keys.extend(claim).catch((error: unknown) => {
          if (!(error instanceof StoreUnavailableError)) throw error;
        });
        // The run goes on (its next beat would try again) and completes.
        await keys.runEffect(claim, (tx) => insertEffect(tx, env.schema, { scope: SCOPE, key, fence: claim.fence, worker: 'effect' })).catch((error: unknown) => {
          if (!(error instanceof StoreUnavailableError)) throw error;
        });
      },
      async (key, _first, where) => {
        // A claim refused by the fault claimed nothing; a completion cut off by it was released
        // (runEffect gives the key back): either way the next claim runs it at once.
        const row = await keys.get(SCOPE, key);
        if (row?.status !== 'completed') {
          if (row) expect(row, where).toMatchObject({ status: 'processing', owner: null });
          const again = await keys.claim(SCOPE, key, 'fp');
          expect(again.kind, where).toBe(row ? 'taken-over' : 'claimed');
          await keys.runEffect(again as never, (tx) => insertEffect(tx, env.schema, { scope: SCOPE, key, fence: (again as { fence: number }).fence, worker: 'effect' }));
        }
        expect(await effectsOf(env.db, env.schema, SCOPE, key), where).toHaveLength(1);
      },
    );
  }, 120_000);

  it('a janitor run never deletes a key without the tombstone it asked for, and the duplicate it refuses never runs', async () => {
    const janitor = new Janitor({ db: faults.db, schema: env.schema, tombstoneMs: 3_600_000, logger: silent });
    const ran = new Set<string>();
    const runner = () => runnerWith(async (ctx) => {
      ran.add(ctx.key);
      return ctx.transaction((tx) => insertEffect(tx, env.schema, { scope: SCOPE, key: ctx.key, fence: ctx.fence, worker: 'effect' }));
    });
    // The janitor's statements: listed with a finished key to delete, then faulted one by one.
    const finish = async (key: string) => {
      ran.delete(key);
      expect((await deliverUntilDone(runner(), key)).at(-1)!.kind).toBe('completed');
      await sql`update ${sql.id(env.schema, 'idempotency_keys')} set expires_at = now() - interval '1 second' where scope = ${SCOPE} and key = ${key}`.execute(env.db);
    };
    await finish('janitor-dry');
    const { statements } = await faults.statementsOf(() => janitor.runOnce());
    expect(statements.length).toBeGreaterThan(0);
    for (const [index, statement] of statements.entries()) {
      for (const { label, fault } of FAULTS) {
        const key = `janitor-${index + 1}-${label.replace(/ /g, '-')}`;
        await finish(key);
        ran.delete(key);
        faults.arm({ ...occurrence(statements, index), fault });
        const fired = faults.fired.length;
        await janitor.runOnce().catch(() => {});
        faults.disarm();
        const where = `${label} at janitor statement ${index + 1} (${statement.text})`;
        expect(faults.fired.length, `${where}: not sent again`).toBe(fired + 1);
        const row = await keys.get(SCOPE, key);
        const { rows: tombstones } = await sql`select 1 from ${sql.id(env.schema, 'key_tombstones')} where scope = ${SCOPE} and key_hash = sha256(convert_to(${key}::text, 'UTF8'))`.execute(env.db);
        expect(row !== undefined || tombstones.length === 1, `${where}: deleted without its tombstone`).toBe(true);
        // Its duplicate, with faults at every statement of its own run: replayed, never run.
        await atEveryStatement(`dup-${index + 1}-${label.replace(/ /g, '-')}`, () => runner().run(delivery(key)), async (_k, first, dupWhere) => {
          expect(['replayed', 'store-unavailable', 'deferred'], `${where}, then ${dupWhere}`).toContain(first && first.kind);
        });
        expect(ran.has(key), `${where}: the duplicate ran`).toBe(false);
        expect(await effectsOf(env.db, env.schema, SCOPE, key), where).toHaveLength(1);
      }
    }
  }, 240_000);
});
