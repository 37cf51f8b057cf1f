/**
 * Enqueue one job:
 *   tsx producers/enqueue.ts --key order-42 [--scope acme] [--name charge] [--data '{"orderId":"42","cents":1999}']
 * Queue, Redis and prefix come from the environment (QUEUE, REDIS_URL or REDIS_CLUSTER_NODES, REDIS_PREFIX).
 * Prints the result as JSON; exits 2 on bad input, 1 on failure.
 */
import { parseArgs } from 'node:util';
import { IdempotencyError, IdempotentProducer } from '../src/index.js';
import { loadEnvConfig, queueConnectionFromEnv, runMain } from '../src/process/index.js';

const { values } = parseArgs({
  options: {
    key: { type: 'string' },
    scope: { type: 'string' },
    name: { type: 'string', default: 'charge' },
    data: { type: 'string', default: '{}' },
  },
});

const config = await runMain(() => loadEnvConfig());
const queues = queueConnectionFromEnv(config);
const producer = new IdempotentProducer({ queue: config.QUEUE, backend: queues.backend, connection: queues.connection, prefix: queues.prefix });
try {
  let data: unknown;
  try {
    data = JSON.parse(values.data!);
  } catch (error) {
    throw new IdempotencyError('INVALID_JOB_DATA', `--data is not JSON: ${(error as Error).message}`);
  }
  const result = await producer.enqueue({ name: values.name!, scope: values.scope, key: values.key as string, data });
  console.log(JSON.stringify(result));
} catch (error) {
  console.error(error instanceof Error ? `${error.name}: ${error.message}` : error);
  process.exitCode = error instanceof IdempotencyError ? 2 : 1;
} finally {
  await producer.close();
  await queues.close();
}
