/**
 * graphile-worker on the benchmark workload (run with Node 22: graphile-worker 0.18 requires
 * it). Dedup: `jobKey`, graphile-worker's own feature (a second add with the same key while the
 * job exists replaces it). Batched job fetching and completion are on, as its performance guide
 * recommends for throughput. Prints one result line.
 */
import { Logger, makeWorkerUtils, run } from 'graphile-worker';
import { PeerEffects, packageVersion, peerSettings, report, sleep } from './peer-support.js';

const { databaseUrl, n, concurrency, schemaPrefix } = peerSettings();
const workerSchema = `${schemaPrefix}_graphile`;
const effectsSchema = `${schemaPrefix}_graphile_fx`;
const version = packageVersion('graphile-worker');
const effects = new PeerEffects(databaseUrl, effectsSchema, concurrency + 2);
const quiet = new Logger(() => () => {});
const localQueueSize = concurrency * 2;
const completeJobBatchDelay = 0;
const utils = await makeWorkerUtils({ connectionString: databaseUrl, schema: workerSchema, logger: quiet });
let runner: Awaited<ReturnType<typeof run>> | undefined;

try {
  await effects.create();
  await utils.migrate();
  for (let start = 0; start < n; start += 1000) {
    const jobs = [];
    for (let i = start; i < Math.min(n, start + 1000); i++) jobs.push({ identifier: 'charge', payload: { key: `k${i}` }, jobKey: `k${i}` });
    await utils.addJobs(jobs);
  }
  // Dedup while queued: the second add with the same jobKey replaces the first job.
  await utils.addJob('charge', { key: 'probe-queued' }, { jobKey: 'probe-queued' });
  await utils.addJob('charge', { key: 'probe-queued' }, { jobKey: 'probe-queued' });
  const total = n + 1;

  const startedAt = performance.now();
  runner = await run({
    connectionString: databaseUrl,
    schema: workerSchema,
    concurrency,
    maxPoolSize: Math.min(concurrency + 2, 10),
    pollInterval: 500,
    noHandleSignals: true,
    logger: quiet,
    preset: { worker: { localQueue: { size: localQueueSize }, completeJobBatchDelay } },
    taskList: {
      charge: async (payload) => {
        await effects.run((payload as { key: string }).key);
      },
    },
  });
  await effects.waitForCount(total, 15 * 60_000);
  const elapsedMs = performance.now() - startedAt;
  const dedupWhileQueued = (await effects.effectsFor('probe-queued')) === 1;

  // Re-enqueue after completion: the job is deleted on success, so its key is free again.
  await utils.addJob('charge', { key: 'probe-again' }, { jobKey: 'probe-again' });
  await effects.waitForCount(total + 1, 60_000);
  await sleep(500); // let the batched completion land
  await utils.addJob('charge', { key: 'probe-again' }, { jobKey: 'probe-again' });
  await effects.waitForCount(total + 2, 10_000).catch(() => {});
  const effectsAfterReEnqueue = await effects.effectsFor('probe-again');

  report({
    peer: 'graphile-worker',
    version,
    n,
    concurrency,
    settings: `jobKey; concurrency ${concurrency}, localQueue.size ${localQueueSize}, completeJobBatchDelay ${completeJobBatchDelay}; effect per job in its own transaction`,
    elapsedMs,
    jobsPerSec: (total / elapsedMs) * 1000,
    effects: effects.count,
    dedupFeature: 'jobKey (replaces a job with the same key while it exists)',
    dedupWhileQueued,
    effectsAfterReEnqueue,
  });
} finally {
  await runner?.stop().catch(() => {});
  await utils.release();
  await effects.dropSchemas(workerSchema, effectsSchema);
}
