/**
 * What both peer benchmarks share: the same effect as the at-least-once baseline (one
 * transaction inserting one row), on a pool of their own, and the result line they print.
 */
import { readFileSync } from 'node:fs';
import pg from 'pg';

/** What a peer run reports (one JSON line on stdout: `{"msg":"result", ...}`). */
export interface PeerResult {
  readonly peer: string;
  readonly version: string;
  readonly n: number;
  readonly concurrency: number;
  readonly settings: string;
  readonly elapsedMs: number;
  readonly jobsPerSec: number;
  readonly effects: number;
  readonly dedupFeature: string;
  /** A second enqueue of a key while its first job is still queued was dropped. */
  readonly dedupWhileQueued: boolean;
  /** Effect rows for a key enqueued, completed, and enqueued again (2 means it ran twice). */
  readonly effectsAfterReEnqueue: number;
}

/** Peer run parameters, from the environment the orchestrator sets. */
export function peerSettings() {
  return {
    databaseUrl: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres',
    n: Number(process.env.BENCH_N ?? 2000),
    concurrency: Number(process.env.BENCH_CONCURRENCY ?? 16),
    schemaPrefix: process.env.BENCH_SCHEMA_PREFIX ?? `peer_${process.pid}`,
  };
}

/** The effect table and a pool to write it with. */
export class PeerEffects {
  readonly pool: pg.Pool;
  readonly table: string;
  readonly schema: string;
  count = 0;
  readonly #waiters = new Set<() => void>();

  constructor(databaseUrl: string, schema: string, poolSize: number) {
    this.pool = new pg.Pool({ connectionString: databaseUrl, max: poolSize, application_name: 'idempotent-jobs:bench-peer' });
    this.schema = schema;
    this.table = `"${schema}".bench_effects`;
  }

  async create(): Promise<void> {
    await this.pool.query(`create schema if not exists "${this.schema}"`);
    await this.pool.query(`create table ${this.table} (id bigint generated always as identity primary key, key text not null)`);
  }

  /** The effect: one transaction, one insert (exactly what the baseline does). */
  async run(key: string): Promise<void> {
    const client = await this.pool.connect();
    try {
      await client.query('begin');
      await client.query(`insert into ${this.table} (key) values ($1)`, [key]);
      await client.query('commit');
    } catch (error) {
      await client.query('rollback').catch(() => {});
      throw error;
    } finally {
      client.release();
    }
    this.count++;
    for (const wake of this.#waiters) wake();
  }

  /** Resolves once `count` effects ran in this process. */
  waitForCount(count: number, timeoutMs: number): Promise<void> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#waiters.delete(check);
        reject(new Error(`only ${this.count} of ${count} effects after ${timeoutMs} ms`));
      }, timeoutMs);
      const check = () => {
        if (this.count >= count) {
          clearTimeout(timer);
          this.#waiters.delete(check);
          resolve();
        }
      };
      this.#waiters.add(check);
      check();
    });
  }

  async effectsFor(key: string): Promise<number> {
    const { rows } = await this.pool.query(`select count(*)::int as c from ${this.table} where key = $1`, [key]);
    return rows[0].c;
  }

  async dropSchemas(...schemas: string[]): Promise<void> {
    for (const schema of schemas) await this.pool.query(`drop schema if exists "${schema}" cascade`);
    await this.pool.end();
  }
}

/** Prints the result line the orchestrator reads. */
export function report(result: PeerResult): void {
  process.stdout.write(`${JSON.stringify({ msg: 'result', ...result })}\n`);
}

/** Resolves after `ms`. */
export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** The installed version of a package (read from node_modules; some packages do not export package.json). */
export function packageVersion(name: string): string {
  const path = new URL(`./node_modules/${name}/package.json`, import.meta.url);
  return (JSON.parse(readFileSync(path, 'utf8')) as { version: string }).version;
}
