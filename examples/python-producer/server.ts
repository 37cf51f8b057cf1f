/**
 * What the producers talk to: the HTTP API (`POST /v1/queues/quotes/jobs`) and a worker for
 * its queue, in one process for the example's sake (deployed, they are `npx idempotent-jobs http` and a
 * worker process). The handler prices a quote; its result is what `Prefer: wait` returns.
 */
import { loadHttpEnvConfig, startHttpServerProcess, startWorkerProcess } from 'idempotent-jobs/process';

// DATABASE_URL, REDIS_URL, SCHEMA, REDIS_PREFIX, HTTP_PORT…; the queue is the example's own.
const config = loadHttpEnvConfig({ ...process.env, QUEUE: 'quotes' });
const http = await startHttpServerProcess({ config, handleSignals: false });
const worker = await startWorkerProcess<{ items: { cents: number; quantity: number }[] }, { totalCents: number }>({
  config: { ...config, MIGRATE: false },
  handleSignals: false,
  handler: async (ctx) => ({ totalCents: ctx.data.items.reduce((sum, item) => sum + item.cents * item.quantity, 0) }),
});
console.log(`HTTP API listening on ${http.url}`);

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, async () => {
    await http.stop();
    await worker.stop();
  });
}
