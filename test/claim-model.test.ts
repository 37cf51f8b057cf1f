/**
 * Model-based property test of claim and lease (docs/architecture.md#claim-and-lease): random
 * sequences of claims, heartbeats, completions, releases, failures, fast-path runs, replays and
 * takeovers after the lease, with the database's time moved by durations around the lease (just
 * under, at, just over) and the worker's clock skewed by hours, run on Postgres and on the
 * reference model (test/support/key-model.ts); after each operation both answered alike and the
 * keys table, the committed effects and the handed-out claims are the model's. The worker's
 * sessions run in an odd time zone (+05:45): leases are timestamps, never local times.
 */
import fc from 'fast-check';
import { afterAll, beforeAll, it, vi } from 'vitest';
import { createPostgresDb } from '../src/index.js';
import type { KeyModel, ModelConfig } from './support/key-model.js';
import {
  AdvanceCommand,
  ClaimCommand,
  CompleteCommand,
  ExecuteOnceCommand,
  ExtendCommand,
  ReleaseOrFailCommand,
  SkewWorkerClockCommand,
  freshRun,
  handleArbitrary,
  keysFor,
  type RealKeys,
} from './support/key-model-commands.js';
import { createEffectsTable } from './support/protocol-fixtures.js';
import { propertyRuns } from './support/property-runs.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const HOUR = 3_600_000;
const config: ModelConfig = { leaseMs: HOUR, retentionMs: 2 * HOUR, maxJobRetentionMs: 3 * HOUR, maxJobTombstoneMs: 5 * HOUR };
let env: TestEnv;
let db: ReturnType<typeof createPostgresDb>;

beforeAll(async () => {
  env = await createTestEnv('claim_model');
  await createEffectsTable(env.db, env.schema);
  const url = new URL(env.databaseUrl);
  url.searchParams.set('options', '-c TimeZone=Asia/Kathmandu');
  db = createPostgresDb({ connectionString: url.toString(), maxConnections: 4, preparedStatements: env.preparedStatements }, () => {});
  // Only Date is faked, and it keeps moving: the skew command sets the worker's wall clock.
  vi.useFakeTimers({ toFake: ['Date'], shouldAdvanceTime: true });
});
afterAll(async () => {
  vi.useRealTimers();
  await db?.destroy();
  await env?.teardown();
});

const KEYS = ['k1', 'k2'];
const key = fc.constantFrom(...KEYS);
const fingerprint = fc.oneof({ weight: 6, arbitrary: fc.constant('fp-1') }, { weight: 1, arbitrary: fc.constant('fp-2') });
/** Durations around the lease: just under, at, just over, and a little. */
const aroundTheLease = fc.constantFrom(config.leaseMs - 60_000, config.leaseMs, config.leaseMs + 1, 1_000, 30_000);

const commands = fc.commands<KeyModel, RealKeys, false>(
  [
    fc.tuple(key, fingerprint).map(([k, f]) => new ClaimCommand(k, f)),
    fc.tuple(key, fingerprint, fc.nat({ max: 9 })).map(([k, f, v]) => new ExecuteOnceCommand(k, f, v)),
    handleArbitrary.map((h) => new ExtendCommand(h)),
    fc.tuple(handleArbitrary, fc.nat({ max: 9 })).map(([h, v]) => new CompleteCommand(h, v)),
    fc.tuple(handleArbitrary, fc.constantFrom('release' as const, 'fail' as const)).map(([h, a]) => new ReleaseOrFailCommand(h, a)),
    aroundTheLease.map((ms) => new AdvanceCommand(ms)),
    fc.constantFrom(-2 * HOUR, -1, 0, 1, 90 * 60_000).map((ms) => new SkewWorkerClockCommand(ms)),
  ],
  { maxCommands: 25, size: 'max' },
);

const runs = propertyRuns('claim model', 30);

it('claims, heartbeats, completions, releases, failures, the fast path and takeovers answer as the model says, on any clock', async () => {
  const keys = keysFor(db, env.schema, config);
  await fc.assert(
    fc.asyncProperty(commands, async (sequence) => {
      vi.setSystemTime(performance.timeOrigin + performance.now());
      await fc.asyncModelRun(() => freshRun(env.db, env.schema, keys, config), sequence);
    }),
    runs,
  );
}, 60_000 + runs.numRuns * 2_000);
