/**
 * Property tests of steps (docs/architecture.md#steps):
 *
 * 1. Model-based: random sequences of claims, takeovers after the lease, releases, failures,
 *    completions, janitor runs and steps (an external step's start and record, a database
 *    step's writes and record) by current and stale claims, on Postgres and on the reference
 *    model (test/support/key-model.ts); after each operation both answered alike and the steps,
 *    keys and effects are the model's.
 * 2. Runs of one handler through `JobSteps` (records sent at once or held back), each cut short at
 *    a random step (a crash left to its lease, or an error that releases the key) until a run
 *    completes: a recorded step never runs again and every later run gets its recorded result,
 *    a database step's writes commit once, an external step runs at most once per claim, and
 *    the completion commits once.
 */
import fc from 'fast-check';
import { sql } from 'kysely';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { IdempotencyKeys, JobSteps, isHeld, type Claim } from '../src/index.js';
import type { KeyModel, ModelConfig } from './support/key-model.js';
import {
  AdvanceCommand,
  ClaimCommand,
  CompleteCommand,
  ExtendCommand,
  JanitorCommand,
  ReleaseOrFailCommand,
  StepCommand,
  STEP_NAMES,
  freshRun,
  handleArbitrary,
  keysFor,
  type RealKeys,
} from './support/key-model-commands.js';
import { createEffectsTable, effectsOf, expireLease, insertEffect } from './support/protocol-fixtures.js';
import { propertyRuns } from './support/property-runs.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const HOUR = 3_600_000;
const config: ModelConfig = { leaseMs: HOUR, retentionMs: 2 * HOUR, maxJobRetentionMs: 3 * HOUR, maxJobTombstoneMs: 5 * HOUR };
let env: TestEnv;

beforeAll(async () => {
  env = await createTestEnv('steps_model');
  await createEffectsTable(env.db, env.schema);
});
afterAll(async () => {
  await env?.teardown();
});

const key = fc.constantFrom('k1', 'k2');
const stepName = fc.constantFrom(...STEP_NAMES);
const step = fc.tuple(handleArbitrary, fc.constantFrom('start' as const, 'record' as const, 'database' as const), stepName, fc.nat({ max: 9 }));
const commands = fc.commands<KeyModel, RealKeys, false>(
  [
    key.map((k) => new ClaimCommand(k, 'fp-1')),
    step.map(([h, a, n, v]) => new StepCommand(h, a, n, v)),
    step.map(([h, a, n, v]) => new StepCommand(h, a, n, v)),
    step.map(([h, a, n, v]) => new StepCommand(h, a, n, v)),
    handleArbitrary.map((h) => new ExtendCommand(h)),
    fc.tuple(handleArbitrary, fc.nat({ max: 9 })).map(([h, v]) => new CompleteCommand(h, v)),
    fc.tuple(handleArbitrary, fc.constantFrom('release' as const, 'fail' as const)).map(([h, a]) => new ReleaseOrFailCommand(h, a)),
    fc.constantFrom(config.leaseMs - 60_000, config.leaseMs, config.leaseMs + 1, config.retentionMs).map((ms) => new AdvanceCommand(ms)),
    fc.constant(new JanitorCommand(0)),
  ],
  { maxCommands: 30, size: 'max' },
);

const modelRuns = propertyRuns('steps model', 30);

it('steps are started and recorded only by the current claim, recorded once, kept across claims and deleted with their key', async () => {
  const keys = keysFor(env.db, env.schema, config);
  await fc.assert(
    fc.asyncProperty(commands, async (sequence) => {
      await fc.asyncModelRun(() => freshRun(env.db, env.schema, keys, config), sequence);
    }),
    modelRuns,
  );
}, 60_000 + modelRuns.numRuns * 2_000);

/** The handler's steps: external, database, external. */
const HANDLER_STEPS = [
  { name: 'reserve', kind: 'external' },
  { name: 'book', kind: 'database' },
  { name: 'notify', kind: 'external' },
] as const;

const plans = fc.array(fc.record({ steps: fc.nat({ max: HANDLER_STEPS.length }), end: fc.constantFrom('crash' as const, 'error-in-step' as const, 'error-after-step' as const), holdRecords: fc.boolean() }), {
  minLength: 1,
  maxLength: 6,
});

const runsRuns = propertyRuns('steps through JobSteps', 25);

/** The key's recorded steps: name → result. */
async function recordedSteps(scope: string, key: string): Promise<Map<string, unknown>> {
  const { rows } = await sql<{ name: string; result: unknown }>`
    select name, result from ${sql.id(env.schema, 'job_steps')} where scope = ${scope} and key = ${key} and recorded_at is not null`.execute(env.db);
  return new Map(rows.map((r) => [r.name, r.result]));
}
let runNumber = 0;

