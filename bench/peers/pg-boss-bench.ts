/**
 * pg-boss on the benchmark workload (run with Node 22: pg-boss 12 requires it). Dedup: the
 * queue's `exclusive` policy with a `singletonKey` per job, pg-boss's own feature for "one job
 * per key queued or active". Prints one result line.
 */
import { PgBoss } from 'pg-boss';
import { PeerEffects, packageVersion, peerSettings, report, sleep } from './peer-support.js';

const { databaseUrl, n, concurrency, schemaPrefix } = peerSettings();
const bossSchema = `${schemaPrefix}_pgboss`;
const effectsSchema = `${schemaPrefix}_pgboss_fx`;
const version = packageVersion('pg-boss');
const effects = new PeerEffects(databaseUrl, effectsSchema, concurrency + 2);
const boss = new PgBoss({ connectionString: databaseUrl, schema: bossSchema, max: 4, schedule: false, supervise: false });
boss.on('error', (error) => process.stderr.write(`pg-boss error: ${String(error)}\n`));
const queue = 'charge';
const batchSize = 8;
const localConcurrency = Math.max(1, Math.round(concurrency / batchSize));

try {
  await effects.create();
  await boss.start();
  await boss.createQueue(queue, { policy: 'exclusive' });
  for (let start = 0; start < n; start += 1000) {
    const jobs = [];
    for (let i = start; i < Math.min(n, start + 1000); i++) jobs.push({ data: { key: `k${i}` }, singletonKey: `k${i}` });
    await boss.insert(queue, jobs);
  }
  // Dedup while queued: a second job with a queued key is dropped (send returns null).
  const firstProbe = await boss.send(queue, { key: 'probe-queued' }, { singletonKey: 'probe-queued' });
  const secondProbe = await boss.send(queue, { key: 'probe-queued' }, { singletonKey: 'probe-queued' });
  const dedupWhileQueued = firstProbe !== null && secondProbe === null;
  const total = n + 1;

  const startedAt = performance.now();
  await boss.work<{ key: string }>(
    queue,
    { localConcurrency, batchSize, burstWhenBatchFull: true, pollingIntervalSeconds: 0.5 },
    async (jobs) => {
      await Promise.all(jobs.map((job) => effects.run(job.data.key)));
    },
  );
  await effects.waitForCount(total, 15 * 60_000);
  const elapsedMs = performance.now() - startedAt;

  // Re-enqueue after completion: the first job for the key completes, then the same key again.
  await boss.send(queue, { key: 'probe-again' }, { singletonKey: 'probe-again' });
  await effects.waitForCount(total + 1, 60_000);
  await sleep(500); // let pg-boss mark it completed
  await boss.send(queue, { key: 'probe-again' }, { singletonKey: 'probe-again' });
  await effects.waitForCount(total + 2, 10_000).catch(() => {});
  const effectsAfterReEnqueue = await effects.effectsFor('probe-again');

  report({
    peer: 'pg-boss',
    version,
    n,
    concurrency,
    settings: `policy exclusive + singletonKey; work(localConcurrency ${localConcurrency}, batchSize ${batchSize}, burstWhenBatchFull); effect per job in its own transaction`,
    elapsedMs,
    jobsPerSec: (total / elapsedMs) * 1000,
    effects: effects.count,
    dedupFeature: 'singletonKey on an exclusive-policy queue (one job per key queued or active)',
    dedupWhileQueued,
    effectsAfterReEnqueue,
  });
} finally {
  await boss.stop({ graceful: false }).catch(() => {});
  await effects.dropSchemas(bossSchema, effectsSchema);
}
