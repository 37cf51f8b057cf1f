/**
 * What each key feature costs, as a ratio to the same job without it, measured in the same run.
 * Behind docs/benchmarks.md ("Key features").
 *
 *   npm run bench:key-features -- [--rounds 5] [--jobs 2000] [--concurrency 5] [--tombstones 100000]
 *
 * Tombstones: every insert of a new key into the keys table is checked against the key's
 * tombstone (an AFTER INSERT row trigger probing `key_tombstones`' primary key). Measured on
 * new keys, the only ones that reach the trigger: `--jobs` fast-path jobs (`executeOnce`, one
 * insert into an effects table) and as many leased claims and completions, from
 * `--concurrency` connections, against a schema holding `--tombstones` live tombstones; rounds
 * alternate between the trigger enabled and disabled (`alter table … disable trigger`) so the
 * machine's noise falls on both alike. The ratio of the medians is the result.
 *
 * Concurrency limits: a job with a concurrency key takes a slot before its claim and frees it
 * after (two statements). Measured as `--jobs` leased claims and completions with a slot of a
 * key whose limit is never reached (`--concurrency` × 10) against as many without, alternating
 * round by round.
 *
 * Uses one schema of its own on DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres),
 * dropped at the end, also after a failure.
 */
import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { IdempotencyKeys, createPostgresDb, isHeld, migrate } from '../src/index.js';
import { optionReader } from './support/cli-args.js';
import { formatSpread, spread } from './support/stats.js';

const argv = process.argv.slice(2);
const options = optionReader(argv);
const rounds = options.positive('--rounds', 5);
const jobs = options.positive('--jobs', 2000);
const concurrency = options.positive('--concurrency', 5);
const tombstones = options.positive('--tombstones', 100_000);
if (argv.length > 0) throw new Error(`unknown arguments: ${argv.join(' ')}`);

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const db = createPostgresDb({ connectionString: databaseUrl, maxConnections: concurrency + 2, applicationName: 'bench:key-features' });
const schema = `bench_key_features_${randomBytes(3).toString('hex')}`;
const keys = new IdempotencyKeys({ db, schema });

/** Runs `count` calls of `job` from `concurrency` loops; jobs per second. */
async function rate(count: number, job: (n: number) => Promise<void>): Promise<number> {
  let next = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      for (let n = next++; n < count; n = next++) await job(n);
    }),
  );
  return count / ((performance.now() - started) / 1000);
}

async function round(label: string, trigger: boolean): Promise<{ fast: number; leased: number }> {
  await sql`alter table ${sql.id(schema, 'idempotency_keys')} ${sql.raw(trigger ? 'enable' : 'disable')} trigger idempotency_keys_tombstone_check`.execute(db);
  const fast = await rate(jobs, async (n) => {
    const key = `${label}-fast-${n}`;
    const outcome = await keys.executeOnce('bench', key, keys.fingerprint(n), async (tx) => {
      await sql`insert into ${sql.id(schema, 'effects')} (key) values (${key})`.execute(tx);
    });
    if (outcome.kind !== 'executed') throw new Error(`fast path: ${outcome.kind}`);
  });
  const leased = await rate(jobs, async (n) => {
    const key = `${label}-leased-${n}`;
    const claim = await keys.claim('bench', key, keys.fingerprint(n));
    if (!isHeld(claim)) throw new Error(`leased: ${claim.kind}`);
    await keys.runEffect(claim, async (tx) => {
      await sql`insert into ${sql.id(schema, 'effects')} (key) values (${key})`.execute(tx);
    });
  });
  return { fast, leased };
}

async function limitedRound(label: string, limited: boolean): Promise<number> {
  return rate(jobs, async (n) => {
    const key = `${label}-limited-${n}`;
    const slot = limited ? await keys.acquireConcurrencySlot('bench', key, { key: 'tenant:bench', limit: concurrency * 10 }, { starvationMs: 30_000 }) : undefined;
    if (slot && !slot.acquired) throw new Error('a slot was refused below the limit');
    const claim = await keys.claim('bench', key, keys.fingerprint(n));
    if (!isHeld(claim)) throw new Error(`leased: ${claim.kind}`);
    await keys.runEffect(claim, async (tx) => {
      await sql`insert into ${sql.id(schema, 'effects')} (key) values (${key})`.execute(tx);
    });
    if (slot) await keys.releaseConcurrencySlot('bench', key, slot);
  });
}

try {
  await migrate(db, { schema });
  await sql`create table ${sql.id(schema, 'effects')} (id bigint generated always as identity primary key, key text not null)`.execute(db);
  await sql`
    insert into ${sql.id(schema, 'key_tombstones')} (scope, key_hash, fingerprint_hash, failed, finished_at, expires_at)
    select 'bench', sha256(convert_to('old-' || n, 'UTF8')), sha256(convert_to('fp', 'UTF8')), false, now(), now() + interval '30 days'
      from generate_series(1, ${tombstones}) as n`.execute(db);
  await sql`vacuum analyze ${sql.id(schema, 'key_tombstones')}`.execute(db);
  await round('warm-up', true);
  const on: Array<{ fast: number; leased: number }> = [];
  const off: Array<{ fast: number; leased: number }> = [];
  for (let r = 0; r < rounds; r++) {
    // Alternate which goes first, so a drift in the machine's load falls on both.
    if (r % 2 === 0) {
      on.push(await round(`on-${r}`, true));
      off.push(await round(`off-${r}`, false));
    } else {
      off.push(await round(`off-${r}`, false));
      on.push(await round(`on-${r}`, true));
    }
  }
  const row = (what: string, pick: (x: { fast: number; leased: number }) => number) => {
    const withIt = spread(on.map(pick));
    const without = spread(off.map(pick));
    return `| ${what} | ${formatSpread(withIt)} | ${formatSpread(without)} | ${(withIt.median / without.median).toFixed(3)} |`;
  };
  console.log(`tombstone check: ${rounds} rounds of ${jobs} new keys per path, ${concurrency} connections, ${tombstones} live tombstones\n`);
  console.log('| path | jobs/s with the check | jobs/s without | ratio |');
  console.log('|---|---|---|---|');
  console.log(row('fast path (executeOnce)', (x) => x.fast));
  console.log(row('leased claim + completion', (x) => x.leased));

  const withSlot: number[] = [];
  const withoutSlot: number[] = [];
  for (let r = 0; r < rounds; r++) {
    if (r % 2 === 0) {
      withSlot.push(await limitedRound(`slot-${r}`, true));
      withoutSlot.push(await limitedRound(`noslot-${r}`, false));
    } else {
      withoutSlot.push(await limitedRound(`noslot-${r}`, false));
      withSlot.push(await limitedRound(`slot-${r}`, true));
    }
  }
  const a = spread(withSlot);
  const b = spread(withoutSlot);
  console.log(`\nconcurrency limit: ${rounds} rounds of ${jobs} leased jobs, ${concurrency} connections, one concurrency key of limit ${concurrency * 10}\n`);
  console.log('| path | jobs/s with a concurrency key | jobs/s without | ratio |');
  console.log('|---|---|---|---|');
  console.log(`| leased claim + completion | ${formatSpread(a)} | ${formatSpread(b)} | ${(a.median / b.median).toFixed(3)} |`);
} finally {
  await sql`drop schema if exists ${sql.id(schema)} cascade`.execute(db);
  await db.destroy();
}
