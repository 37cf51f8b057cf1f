/**
 * What an effect written in your own data layer costs, in-process (no broker: the runner every
 * consumer uses, driven directly), against the same one-row effect through Kysely
 * (`ctx.transaction(fn)`, leased; `databaseOnly(fn)`, fast path with group commit) and against
 * the lean baseline (node-postgres, `begin; insert; commit` per job, at least once). Each data
 * layer runs leased (`ctx.transaction(dataLayer, fn)`) and database-only (`databaseOnly(dataLayer,
 * fn)`, the fast path; never grouped). Rounds alternate the contenders so that all see the same
 * machine load; each rate is the median of the rounds, each ratio taken against the medians of
 * the same run. Used by `npm run bench:data-layers` and by `npm run bench`'s data-layers section.
 *
 * The Prisma rows need `prisma generate` of examples/prisma-worker (done here when its client is
 * missing, with the CLI of tools/prisma).
 */
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { PrismaPg } from '@prisma/adapter-pg';
import { sql as drizzleSql } from 'drizzle-orm';
import { drizzle } from 'drizzle-orm/node-postgres';
import knex, { type Knex } from 'knex';
import { sql } from 'kysely';
import pg from 'pg';
import { pino } from 'pino';
import postgres from 'postgres';
import { DataSource } from 'typeorm';
import {
  IdempotencyKeys,
  KeyedJobRunner,
  createPostgresDb,
  databaseOnly,
  identityFromWireContract,
  migrate,
  resolveWorkerTiming,
  type DataLayer,
  type JobLike,
  type KeyedJobHandler,
} from 'idempotent-jobs';
import { drizzleDataLayer } from 'idempotent-jobs/drizzle';
import { knexDataLayer } from 'idempotent-jobs/knex';
import { pgDataLayer } from 'idempotent-jobs/pg';
import { postgresJsDataLayer } from 'idempotent-jobs/postgres-js';
import { prismaDataLayer } from 'idempotent-jobs/prisma';
import { typeormDataLayer } from 'idempotent-jobs/typeorm';


/** Options of {@link runDataLayersBench}. */
export interface DataLayersBenchOptions {
  /** Jobs per contender and round. */
  readonly jobs: number;
  /** Rounds; the rate is the median. */
  readonly rounds: number;
  /** Postgres to run on (a schema of its own, dropped after). */
  readonly databaseUrl: string;
}

/** One contender's rate and its ratios, all from the same run. */
export interface DataLayersRow {
  readonly name: string;
  /** `baseline`, `leased` or `database-only`. */
  readonly path: 'baseline' | 'leased' | 'database-only';
  /** Median jobs/s of the rounds. */
  readonly jobsPerSec: number;
  readonly roundsJobsPerSec: readonly number[];
  /** Against the lean baseline. */
  readonly xLean: number;
  /** Against Kysely on the same path (leased, or database-only); undefined for the baseline. */
  readonly xKyselySamePath: number | undefined;
}

/** What {@link runDataLayersBench} measured. */
export interface DataLayersRun {
  readonly jobs: number;
  readonly rounds: number;
  readonly concurrency: number;
  readonly rows: readonly DataLayersRow[];
}

const CONCURRENCY = 16;
const LEAN = 'lean baseline (node-postgres, at least once)';
const KYSELY_LEASED = 'Kysely, leased';
const KYSELY_FAST = 'Kysely, database-only (fast path, group commit)';

