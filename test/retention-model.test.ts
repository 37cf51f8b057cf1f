/**
 * Model-based property test of retention and tombstones (docs/architecture.md#tombstones-and-retention):
 * random sequences of claims and fast-path runs (some with a retention of their own, some
 * asking for more than the bounds), completions, failures, releases, janitor runs with and
 * without a tombstone window, and the database's time moved by durations around the retention
 * and the tombstone windows (just under, at, just over), run on Postgres and on the reference
 * model (test/support/key-model.ts). After each operation both answered alike, and the keys,
 * their steps, the tombstones and the committed effects are the model's: a finished key replays
 * until the janitor deletes it, the janitor deletes only what expired, each deleted key leaves
 * the tombstone its window asks for, and a live tombstone refuses its key until it ends.
 */
import fc from 'fast-check';
import { afterAll, beforeAll, it } from 'vitest';
import type { KeyModel, ModelConfig, ModelRetention } from './support/key-model.js';
import {
  AdvanceCommand,
  ClaimCommand,
  CompleteCommand,
  ExecuteOnceCommand,
  JanitorCommand,
  ReleaseOrFailCommand,
  StepCommand,
  STEP_NAMES,
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
/** The janitor's own tombstone windows. */
const JANITOR_WINDOW = 4 * HOUR;
let env: TestEnv;

beforeAll(async () => {
  env = await createTestEnv('retention_model');
  await createEffectsTable(env.db, env.schema);
});
afterAll(async () => {
  await env?.teardown();
});

const key = fc.constantFrom('k1', 'k2', 'k3');
const fingerprint = fc.oneof({ weight: 6, arbitrary: fc.constant('fp-1') }, { weight: 1, arbitrary: fc.constant('fp-2') });
/** A run's own retention, sometimes: shorter or longer than the worker's, above the bounds, no tombstone, a tombstone. */
const retention: fc.Arbitrary<ModelRetention | undefined> = fc.option(
  fc.record(
    { resultMs: fc.constantFrom(30 * 60_000, 4 * HOUR), tombstoneMs: fc.constantFrom(0, HOUR, 10 * HOUR) },
    { requiredKeys: [] },
  ),
  { freq: 2 },
);
/** Durations around the retentions and the tombstone windows: just under, at, just over each. */
const aroundTheWindows = fc.constantFrom(
  ...[30 * 60_000, config.retentionMs, config.maxJobRetentionMs, HOUR, JANITOR_WINDOW, config.maxJobTombstoneMs].flatMap((ms) => [ms - 60_000, ms, ms + 1]),
  config.leaseMs,
);

const claim = fc.tuple(key, fingerprint, retention).map(([k, f, r]) => new ClaimCommand(k, f, r));
const complete = fc.tuple(handleArbitrary, fc.nat({ max: 9 })).map(([h, v]) => new CompleteCommand(h, v));
const advance = aroundTheWindows.map((ms) => new AdvanceCommand(ms));
const janitor = fc.constantFrom(0, JANITOR_WINDOW).map((ms) => new JanitorCommand(ms));
// Listed twice: a key's life takes a claim, its end, time passing and a janitor run.
const commands = fc.commands<KeyModel, RealKeys, false>(
  [
    claim,
    claim,
    fc.tuple(key, fingerprint, fc.nat({ max: 9 }), retention).map(([k, f, v, r]) => new ExecuteOnceCommand(k, f, v, r)),
    complete,
    complete,
    fc.tuple(handleArbitrary, fc.constantFrom('release' as const, 'fail' as const)).map(([h, a]) => new ReleaseOrFailCommand(h, a)),
    fc.tuple(handleArbitrary, fc.constantFrom(...STEP_NAMES), fc.nat({ max: 9 })).map(([h, n, v]) => new StepCommand(h, 'database', n, v)),
    advance,
    advance,
    janitor,
    janitor,
  ],
  { maxCommands: 40, size: 'max' },
);

const runs = propertyRuns('retention model', 30);

it('finished keys replay until the janitor deletes them, which leaves the tombstones their windows ask for, refusing their keys until they end', async () => {
  const keys = keysFor(env.db, env.schema, config);
  await fc.assert(
    fc.asyncProperty(commands, async (sequence) => {
      await fc.asyncModelRun(() => freshRun(env.db, env.schema, keys, config), sequence);
    }),
    runs,
  );
}, 60_000 + runs.numRuns * 2_000);
