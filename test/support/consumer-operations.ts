/**
 * What the broker consumer process tests share to watch its operations: the environment that
 * turns /metrics, /healthz and fast maintenance on, keys for maintenance to act on (or leave
 * alone), and a scrape of /metrics.
 */
import { sql } from 'kysely';
import { IdempotencyKeys } from '../../src/index.js';
import type { TestEnv } from './test-env.js';

/**
 * METRICS_PORT on a free port, maintenance every 100 ms, and a sweeper that would take any key
 * of the schema whose lease ended (`SWEEPER_QUEUES=*`, `SWEEP_AFTER_MS=0`) if it ran.
 */
export function operationsEnv(env: TestEnv): Record<string, string> {
  return {
    DATABASE_DIRECT_URL: env.databaseDirectUrl,
    METRICS_PORT: '0',
    JANITOR_INTERVAL_MS: '100',
    STATS_INTERVAL_MS: '100',
    SWEEPER_INTERVAL_MS: '100',
    SWEEPER_QUEUES: '*',
    SWEEP_AFTER_MS: '0',
  };
}

/**
 * Two keys in `scope`: `expired`, completed and past its `expires_at` (the janitor deletes it),
 * and `stuck`, processing with a lease that ended an hour ago, recorded under the consumer's
 * `queue` with no BullMQ job behind it (a sweeper would abandon it).
 */
export async function seedMaintenanceKeys(env: TestEnv, scope: string, queue: string): Promise<void> {
  const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
  const expired = await keys.claim(scope, 'expired', keys.fingerprint({}));
  if (expired.kind !== 'claimed') throw new Error(`expected to claim ${scope}/expired, got ${expired.kind}`);
  await keys.runEffect(expired, async () => null);
  const stuck = await keys.claim(scope, 'stuck', keys.fingerprint({}), { queue, jobId: 'lost-message', jobName: 'lost' });
  if (stuck.kind !== 'claimed') throw new Error(`expected to claim ${scope}/stuck, got ${stuck.kind}`);
  const table = sql.id(env.schema, 'idempotency_keys');
  await sql`update ${table} set expires_at = now() - interval '1 minute' where scope = ${scope} and key = 'expired'`.execute(env.db);
  await sql`update ${table} set locked_until = now() - interval '1 hour' where scope = ${scope} and key = 'stuck'`.execute(env.db);
}

/** `GET /metrics` of a process's metrics server: each sample (`name{labels}`) and its value. */
export async function scrapeMetrics(port: number): Promise<Map<string, number>> {
  const response = await fetch(`http://127.0.0.1:${port}/metrics`);
  if (response.status !== 200) throw new Error(`/metrics answered ${response.status}`);
  const values = new Map<string, number>();
  for (const line of (await response.text()).split('\n')) {
    if (line === '' || line.startsWith('#')) continue;
    const at = line.lastIndexOf(' ');
    values.set(line.slice(0, at), Number(line.slice(at + 1)));
  }
  return values;
}
