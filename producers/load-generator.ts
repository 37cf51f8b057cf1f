/**
 * Load generator: enqueues `--count` charge jobs of which `--duplicate-ratio` reuse an earlier
 * key with the same payload. A share of the duplicates (`--foreign-ratio`) is added the way a
 * foreign producer would — raw BullMQ under its own job id — so the workers' claim, not
 * BullMQ's job-id dedup, has to catch them.
 *
 *   tsx producers/load-generator.ts --count 3000 --duplicate-ratio 0.2 --concurrency 8
 *
 * Progress goes to stderr; the final summary is one JSON line on stdout.
 */
import { randomUUID } from 'node:crypto';
import { parseArgs } from 'node:util';
import { IdempotentProducer, toWireJobData, type EnqueueRequest } from '../src/index.js';
import { loadEnvConfig, queueConnectionFromEnv, runMain } from '../src/process/index.js';

const { values } = parseArgs({
  options: {
    count: { type: 'string', default: '3000' },
    'duplicate-ratio': { type: 'string', default: '0.2' },
    'foreign-ratio': { type: 'string', default: '0.5' },
    concurrency: { type: 'string', default: '8' },
    batch: { type: 'string', default: '50' },
    scope: { type: 'string', default: 'demo' },
    attempts: { type: 'string', default: '5' },
  },
});
const count = positiveInt('count');
const concurrency = positiveInt('concurrency');
const batchSize = positiveInt('batch');
const duplicateRatio = ratio('duplicate-ratio');
const foreignRatio = ratio('foreign-ratio');
const scope = values.scope!;

const config = await runMain(() => loadEnvConfig());
const queues = queueConnectionFromEnv(config);
const producer = new IdempotentProducer({
  queue: config.QUEUE,
  backend: queues.backend,
  connection: queues.connection,
  prefix: queues.prefix,
  defaultJobOptions: { attempts: positiveInt('attempts'), backoff: { type: 'exponential', delay: 200 } },
});

interface Planned {
  request: EnqueueRequest<{ orderId: string; cents: number }>;
  foreign: boolean;
}

// Plan every job up front: a duplicate repeats an earlier key with the identical payload.
const keys: string[] = [];
const plan: Planned[] = [];
for (let i = 0; i < count; i++) {
  const duplicate = keys.length > 0 && Math.random() < duplicateRatio;
  const key = duplicate ? keys[Math.floor(Math.random() * keys.length)]! : `order-${randomUUID()}`;
  if (!duplicate) keys.push(key);
  const cents = 100 + (Number.parseInt(key.slice(-6), 16) % 10_000);
  plan.push({ request: { name: 'charge', scope, key, data: { orderId: key, cents } }, foreign: duplicate && Math.random() < foreignRatio });
}

const startedAt = Date.now();
let enqueued = 0;
let duplicateAdds = 0;
let foreignAdds = 0;
let next = 0;
const progress = setInterval(() => console.error(JSON.stringify({ progress: 'enqueue', enqueued, of: count })), 1000);

async function lane(): Promise<void> {
  while (next < plan.length) {
    const batch = plan.slice(next, next + batchSize);
    next += batch.length;
    const ours = batch.filter((p) => !p.foreign).map((p) => p.request);
    const foreign = batch.filter((p) => p.foreign);
    const results = await producer.enqueueBulk(ours);
    duplicateAdds += results.filter((r) => r.status === 'duplicate').length;
    await Promise.all(
      foreign.map((p) =>
        producer.queue.add(p.request.name, toWireJobData(scope, p.request.key, p.request.data), { jobId: `foreign-${randomUUID()}`, attempts: 5 }),
      ),
    );
    foreignAdds += foreign.length;
    enqueued += batch.length;
  }
}

try {
  await Promise.all(Array.from({ length: concurrency }, lane));
} finally {
  clearInterval(progress);
  await producer.close();
  await queues.close();
}
const durationMs = Date.now() - startedAt;
console.log(
  JSON.stringify({ enqueued, uniqueKeys: keys.length, duplicateEnqueues: count - keys.length, duplicateAdds, foreignAdds, durationMs, perSecond: Math.round((enqueued / durationMs) * 1000) }),
);

function positiveInt(name: keyof typeof values): number {
  const value = Number(values[name]);
  if (!Number.isInteger(value) || value < 1) usage(`--${name} must be a positive integer, got ${values[name]}`);
  return value;
}
function ratio(name: keyof typeof values): number {
  const value = Number(values[name]);
  if (!(value >= 0 && value <= 1)) usage(`--${name} must be between 0 and 1, got ${values[name]}`);
  return value;
}
function usage(message: string): never {
  console.error(message);
  process.exit(2);
}
