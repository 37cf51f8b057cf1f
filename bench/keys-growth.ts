/**
 * How the costs of the claim, the completion, a duplicate's claim and the janitor grow with the
 * keys table, and what hash partitioning changes at the largest size. Behind docs/operations.md
 * ("Sizing" and "A partitioned keys table").
 *
 *   npm run bench:keys-growth -- [--sizes 100000,1000000,10000000] [--partitions 16] [--rounds 3]
 *                                [--claims 2000] [--expired 5000] [--concurrency 5]
 *
 * One plain keys table grows through the sizes (rows made by `generate_series`, shaped like
 * production ones: completed, a small result, a job id), and the same workload runs `--rounds`
 * times at each size. Then a table in `--partitions` hash partitions is filled once to the
 * largest size, and the workload alternates between the two tables, round by round, so that
 * the machine's noise falls on both alike: the ratios are the result, not the absolute rates.
 *
 * Workload of a round: `--claims` new keys claimed and completed on the leased path (two
 * commits each) from `--concurrency` connections; as many claims of random existing keys (a
 * duplicate's claim, answered from the stored result); `--expired` keys made expired and
 * deleted by one janitor (batches of 1,000, partition by partition on the partitioned table).
 *
 * Uses two schemas of its own on DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres),
 * dropped at the end, also after a failure. Not part of CI: 10M keys are about 5 GB per table.
 */
import { createHash, randomBytes, randomInt } from 'node:crypto';
import { sql, type Kysely } from 'kysely';
import { pino } from 'pino';
import { IdempotencyKeys, createPostgresDb, migrate } from '../src/index.js';
import { Janitor } from '../src/process/index.js';
import { optionReader } from './support/cli-args.js';
import { spread, type Spread } from './support/stats.js';

const argv = process.argv.slice(2);
const options = optionReader(argv);
const sizes = (options.value('--sizes') ?? '100000,1000000,10000000').split(',').map(Number);
const partitions = options.positive('--partitions', 16);
const rounds = options.positive('--rounds', 3);
const claims = options.positive('--claims', 2000);
const expiredPerRound = options.positive('--expired', 5000);
const concurrency = options.positive('--concurrency', 5);
if (argv.length > 0) throw new Error(`unknown arguments: ${argv.join(' ')}`);
if (sizes.some((n) => !Number.isInteger(n) || n < expiredPerRound * (rounds * 2 + 2))) {
  throw new Error(`--sizes must be whole numbers larger than the keys the janitor rounds expire (${expiredPerRound * (rounds * 2 + 2)})`);
}

const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const db = createPostgresDb({ connectionString: databaseUrl, maxConnections: concurrency + 2, applicationName: 'bench:keys-growth' });
const silent = pino({ level: 'silent' });
const suffix = randomBytes(3).toString('hex');

/** One keys table under test: its schema, how many generated keys it holds, and which of them the janitor has had. */
interface Table {
  readonly label: string;
  readonly schema: string;
  readonly keys: IdempotencyKeys;
  /** Generated keys are order-1 … order-<filled>. */
  filled: number;
  /** order-1 … order-<expiredUpTo> were expired and deleted by janitor rounds. */
  expiredUpTo: number;
}

/** One round's numbers. */
interface Round {
  readonly claimMs: number;
  readonly completeMs: number;
  readonly leasedPerSecond: number;
  readonly duplicateMs: number;
  readonly janitorPerSecond: number;
}

const keysOf = (t: Table) => sql.id(t.schema, 'idempotency_keys');

async function createTable(label: string, keysPartitions: number): Promise<Table> {
  const schema = `keys_growth_${label}_${suffix}`;
  await migrate(db, { schema, keysPartitions });
  return { label, schema, keys: new IdempotencyKeys({ db, schema }), filled: 0, expiredUpTo: 0 };
}

/** Adds generated completed keys until the table holds order-1 … order-<size>, then vacuums and analyzes it. */
async function growTo(t: Table, size: number): Promise<number> {
  const start = performance.now();
  const chunk = 250_000;
  for (let from = t.filled + 1; from <= size; from += chunk) {
    const to = Math.min(size, from + chunk - 1);
    await sql`
      insert into ${keysOf(t)} (scope, key, fingerprint, status, owner, fence, attempts, result, job_id, queue, job_name,
                                created_at, updated_at, completed_at, expires_at)
      select 'tenant-' || (n % 100), 'order-' || n, md5(n::text), 'completed', -- fingerprint: md5 of n, as a duplicate's claim gives it
             gen_random_uuid(), 1, 1, jsonb_build_object('receipt', 'r-' || n, 'cents', 1999),
             'ij_' || md5(n::text), 'payments', 'charge', now(), now(), now(), now() + interval '7 days'
        from generate_series(${from}::bigint, ${to}::bigint) as n`.execute(db);
  }
  t.filled = size;
  await sql`vacuum (analyze) ${keysOf(t)}`.execute(db);
  return performance.now() - start;
}

