/**
 * A chaos consumer process for `npm run chaos -- --broker nats`: the library's NATS consumer
 * process (`startNatsConsumerProcess`) with the chaos handler and a fault hook that crashes this
 * process at protocol points. Environment: the worker's (`DATABASE_URL`, `SCHEMA`, `LEASE_MS`,
 * `CONCURRENCY`, …), `NATS_URL`, `NATS_STREAM`, `NATS_CONSUMER`, `FAULT_POINTS`, `FAULT_SEED`.
 * The harness arms single crashes over IPC: `{ arm: 'before-commit' }`.
 */
import type { Kysely } from 'kysely';
import { loadEnvConfig } from '../../src/process/index.js';
import { startNatsConsumerProcess, type NatsJobHandler } from '../../src/nats/index.js';
import { chaosHandler, type ChaosPayload } from './chaos-handler.js';
import { ArmedFaults, CRASH_POINTS, crasher, crashingFaultHook, parseFaultPoints, type CrashPoint } from './fault-injection.js';

const config = loadEnvConfig();
const armed = new ArmedFaults();
process.on('message', (message: { arm?: string }) => {
  if (CRASH_POINTS.includes(message.arm as CrashPoint)) armed.arm(message.arm as CrashPoint);
});
process.on('disconnect', () => process.kill(process.pid, 'SIGKILL'));

const crash = crasher(parseFaultPoints(process.env.FAULT_POINTS), armed, Number(process.env.FAULT_SEED ?? 1));
let resolveDb!: (db: Kysely<any>) => void;
const db = new Promise<Kysely<any>>((resolve) => (resolveDb = resolve));
// The chaos handler reads only what every broker's ctx has (data, key, scope, fence, signal, transaction).
const handler = chaosHandler(config.SCHEMA, db) as unknown as NatsJobHandler<ChaosPayload>;
const consumer = await startNatsConsumerProcess<ChaosPayload, unknown>({
  config,
  handler,
  servers: process.env.NATS_URL,
  stream: process.env.NATS_STREAM!,
  consumer: process.env.NATS_CONSUMER!,
  faultHook: crashingFaultHook(crash),
});
resolveDb(consumer.keys.db);
process.send?.({ ready: true });