/** Runs every contender `rounds` times, alternating them, and returns the medians and ratios. */
export async function runDataLayersBench(options: DataLayersBenchOptions): Promise<DataLayersRun> {
  const { jobs, rounds, databaseUrl: url } = options;
  const schema = `bench_dl_${randomBytes(4).toString('hex')}`;
  const table = `"${schema}".effects`;
  const db = createPostgresDb({ connectionString: url, maxConnections: CONCURRENCY, applicationName: 'idempotent-jobs:bench-data-layers' }, () => {});
  await migrate(db, { schema });
  await sql`create table ${sql.raw(table)} (key text not null)`.execute(db);
  const keys = new IdempotencyKeys({ db, schema });
  const silent = pino({ level: 'silent' });

  // Each data layer with a pool of CONCURRENCY connections, and the one-row effect in its own API.
  // Drizzle runs over node-postgres's pool (the contenders never run at once): seven pools of
  // their own and the keys' would need more connections than a server's default max_connections (100).
  const pool = new pg.Pool({ connectionString: url, max: CONCURRENCY });
  pool.on('error', () => {});
  const postgresJs = postgres(url, { max: CONCURRENCY, onnotice: () => {} });
  const dataSource = await new DataSource({ type: 'postgres', url, poolSize: CONCURRENCY }).initialize();
  const knexDb = knex({ client: 'pg', connection: url, pool: { min: 0, max: CONCURRENCY } });
  const generated = fileURLToPath(new URL('../../examples/prisma-worker/generated/client.ts', import.meta.url));
  if (!existsSync(generated)) {
    // The Prisma CLI lives in tools/prisma (see its package.json).
    const cli = fileURLToPath(new URL('../../tools/prisma/node_modules/.bin/prisma', import.meta.url));
    if (!existsSync(cli)) execFileSync('npm', ['ci', '--prefix', 'tools/prisma', '--no-audit', '--no-fund'], { stdio: 'ignore' });
    execFileSync(cli, ['generate', '--schema', 'examples/prisma-worker/schema.prisma'], {
      env: { ...process.env, PRISMA_SCHEMA_ENGINE_BINARY: '/bin/false' },
      stdio: 'ignore',
    });
  }
  const { PrismaClient } = (await import(generated)) as { PrismaClient: new (options: object) => any };
  const prisma = new PrismaClient({ adapter: new PrismaPg({ connectionString: url, max: CONCURRENCY }) });

  type Effect<Tx> = (tx: Tx, key: string) => Promise<unknown>;
  const layers: Array<[string, DataLayer<any>, Effect<any>]> = [
    ['node-postgres', pgDataLayer(pool), (client: pg.PoolClient, key) => client.query(`insert into ${table} (key) values ($1)`, [key])],
    ['postgres.js', postgresJsDataLayer(postgresJs), (tx: postgres.ReservedSql, key) => tx.unsafe(`insert into ${table} (key) values ($1)`, [key])],
    ['Drizzle (node-postgres)', drizzleDataLayer(drizzle(pool)), (tx: { execute(q: unknown): Promise<unknown> }, key) => tx.execute(drizzleSql`insert into ${drizzleSql.raw(table)} (key) values (${key})`)],
    ['Prisma (adapter-pg)', prismaDataLayer(prisma), (tx: { $executeRawUnsafe(q: string, ...v: unknown[]): Promise<unknown> }, key) => tx.$executeRawUnsafe(`insert into ${table} (key) values ($1)`, key)],
    ['TypeORM', typeormDataLayer(dataSource), (manager: { query(q: string, p: unknown[]): Promise<unknown> }, key) => manager.query(`insert into ${table} (key) values ($1)`, [key])],
    ['Knex', knexDataLayer(knexDb), (trx: Knex.Transaction, key) => trx.raw(`insert into ${table} (key) values (?)`, [key]).then(() => null)],
  ];

  type Contender = readonly [name: string, drain: (round: string) => Promise<void>];

  /** Runs `jobs` deliveries through a runner with `handler`, CONCURRENCY at a time. */
  function throughRunner(handler: KeyedJobHandler<unknown, unknown, JobLike>, fastPath?: boolean) {
    const runner = new KeyedJobRunner<unknown, unknown, JobLike>({
      keys,
      timing: resolveWorkerTiming({}, keys.options.leaseMs),
      handler,
      identityOf: (message) => identityFromWireContract(message),
      logger: silent,
      fastPath,
    });
    return async (round: string) => {
      let next = 0;
      await Promise.all(
        Array.from({ length: CONCURRENCY }, async () => {
          for (let i = next++; i < jobs; i = next++) {
            const message: JobLike = { id: `${round}-${i}`, name: 'bench', data: { idempotencyKey: `${round}-${i}`, scope: 'bench', payload: {} } };
            const outcome = await runner.run({ message, id: message.id, label: message.id!, queue: 'bench', name: 'bench', lastAttempt: false, deferrals: 0 });
            if (outcome.kind !== 'completed') throw new Error(`${round}-${i}: ${outcome.kind}`);
          }
        }),
      );
    };
  }

  const lean: Contender = [
    LEAN,
    async (round) => {
      let next = 0;
      await Promise.all(
        Array.from({ length: CONCURRENCY }, async () => {
          for (let i = next++; i < jobs; i = next++) {
            const client = await pool.connect();
            try {
              await client.query('begin');
              await client.query(`insert into ${table} (key) values ($1)`, [`${round}-${i}`]);
              await client.query('commit');
            } finally {
              client.release();
            }
          }
        }),
      );
    },
  ];
  const insertKysely = (tx: typeof db, key: string) => sql`insert into ${sql.raw(table)} (key) values (${key})`.execute(tx).then(() => null);
  const contenders: Contender[] = [
    lean,
    [KYSELY_LEASED, throughRunner(async (ctx) => ctx.transaction((tx) => insertKysely(tx, ctx.key)), false)],
    [KYSELY_FAST, throughRunner(databaseOnly(async (tx, ctx) => insertKysely(tx, ctx.key)))],
    ...layers.flatMap(([name, layer, effect]): Contender[] => [
      [`${name}, leased`, throughRunner(async (ctx) => ctx.transaction(layer, (tx) => effect(tx, ctx.key).then(() => null)), false)],
      [`${name}, database-only (fast path)`, throughRunner(databaseOnly(layer, async (tx, ctx: { key: string }) => effect(tx, ctx.key).then(() => null)))],
    ]),
  ];

  const rates = new Map<string, number[]>(contenders.map(([name]) => [name, []]));
  for (let round = 1; round <= rounds; round++) {
    for (const [index, [name, drain]] of contenders.entries()) {
      const began = performance.now();
      await drain(`r${round}c${index}`);
      rates.get(name)!.push(jobs / ((performance.now() - began) / 1000));
    }
  }
  const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;
  const leanRate = median(rates.get(LEAN)!);
  const kyselyLeased = median(rates.get(KYSELY_LEASED)!);
  const kyselyFast = median(rates.get(KYSELY_FAST)!);
  const rows = contenders.map(([name]): DataLayersRow => {
    const rate = median(rates.get(name)!);
    const path = name === LEAN ? 'baseline' : name.includes('database-only') ? 'database-only' : 'leased';
    const kysely = path === 'baseline' ? undefined : path === 'database-only' ? kyselyFast : kyselyLeased;
    return { name, path, jobsPerSec: rate, roundsJobsPerSec: rates.get(name)!, xLean: rate / leanRate, xKyselySamePath: kysely === undefined ? undefined : rate / kysely };
  });
  await sql`drop schema ${sql.id(schema)} cascade`.execute(db);
  await Promise.all([db.destroy(), pool.end(), postgresJs.end(), dataSource.destroy(), knexDb.destroy(), prisma.$disconnect()]);
  return { jobs, rounds, concurrency: CONCURRENCY, rows };
}

/** The run as a Markdown table: jobs/s, × lean baseline, × Kysely on the same path. */
export function formatDataLayersTable(run: DataLayersRun): string {
  return [
    `${run.jobs} jobs per contender and round, ${run.rounds} rounds, concurrency ${run.concurrency}; median jobs/s`,
    '| Contender | jobs/s | × lean baseline | × Kysely, same path |',
    '| --- | ---: | ---: | ---: |',
    ...run.rows.map((row) => `| ${row.name} | ${Math.round(row.jobsPerSec)} | ${row.xLean.toFixed(2)} | ${row.xKyselySamePath === undefined ? '' : row.xKyselySamePath.toFixed(2)} |`),
  ].join('\n');
}