/** Bytes of the table with its indexes (every partition's) per row. */
async function bytesPerKey(t: Table): Promise<{ total: number; heap: number; indexes: number; rows: number }> {
  const { rows } = await sql<{ total: string; heap: string; indexes: string; n: string }>`
    select sum(pg_total_relation_size(relid)) as total, sum(pg_table_size(relid)) as heap, sum(pg_indexes_size(relid)) as indexes,
           (select count(*) from ${keysOf(t)}) as n
      from (select ${`${t.schema}.idempotency_keys`}::regclass as relid
            union select relid from pg_partition_tree(${`${t.schema}.idempotency_keys`}::regclass)) as tables`.execute(db);
  const r = rows[0]!;
  const n = Number(r.n);
  return { total: Number(r.total) / n, heap: Number(r.heap) / n, indexes: Number(r.indexes) / n, rows: n };
}

/** Runs `task(i)` for i in 0..count-1 from `concurrency` loops at once. */
async function inParallel(count: number, task: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (next < count) await task(next++);
    }),
  );
}

async function round(t: Table): Promise<Round> {
  // New keys: random ones, spread over the primary key's index like real idempotency keys.
  let claimMs = 0;
  let completeMs = 0;
  const leasedStart = performance.now();
  await inParallel(claims, async () => {
    const key = randomBytes(12).toString('hex');
    const scope = `tenant-${randomInt(100)}`;
    const t0 = performance.now();
    const outcome = await t.keys.claim(scope, key, 'fp');
    const t1 = performance.now();
    if (outcome.kind !== 'claimed') throw new Error(`expected a new key, got ${outcome.kind}`);
    await t.keys.runEffect(outcome, async () => ({ receipt: key }));
    claimMs += t1 - t0;
    completeMs += performance.now() - t1;
  });
  const leasedPerSecond = claims / ((performance.now() - leasedStart) / 1000);

  // Duplicates: claims of random generated keys the janitor has not deleted.
  let duplicateMs = 0;
  await inParallel(claims, async () => {
    const n = t.expiredUpTo + 1 + randomInt(t.filled - t.expiredUpTo);
    const t0 = performance.now();
    const outcome = await t.keys.claim(`tenant-${n % 100}`, `order-${n}`, createHash('md5').update(String(n)).digest('hex'));
    duplicateMs += performance.now() - t0;
    if (outcome.kind !== 'completed') throw new Error(`expected a completed key, got ${outcome.kind}`);
  });

  // The janitor: the next generated keys made expired (not timed), then deleted.
  const from = t.expiredUpTo + 1;
  const to = t.expiredUpTo + expiredPerRound;
  await sql`
    update ${keysOf(t)} set expires_at = now() - interval '1 minute'
     where (scope, key) in (select 'tenant-' || (n % 100), 'order-' || n from generate_series(${from}::bigint, ${to}::bigint) as n)`.execute(db);
  t.expiredUpTo = to;
  const janitor = new Janitor({ db, schema: t.schema, batchSize: 1000, maxBatchesPerRun: 100_000, logger: silent });
  const janitorStart = performance.now();
  const { keysDeleted } = await janitor.runOnce();
  const janitorPerSecond = keysDeleted / ((performance.now() - janitorStart) / 1000);
  if (keysDeleted !== expiredPerRound) throw new Error(`the janitor deleted ${keysDeleted} keys, expected ${expiredPerRound}`);

  return { claimMs: claimMs / claims, completeMs: completeMs / claims, leasedPerSecond, duplicateMs: duplicateMs / claims, janitorPerSecond };
}

interface Summary {
  readonly claimMs: Spread;
  readonly completeMs: Spread;
  readonly leasedPerSecond: Spread;
  readonly duplicateMs: Spread;
  readonly janitorPerSecond: Spread;
}

function summarize(results: readonly Round[]): Summary {
  const of = (pick: (r: Round) => number) => spread(results.map(pick));
  return {
    claimMs: of((r) => r.claimMs),
    completeMs: of((r) => r.completeMs),
    leasedPerSecond: of((r) => r.leasedPerSecond),
    duplicateMs: of((r) => r.duplicateMs),
    janitorPerSecond: of((r) => r.janitorPerSecond),
  };
}

