/**
 * Property tests: random interleavings (fast-check's scheduler) of concurrent claimers against
 * real Postgres, each operation on a connection of its own.
 *
 * 8. claim, extend, complete, lease expiry and takeover by several workers over several keys:
 *    per key at most one committed effect, and every committed completion carries the key's
 *    current fence.
 * 9. claimers that also release, fail, record a database step and abandon their keys, while
 *    leases expire and a janitor deletes finished keys (kept 1 ms), with or without tombstones:
 *    each life of a key (from its insert to its deletion) commits at most one effect and one
 *    step record; a completed key's effect is its own life's, under its fence; a failed key's
 *    life committed none; no key is left held but by a claimer that abandoned it.
 */
import fc from 'fast-check';
import { pino } from 'pino';
import { sql, type Kysely } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { IdempotencyKeys, LeaseLostError, isHeld, type Claim } from '../src/index.js';
import { Janitor } from '../src/process/index.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';
import { createEffectsTable, effectsOf, expireLease, insertEffect } from './support/protocol-fixtures.js';
import { propertyRuns } from './support/property-runs.js';

let env: TestEnv;
let workers: IdempotencyKeys[];
const WORKERS = 3;
const KEYS = 2;
const scope = 'property';

beforeAll(async () => {
  env = await createTestEnv('claim_property');
  await createEffectsTable(env.db, env.schema);
  const db = env.openDb(12);
  workers = Array.from({ length: WORKERS }, () => new IdempotencyKeys({ db, schema: env.schema, leaseMs: 60_000 }));
});
afterAll(async () => {
  await env?.teardown();
});

let run = 0;
const runs = propertyRuns('claim property', 40);

it('8. random interleavings never commit two effects for a key, and commits carry the current fence', async () => {
  const plan = fc.record({
    extendFirst: fc.array(fc.boolean(), { minLength: WORKERS, maxLength: WORKERS }),
    expiries: fc.array(fc.integer({ min: 0, max: KEYS - 1 }), { minLength: 0, maxLength: 4 }),
    retries: fc.integer({ min: 1, max: 3 }),
  });

  await fc.assert(
    fc.asyncProperty(fc.scheduler(), plan, async (s, { extendFirst, expiries, retries }) => {
      run++;
      const keyNames = Array.from({ length: KEYS }, (_, k) => `run${run}-key${k}`);
      const commits: Array<{ key: string; fence: number }> = [];

      const worker = async (w: number, key: string) => {
        const keys = workers[w]!;
        for (let attempt = 0; attempt < retries; attempt++) {
          await s.schedule(Promise.resolve(`w${w} claims ${key}`));
          const outcome = await keys.claim(scope, key, keys.fingerprint({ key }));
          if (!isHeld(outcome)) {
            if (outcome.kind === 'in-progress') continue;
            return;
          }
          if (extendFirst[w]) {
            await s.schedule(Promise.resolve(`w${w} extends ${key}`));
            await keys.extend(outcome);
          }
          try {
            await keys.runEffect(outcome, async (tx) => {
              await insertEffect(tx, env.schema, { scope, key, fence: outcome.fence, worker: `w${w}` });
              await s.schedule(Promise.resolve(`w${w} completes ${key}`));
            });
            commits.push({ key, fence: outcome.fence });
            return;
          } catch (error) {
            if (!(error instanceof LeaseLostError)) throw error;
          }
        }
      };
      const nemesis = async () => {
        for (const k of expiries) {
          await s.schedule(Promise.resolve(`lease of key${k} expires`));
          await expireLease(env.db, env.schema, scope, keyNames[k]!);
        }
      };

      const all = Promise.all([...keyNames.flatMap((key) => workers.map((_, w) => worker(w, key))), nemesis()]);
      await s.waitFor(all);

      for (const key of keyNames) {
        const effects = await effectsOf(env.db, env.schema, scope, key);
        const row = await workers[0]!.get(scope, key);
        expect(effects.length, `${key}: ${s.report().map((t) => t.label).join(' > ')}`).toBeLessThanOrEqual(1);
        const committed = commits.filter((c) => c.key === key);
        expect(committed.length).toBe(effects.length);
        if (row?.status === 'completed') {
          expect(effects).toHaveLength(1);
          expect(effects[0]!.fence).toBe(row.fence);
          expect(committed[0]!.fence).toBe(row.fence);
        } else {
          expect(effects).toHaveLength(0);
        }
      }
    }),
    runs,
  );
}, 60_000 + runs.numRuns * 1_000);