it('through JobSteps, a recorded step never runs again and replays its result; database steps commit once; the completion once', async () => {
  const keys = new IdempotencyKeys({ db: env.db, schema: env.schema, leaseMs: 60_000, groupCommit: false });
  await fc.assert(
    fc.asyncProperty(plans, async (planned) => {
      const scope = 'steps';
      const jobKey = `job-${++runNumber}`;
      /** Every call of a step's function: its name, the claim's fence, what it returned. */
      const calls: Array<{ name: string; fence: number; value: number }> = [];
      let completed = false;
      // The last run always completes: the plan's runs first, then one that goes through.
      for (const plan of [...planned, { steps: HANDLER_STEPS.length, end: 'crash' as const, holdRecords: false }]) {
        const outcome = await keys.claim(scope, jobKey, 'fp');
        expect(isHeld(outcome), `run ${plan.steps}/${plan.end}: ${outcome.kind}`).toBe(true);
        const claim = outcome as Claim;
        const recorded = await recordedSteps(scope, jobKey);
        const steps = new JobSteps(keys, claim, new AbortController().signal, undefined, { holdRecords: plan.holdRecords });
        const failing = plan.steps < HANDLER_STEPS.length ? plan : undefined;
        try {
          for (const [index, described] of HANDLER_STEPS.entries()) {
            if (failing && index === failing.steps) break;
            const value = calls.length * 10 + index;
            const throwInside = failing?.end === 'error-in-step' && index === failing.steps - 1;
            const got =
              described.kind === 'external'
                ? await steps.run(described.name, async () => {
                    calls.push({ name: described.name, fence: claim.fence, value });
                    if (throwInside) throw new Error('the call failed after it went out');
                    return value;
                  })
                : await steps.run(described.name, {
                    transaction: async (tx) => {
                      calls.push({ name: described.name, fence: claim.fence, value });
                      await insertEffect(tx, env.schema, { scope, key: `${jobKey}/${described.name}`, fence: claim.fence, worker: 'step' });
                      if (throwInside) throw new Error('the step failed inside its transaction');
                      return value;
                    },
                  });
            // A step recorded before this run did not run again, and gave back its recorded result.
            if (recorded.has(described.name)) {
              expect(calls.at(-1)?.fence === claim.fence && calls.at(-1)?.name === described.name, `${described.name} ran again after it was recorded`).toBe(false);
              expect(got, `${described.name} in the run of fence ${claim.fence}`).toBe(recorded.get(described.name));
            }
          }
          if (failing?.end === 'error-after-step') throw new Error('the handler failed between steps');
          if (failing) {
            // A crash: the worker is gone, its held record with it; the next run waits out the lease.
            await expireLease(env.db, env.schema, scope, jobKey);
            continue;
          }
          await steps.complete((record) =>
            keys.commitEffect(claim, async (tx) => {
              await insertEffect(tx, env.schema, { scope, key: jobKey, fence: claim.fence, worker: 'completion' });
              return { done: true };
            }, { heldRecord: record }),
          );
          completed = true;
          break;
        } catch (error) {
          if (!(error instanceof Error) || !/failed/.test(error.message)) throw error;
          await steps.flush();
          expect(await keys.release(claim, error)).toBe(true);
        }
      }
      expect(completed).toBe(true);
      // Each step ran at most once per claim, and never after it was recorded.
      for (const { name } of HANDLER_STEPS) {
        const fences = calls.filter((c) => c.name === name).map((c) => c.fence);
        expect(new Set(fences).size, `${name} ran twice under one claim: ${fences.join(', ')}`).toBe(fences.length);
      }
      const { rows } = await sql<{ name: string; fence: string; result: unknown }>`
        select name, fence, result from ${sql.id(env.schema, 'job_steps')} where scope = ${scope} and key = ${jobKey} and recorded_at is not null`.execute(env.db);
      for (const row of rows) {
        const last = calls.filter((c) => c.name === row.name).at(-1)!;
        expect({ fence: last.fence, value: last.value }, `${row.name}: the call that was recorded is the last one`).toEqual({ fence: Number(row.fence), value: row.result });
      }
      expect(rows.map((r) => r.name).sort()).toEqual(HANDLER_STEPS.map((h) => h.name).sort());
      expect(await effectsOf(env.db, env.schema, scope, `${jobKey}/book`)).toHaveLength(1);
      expect(await effectsOf(env.db, env.schema, scope, jobKey)).toHaveLength(1);
    }),
    runsRuns,
  );
}, 60_000 + runsRuns.numRuns * 3_000);
