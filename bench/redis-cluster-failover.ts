/**
 * The Redis Cluster failover experiment (docs/operations.md, "Redis Cluster"): a worker and a
 * producer under steady load on a private cluster (3 masters with a replica each), then the
 * queue's master is killed (SIGKILL, never restarted) and its replica promoted by the cluster.
 * It counts the acknowledged adds the failover lost, the effects that ran twice (none may),
 * and how the two remedies recover the lost jobs: the producer sending every request again
 * with the same key, and the sweeper re-enqueueing keys whose job vanished mid-processing.
 *
 *   npx tsx bench/redis-cluster-failover.ts [--runs 3] [--lag-ms 0] [--rate 200] [--seconds 8]
 *
 * `--lag-ms N` freezes the replica (SIGSTOP) N ms before the master is killed, and resumes it
 * right after: a replica N ms behind, as under a network hiccup or a busy host. With 0 the
 * replica is as close as asynchronous replication on one machine keeps it.
 *
 * Postgres: a schema of its own on DATABASE_URL (default postgres://postgres@127.0.0.1:5432/postgres),
 * dropped at the end. Redis: the private cluster only (ports 7100-7199, or REDIS_CLUSTER_PORTS).
 */
import { randomBytes } from 'node:crypto';
import { parseArgs } from 'node:util';
import { Queue } from 'bullmq';
import { sql, type Kysely } from 'kysely';
import { pino } from 'pino';
import { IdempotentProducer, createPostgresDb, jobIdFor, migrate, type EnqueueRequest, type JobContext } from '../src/index.js';
import { loadEnvConfig, openRedisConnection, startWorkerProcess } from '../src/process/index.js';
import { RedisCluster } from '../test/support/redis-cluster.js';

const { values } = parseArgs({
  options: {
    runs: { type: 'string', default: '3' },
    'lag-ms': { type: 'string', default: '0' },
    rate: { type: 'string', default: '200' },
    seconds: { type: 'string', default: '8' },
    'node-timeout-ms': { type: 'string', default: '2000' },
  },
});
const runs = Number(values.runs);
const lagMs = Number(values['lag-ms']);
const ratePerSecond = Number(values.rate);
const loadSeconds = Number(values.seconds);
const nodeTimeoutMs = Number(values['node-timeout-ms']);
const databaseUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
const QUEUE = 'payments';
const silent = pino({ level: 'silent' });

interface RunResult {
  readonly acknowledged: number;
  readonly ackedBeforeKill: number;
  /** From the kill to the first add acknowledged by the promoted replica. */
  readonly writesResumedAfterMs: number;
  /** Adds that failed and were retried by the producer loop (refused or timed out during the failover). */
  readonly retriedAdds: number;
  readonly replicaBehindBytes: number;
  /** Acknowledged keys neither completed nor known to BullMQ once the queue settled: their job is gone. */
  readonly lostJobs: number;
  /** Of those, keys claimed before their job vanished (the sweeper's case). */
  readonly lostWhileProcessing: number;
  /** Completed keys whose job ran again after the failover (the replica still had it waiting or active): replays. */
  readonly replays: number;
  readonly duplicateEffects: number;
  /** After the producer re-sent every acknowledged request with the same key, and the sweeper ran. */
  readonly completedAfterRemedies: number;
  readonly duplicateEffectsAfterRemedies: number;
}

