/**
 * A chaos worker process: the library's worker runtime (`startWorkerProcess`, configured from
 * the environment like any worker) with the chaos handler and a fault hook that crashes this
 * process at protocol points. Extra environment:
 * - `CHAOS_STEPS`: `true` runs the multi-step handler (`--steps`), with its own crash points;
 * - `CHAOS_DATABASE_ONLY`: `true` runs the database-only handler (`--database-only`);
 * - `CHAOS_DRIZZLE`: `true` writes the effect through Drizzle over node-postgres (`--drizzle`);
 * - `FAULT_POINTS`: crash probabilities, e.g. `after-claim:0.02,before-commit:0.02` (default none);
 * - `FAULT_SEED`: seed of those random crashes (default 1);
 * - `STORE_FAULT_POINTS`: store fault probabilities at the coalescing hand-over, e.g.
 *   `before-hand-over:0.2,after-hand-over:0.2` (default none; seeded by `FAULT_SEED` too).
 * The harness also arms single crashes over IPC: `{ arm: 'before-commit' }`.
 */
import type { Kysely } from 'kysely';
import { loadEnvConfig, startWorkerProcess } from '../../src/process/index.js';
import { chaosHandler, chaosStepsHandler, databaseOnlyChaosHandler, drizzleEffect, type ChaosPayload } from './chaos-handler.js';
import { ArmedFaults, CRASH_POINTS, crasher, crashingFaultHook, parseFaultPoints, parseStoreFaultPoints, storeFaultHook, type CrashPoint } from './fault-injection.js';

const config = loadEnvConfig();
const rates = parseFaultPoints(process.env.FAULT_POINTS);
const armed = new ArmedFaults();
process.on('message', (message: { arm?: string }) => {
  if (CRASH_POINTS.includes(message.arm as CrashPoint)) armed.arm(message.arm as CrashPoint);
});
// The harness is gone (killed without its cleanup): do not linger as an orphan.
process.on('disconnect', () => process.kill(process.pid, 'SIGKILL'));

const crash = crasher(rates, armed, Number(process.env.FAULT_SEED ?? 1));
const crashHook = crashingFaultHook(crash);
const storeHook = storeFaultHook(parseStoreFaultPoints(process.env.STORE_FAULT_POINTS), Number(process.env.FAULT_SEED ?? 1));
let resolveDb!: (db: Kysely<any>) => void;
const db = new Promise<Kysely<any>>((resolve) => (resolveDb = resolve));
const drizzle = process.env.CHAOS_DRIZZLE === 'true' ? drizzleEffect(config.DATABASE_URL, config.SCHEMA, config.PG_POOL_SIZE ?? 10) : undefined;
const worker = await startWorkerProcess<ChaosPayload, unknown>({
  config,
  handler:
    process.env.CHAOS_STEPS === 'true'
      ? chaosStepsHandler(config.SCHEMA, db, crash)
      : process.env.CHAOS_DATABASE_ONLY === 'true'
        ? databaseOnlyChaosHandler(config.SCHEMA)
        : chaosHandler(config.SCHEMA, db, drizzle?.effect, config.FAST_PATH === true),
  // Checked at start, as a user's worker does: on another database than the keys, it takes no job.
  ...(drizzle ? { dataLayers: [drizzle.layer] } : {}),
  faultHook: async (point, context) => {
    await crashHook(point, context);
    await storeHook(point, context);
  },
});
resolveDb(worker.keys.db);
