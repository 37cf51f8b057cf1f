/**
 * Property test: random interleavings (fast-check's scheduler) of claim, extend, complete,
 * lease expiry and takeover, by several workers over several keys, against real Postgres.
 * Invariant: per key at most one committed effect, and every committed completion carries
 * the key's current fence.
 */
import fc from 'fast-check';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { IdempotencyKeys, LeaseLostError, isHeld } from '../src/index.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';
import { createEffectsTable, effectsOf, expireLease, insertEffect } from './support/protocol-fixtures.js';

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

it('8. random interleavings never commit two effects for a key, and commits carry the current fence', async () => {
  const seed = Number(process.env.FC_SEED ?? Math.floor(Math.random() * 2 ** 31));
  console.log(`claim property: fast-check seed ${seed} (reproduce with FC_SEED=${seed})`);

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
    { seed, numRuns: 40 },
  );
});