async function runOnce(run: number): Promise<RunResult> {
  const cluster = await RedisCluster.start({ masters: 3, nodeTimeoutMs });
  const suffix = randomBytes(3).toString('hex');
  const schema = `failover_${suffix}`;
  const prefix = `{ijfailover-${suffix}}`;
  const db = createPostgresDb({ connectionString: databaseUrl, maxConnections: 4, applicationName: 'idempotent-jobs:failover' }, () => {});
  const redis = openRedisConnection({ url: 'redis://unused.invalid:1', clusterNodes: cluster.nodesSetting });
  const queue = new Queue(QUEUE, { connection: redis.connection, prefix });
  queue.on('error', () => {});
  const producer = new IdempotentProducer({ queue: QUEUE, connection: redis.connection, prefix, schema, defaultJobOptions: { removeOnComplete: false } });
  producer.queue.on('error', () => {});
  try {
    await migrate(db, { schema });
    await sql`create table ${sql.id(schema, 'effects')} (id bigint generated always as identity, scope text, key text, fence bigint)`.execute(db);
    const worker = await startWorkerProcess({
      config: loadEnvConfig({
        DATABASE_URL: databaseUrl,
        REDIS_CLUSTER_NODES: cluster.nodesSetting,
        REDIS_PREFIX: prefix,
        SCHEMA: schema,
        QUEUE,
        CONCURRENCY: '8',
        MIGRATE: 'false',
        STORE_PAYLOAD: 'true',
        JANITOR_ENABLED: 'false',
        STATS_INTERVAL_MS: '0',
        // The sweeper re-enqueues a processing key whose job vanished, 3 s after its lease ended.
        SWEEPER_ENABLED: 'true',
        SWEEPER_INTERVAL_MS: '1000',
        SWEEP_AFTER_MS: '3000',
        LEASE_MS: '2000',
        LOG_LEVEL: 'silent',
      }),
      handler: async (ctx: JobContext<{ n: number }>) => {
        await new Promise((resolve) => setTimeout(resolve, 5));
        return ctx.transaction(async (tx) => {
          await sql`insert into ${sql.id(schema, 'effects')} (scope, key, fence) values (${ctx.scope}, ${ctx.key}, ${ctx.fence})`.execute(tx);
          return { n: ctx.data.n };
        });
      },
      handleSignals: false,
      logger: silent,
    });
    const replays = { count: 0 };
    worker.worker.on('event', (event: { kind: string }) => {
      if (event.kind === 'replayed') replays.count++;
    });

    const shard = await cluster.shardOf(`${prefix}:${QUEUE}:wait`);
    const replica = shard.replicas[0]!;
    const acked: Array<EnqueueRequest<{ n: number }>> = [];
    let retriedAdds = 0;
    let killedAt = 0;
    let firstAckAfterKill = 0;
    let stop = false;
    const inFlight = new Set<Promise<void>>();
    const send = async (n: number) => {
      const request = { name: 'charge', scope: 'shop', key: `k-${n}`, data: { n } };
      for (;;) {
        const attemptAt = Date.now();
        try {
          await producer.enqueue(request);
          // An add sent after the kill: only the promoted replica can have taken it.
          if (killedAt > 0 && attemptAt > killedAt && firstAckAfterKill === 0) firstAckAfterKill = Date.now();
          acked.push(request);
          return;
        } catch {
          retriedAdds++;
          await new Promise((resolve) => setTimeout(resolve, 100));
        }
      }
    };
    const producing = (async () => {
      const started = Date.now();
      for (let n = 0; !stop; n++) {
        const due = started + (n * 1000) / ratePerSecond;
        if (due > Date.now()) await new Promise((resolve) => setTimeout(resolve, due - Date.now()));
        const task = send(n).finally(() => inFlight.delete(task));
        inFlight.add(task);
        if (inFlight.size >= 64) await Promise.race(inFlight);
      }
      await Promise.all(inFlight);
    })();

    await new Promise((resolve) => setTimeout(resolve, (loadSeconds * 1000) / 2));
    if (lagMs > 0) {
      process.kill(cluster.pidOf(replica)!, 'SIGSTOP');
      await new Promise((resolve) => setTimeout(resolve, lagMs));
    }
    const replicaBehindBytes = await replicationLag(cluster, shard.master, replica);
    const ackedBeforeKill = acked.length;
    killedAt = Date.now();
    await cluster.kill(shard.master);
    if (lagMs > 0) process.kill(cluster.pidOf(replica)!, 'SIGCONT');
    await new Promise((resolve) => setTimeout(resolve, (loadSeconds * 1000) / 2));
    // At least as long as the failover took: the load runs on the promoted replica too.
    while (firstAckAfterKill === 0) await new Promise((resolve) => setTimeout(resolve, 200));
    stop = true;
    await producing;

    const settle = async () => {
      let last = '';
      let since = Date.now();
      for (;;) {
        const counts = await queue.getJobCounts('wait', 'active', 'delayed', 'prioritized');
        const completed = await countCompleted(db, schema);
        const state = `${completed}/${JSON.stringify(counts)}`;
        if (state !== last) [last, since] = [state, Date.now()];
        // Nothing queued and nothing changing for a while: waiting longer cannot help. The
        // sweeper needs its SWEEP_AFTER_MS past the lease, so give it that and more.
        if (Object.values(counts).every((c) => c === 0) && Date.now() - since > 8_000) return;
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    };
    await settle();
    const keyStatus = await statusByKey(db, schema);
    let lostJobs = 0;
    let lostWhileProcessing = 0;
    for (const request of acked) {
      if (keyStatus.get(request.key) === 'completed') continue;
      const state = await queue.getJobState(jobIdFor('shop', request.key));
      if (state === 'unknown') {
        lostJobs++;
        if (keyStatus.has(request.key)) lostWhileProcessing++;
      }
    }
    const duplicateEffects = await countDuplicateEffects(db, schema);
    const replaysBeforeRemedy = replays.count;

    // Remedy: the producer sends every acknowledged request again with the same key.
    for (const request of acked) await producer.enqueue(request).catch(() => undefined);
    await settle();
    const completedAfterRemedies = (await countCompleted(db, schema));
    const duplicateEffectsAfterRemedies = await countDuplicateEffects(db, schema);
    await worker.stop();
    const result: RunResult = {
      acknowledged: acked.length,
      ackedBeforeKill,
      writesResumedAfterMs: firstAckAfterKill - killedAt,
      retriedAdds,
      replicaBehindBytes,
      lostJobs,
      lostWhileProcessing,
      replays: replaysBeforeRemedy,
      duplicateEffects,
      completedAfterRemedies,
      duplicateEffectsAfterRemedies,
    };
    console.log(`run ${run}: ${JSON.stringify(result)}`);
    return result;
  } finally {
    await producer.close().catch(() => {});
    await queue.close().catch(() => {});
    await redis.close();
    await sql`drop schema if exists ${sql.id(schema)} cascade`.execute(db).catch(() => {});
    await db.destroy();
    await cluster.stop();
  }
}

/** How many bytes of the master's replication stream the replica had not yet received. */
async function replicationLag(cluster: RedisCluster, master: number, replica: number): Promise<number> {
  const { Redis } = await import('ioredis');
  const client = new Redis({ port: master, host: '127.0.0.1', maxRetriesPerRequest: 1 });
  try {
    const info = await client.info('replication');
    const masterOffset = Number(/master_repl_offset:(\d+)/.exec(info)?.[1]);
    const replicaOffset = Number(new RegExp(`slave\\d+:ip=[^,]+,port=${replica},state=\\w+,offset=(\\d+)`).exec(info)?.[1]);
    return masterOffset - replicaOffset;
  } finally {
    client.disconnect();
  }
}

async function countCompleted(db: Kysely<any>, schema: string): Promise<number> {
  const { rows } = await sql<{ n: number }>`select count(*)::int as n from ${sql.id(schema, 'idempotency_keys')} where status = 'completed'`.execute(db);
  return rows[0]!.n;
}

async function statusByKey(db: Kysely<any>, schema: string): Promise<Map<string, string>> {
  const { rows } = await sql<{ key: string; status: string }>`select key, status from ${sql.id(schema, 'idempotency_keys')}`.execute(db);
  return new Map(rows.map((r) => [r.key, r.status]));
}

async function countDuplicateEffects(db: Kysely<any>, schema: string): Promise<number> {
  const { rows } = await sql<{ n: number }>`
    select count(*)::int as n from (select key from ${sql.id(schema, 'effects')} group by scope, key having count(*) > 1) d`.execute(db);
  return rows[0]!.n;
}

console.log(`failover experiment: ${runs} runs, ${ratePerSecond} adds/s for ~${loadSeconds} s, master killed halfway, replica frozen ${lagMs} ms before; cluster-node-timeout ${nodeTimeoutMs} ms`);
const results: RunResult[] = [];
for (let run = 1; run <= runs; run++) results.push(await runOnce(run));
const sum = (pick: (r: RunResult) => number) => results.reduce((total, r) => total + pick(r), 0);
console.log(
  `\ntotal over ${runs} runs: acknowledged ${sum((r) => r.acknowledged)}, lost jobs ${sum((r) => r.lostJobs)} (${sum((r) => r.lostWhileProcessing)} of them mid-processing), ` +
    `replays ${sum((r) => r.replays)}, duplicate effects ${sum((r) => r.duplicateEffects)}; after the remedies: completed ${sum((r) => r.completedAfterRemedies)} of ` +
    `${sum((r) => r.acknowledged)}, duplicate effects ${sum((r) => r.duplicateEffectsAfterRemedies)}; writes resumed after ` +
    `${results.map((r) => r.writesResumedAfterMs).join(', ')} ms`,
);