/** The effect of a claim's completion or database step, tagged with the life of its key (the row's `created_at`). */
async function insertLifeEffect(tx: Kysely<any>, key: string, fence: number, what: 'effect' | 'step'): Promise<void> {
  await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker)
            select ${scope}, ${key}, ${fence}, ${what} || '@' || k.created_at::text
              from ${sql.id(env.schema, 'idempotency_keys')} as k where k.scope = ${scope} and k.key = ${key}`.execute(tx);
}

const ACTIONS = ['complete', 'release', 'fail', 'abandon'] as const;
const runs9 = propertyRuns('claim property 9', 30);

it('9. concurrent claimers that release, fail, record steps and abandon keys, with leases expiring and a janitor deleting finished keys: one effect and one step record per life of a key', async () => {
  const expiring = workers.map(() => new IdempotencyKeys({ db: env.openDb(4), schema: env.schema, leaseMs: 60_000, retentionMs: 1, groupCommit: false }));
  const janitors = [0, 3_600_000].map((tombstoneMs) => new Janitor({ db: env.db, schema: env.schema, tombstoneMs, logger: pino({ level: 'silent' }) }));
  const plan = fc.record({
    actions: fc.array(fc.constantFrom(...ACTIONS), { minLength: WORKERS * KEYS, maxLength: WORKERS * KEYS }),
    steps: fc.array(fc.boolean(), { minLength: WORKERS * KEYS, maxLength: WORKERS * KEYS }),
    nemesis: fc.array(fc.oneof(fc.record({ expire: fc.nat({ max: KEYS - 1 }) }), fc.record({ janitor: fc.nat({ max: 1 }) })), { maxLength: 6 }),
    attempts: fc.integer({ min: 1, max: 3 }),
  });

  await fc.assert(
    fc.asyncProperty(fc.scheduler(), plan, async (s, { actions, steps, nemesis, attempts }) => {
      run++;
      const keyNames = Array.from({ length: KEYS }, (_, k) => `run${run}-life-key${k}`);
      const abandoned: Claim[] = [];
      const leaseLost = (error: unknown) => {
        if (!(error instanceof LeaseLostError)) throw error;
      };

      const worker = async (w: number, k: number) => {
        const keys = expiring[w]!;
        const key = keyNames[k]!;
        const slot = w * KEYS + k;
        for (let attempt = 0; attempt < attempts; attempt++) {
          await s.schedule(Promise.resolve(`w${w} claims ${key}`));
          const outcome = await keys.claim(scope, key, 'fp');
          if (!isHeld(outcome)) continue;
          if (steps[slot]) {
            await s.schedule(Promise.resolve(`w${w} records step a of ${key}`));
            await keys.runDatabaseStep(outcome, { name: 'a', position: 1 }, (tx) => insertLifeEffect(tx, key, outcome.fence, 'step')).catch(leaseLost);
          }
          const action = actions[slot]!;
          await s.schedule(Promise.resolve(`w${w} ${action}s ${key}`));
          if (action === 'complete') await keys.runEffect(outcome, (tx) => insertLifeEffect(tx, key, outcome.fence, 'effect')).catch(leaseLost);
          else if (action === 'release') await keys.release(outcome);
          else if (action === 'fail') await keys.fail(outcome, new Error('for good'));
          else abandoned.push(outcome);
          return;
        }
      };
      const nemesisRun = async () => {
        for (const move of nemesis) {
          if ('expire' in move) {
            await s.schedule(Promise.resolve(`lease of key${move.expire} expires`));
            await expireLease(env.db, env.schema, scope, keyNames[move.expire]!);
          } else {
            await s.schedule(Promise.resolve(`janitor (tombstones ${move.janitor === 1})`));
            await janitors[move.janitor]!.runOnce();
          }
        }
      };

      await s.waitFor(Promise.all([...keyNames.flatMap((_, k) => workers.map((__, w) => worker(w, k))), nemesisRun()]));

      const order = () => s.report().map((t) => t.label).join(' > ');
      for (const key of keyNames) {
        const { rows: effects } = await sql<{ fence: string; worker: string }>`
          select fence, worker from ${sql.id(env.schema, 'effects')} where scope = ${scope} and key = ${key} order by id`.execute(env.db);
        const perLife = new Map<string, number>();
        for (const e of effects) perLife.set(e.worker, (perLife.get(e.worker) ?? 0) + 1);
        for (const [life, count] of perLife) expect(count, `${key} ${life}: ${order()}`).toBe(1);
        const { rows } = await sql<{ status: string; owner: string | null; fence: string; life: string; live: boolean }>`
          select status, owner::text as owner, fence, created_at::text as life, locked_until > now() as live
            from ${sql.id(env.schema, 'idempotency_keys')} where scope = ${scope} and key = ${key}`.execute(env.db);
        const row = rows[0];
        if (!row) continue;
        const own = effects.filter((e) => e.worker === `effect@${row.life}`);
        if (row.status === 'completed') expect(own.map((e) => Number(e.fence)), `${key}: ${order()}`).toEqual([Number(row.fence)]);
        else expect(own, `${key} is ${row.status}: ${order()}`).toEqual([]);
        // Held only by a claimer that walked away from it, under a live lease.
        if (row.status === 'processing' && row.owner !== null && row.live) {
          expect(abandoned.some((c) => c.key === key && c.owner === row.owner), `${key} held by a claimer that ended: ${order()}`).toBe(true);
        }
      }
    }),
    runs9,
  );
}, 60_000 + runs9.numRuns * 2_000);
