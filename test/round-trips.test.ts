/** Postgres round trips per protocol operation, counted at the driver (not guessed). */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { IdempotencyKeys, isHeld } from '../src/index.js';
import { createCountingDb } from './support/counting-db.js';
import { createEffectsTable, insertEffect } from './support/protocol-fixtures.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

let env: TestEnv;
let counting: ReturnType<typeof createCountingDb>;
let keys: IdempotencyKeys;
const scope = 'rt';

beforeAll(async () => {
  env = await createTestEnv('round_trips');
  await createEffectsTable(env.db, env.schema);
  counting = createCountingDb(env.databaseUrl);
  keys = new IdempotencyKeys({ db: counting.db, schema: env.schema });
  await sql`select 1`.execute(counting.db); // open a connection outside the counts
});
afterAll(async () => {
  await counting?.db.destroy();
  await env?.teardown();
});

describe('round trips', () => {
  it('every claim outcome costs one round trip when uncontended', async () => {
    const fp = keys.fingerprint({ a: 1 });
    const fresh = await counting.count(() => keys.claim(scope, 'k1', fp));
    const inProgress = await counting.count(() => keys.claim(scope, 'k1', fp));
    const reused = await counting.count(() => keys.claim(scope, 'k1', keys.fingerprint({ a: 2 })));
    const claim = await keys.claim(scope, 'k2', fp);
    if (!isHeld(claim)) throw new Error('expected to hold k2');
    await keys.runEffect(claim, async () => 'done');
    const replay = await counting.count(() => keys.claim(scope, 'k2', fp));
    const counts = { fresh: fresh.roundTrips, inProgress: inProgress.roundTrips, reused: reused.roundTrips, replay: replay.roundTrips };
    console.log('round trips per claim:', JSON.stringify(counts));
    expect(counts).toEqual({ fresh: 1, inProgress: 1, reused: 1, replay: 1 });
  });

  it('the leased effect boundary and the fast path: counted and reported', async () => {
    const fp = keys.fingerprint({ b: 1 });
    const claim = await keys.claim(scope, 'k3', fp);
    if (!isHeld(claim)) throw new Error('expected to hold k3');
    const leased = await counting.count(() => keys.runEffect(claim, (tx) => insertEffect(tx, env.schema, { scope, key: 'k3', fence: claim.fence, worker: 't' }).then(() => 'ok')));
    const fast = await counting.count(() =>
      keys.executeOnce(scope, 'k4', fp, (tx, c) => insertEffect(tx, env.schema, { scope, key: 'k4', fence: c.fence, worker: 't' }).then(() => 'ok')),
    );
    const brief = (statements: string[]) => statements.map((s) => s.split(/\s+/).slice(0, 3).join(' ')).join(' | ');
    console.log(`leased effect boundary (1 effect statement): ${leased.roundTrips} round trips: ${brief(leased.statements)}`);
    console.log(`fast path (1 effect statement): ${fast.roundTrips} round trips: ${brief(fast.statements)}`);
    const commits = (statements: string[]) => statements.join('\n').match(/\bcommit\b/gi)?.length ?? 0;
    // At most: BEGIN, the effect, the fenced completion, COMMIT (the claim before it: +1).
    expect(leased.roundTrips).toBeLessThanOrEqual(4);
    expect(commits(leased.statements)).toBe(1);
    // The fast path claims inside the effect's transaction: one commit in all, and no more
    // round trips than the leased path's claim plus its effect boundary.
    expect(commits(fast.statements)).toBe(1);
    expect(fast.roundTrips).toBeLessThanOrEqual(leased.roundTrips + 1);
  });
});