const COLUMNS = ['claim ms', 'completion ms', 'leased keys/s', 'duplicate claim ms', 'janitor keys/s'] as const;
const cells = (s: Summary) => [
  s.claimMs.median.toFixed(2),
  s.completeMs.median.toFixed(2),
  s.leasedPerSecond.median.toFixed(0),
  s.duplicateMs.median.toFixed(2),
  s.janitorPerSecond.median.toFixed(0),
];

function printTable(title: string, header: readonly string[], rows: readonly (readonly string[])[]): void {
  console.log(`\n${title}\n`);
  console.log(`| ${header.join(' | ')} |`);
  console.log(`|${header.map(() => '---').join('|')}|`);
  for (const row of rows) console.log(`| ${row.join(' | ')} |`);
}

async function main(): Promise<void> {
  const { rows: version } = await sql<{ v: string }>`select current_setting('server_version') as v`.execute(db);
  console.log(
    `keys growth: Postgres ${version[0]!.v}, ${rounds} rounds of ${claims} leased claims + completions, ${claims} duplicate claims ` +
      `and ${expiredPerRound} janitor deletions per size; ${concurrency} connections; medians of the rounds`,
  );
  const tables: Table[] = [];
  try {
    const plain = await createTable('plain', 0);
    tables.push(plain);
    const curve: string[][] = [];
    let largest: { rounds: Round[]; bytes: Awaited<ReturnType<typeof bytesPerKey>> } | undefined;
    for (const size of sizes) {
      const fillMs = await growTo(plain, size);
      const results: Round[] = [];
      for (let r = 0; r < rounds; r++) results.push(await round(plain));
      const bytes = await bytesPerKey(plain);
      console.log(`plain table at ${size.toLocaleString('en')} keys (grown in ${(fillMs / 1000).toFixed(0)} s, ${bytes.total.toFixed(0)} bytes/key): ${cells(summarize(results)).join(', ')}`);
      curve.push([size.toLocaleString('en'), ...cells(summarize(results)), bytes.total.toFixed(0)]);
      largest = { rounds: results, bytes };
    }
    printTable('One plain keys table, by size (medians of the rounds)', ['keys', ...COLUMNS, 'bytes/key'], curve);

    const size = sizes[sizes.length - 1]!;
    const hashed = await createTable(`p${partitions}`, partitions);
    tables.push(hashed);
    const fillMs = await growTo(hashed, size);
    console.log(`\n${partitions} partitions filled to ${size.toLocaleString('en')} keys in ${(fillMs / 1000).toFixed(0)} s`);
    // Alternate, plain first, so that both layouts see the same stretch of the machine's noise.
    const plainRounds = [...largest!.rounds];
    const hashedRounds: Round[] = [];
    for (let r = 0; r < rounds; r++) {
      plainRounds.push(await round(plain));
      hashedRounds.push(await round(hashed));
    }
    const a = summarize(plainRounds);
    const b = summarize(hashedRounds);
    const hashedBytes = await bytesPerKey(hashed);
    const ratio = (x: Spread, y: Spread) => (y.median / x.median).toFixed(2);
    printTable(
      `At ${size.toLocaleString('en')} keys: plain vs ${partitions} hash partitions (plain: ${plainRounds.length} rounds, partitioned: ${hashedRounds.length}, alternating)`,
      ['layout', ...COLUMNS, 'bytes/key'],
      [
        ['plain', ...cells(a), largest!.bytes.total.toFixed(0)],
        [`${partitions} partitions`, ...cells(b), hashedBytes.total.toFixed(0)],
        [
          'partitioned / plain',
          ratio(a.claimMs, b.claimMs),
          ratio(a.completeMs, b.completeMs),
          ratio(a.leasedPerSecond, b.leasedPerSecond),
          ratio(a.duplicateMs, b.duplicateMs),
          ratio(a.janitorPerSecond, b.janitorPerSecond),
          (hashedBytes.total / largest!.bytes.total).toFixed(2),
        ],
      ],
    );
    console.log(
      `\nbytes per key at ${size.toLocaleString('en')}: plain ${largest!.bytes.total.toFixed(0)} (heap ${largest!.bytes.heap.toFixed(0)}, indexes ${largest!.bytes.indexes.toFixed(0)}); ` +
        `partitioned ${hashedBytes.total.toFixed(0)} (heap ${hashedBytes.heap.toFixed(0)}, indexes ${hashedBytes.indexes.toFixed(0)})`,
    );
  } finally {
    for (const t of tables) await dropSchema(db, t.schema);
    await db.destroy();
  }
}

async function dropSchema(on: Kysely<any>, schema: string): Promise<void> {
  await sql`drop schema if exists ${sql.id(schema)} cascade`.execute(on);
}

await main();
