/**
 * Property test of coalescing keys against a reference model (`support/coalescing-model.ts`),
 * on real Postgres: random sends by producers whose clocks are right, ten minutes ahead or ten
 * minutes behind, or that give no send time, delivered in random order through the real runner, each delivery with at most
 * one store fault or crash at a chosen call (arrival, claim, completion, hand-over, read, before
 * or after Postgres applied it), retention shorter than a run, the janitor at random points
 * (deleting generations' keys, and idle rows once a key has nothing queued), leases running out.
 * Then every job is delivered until none is left.
 *
 * Checked: every answer Postgres gave equals the model's; the runs (generation and payload, in
 * commit order) and the rows equal the model's; no generation commits twice; every arrival ran or
 * was superseded by a payload at least as new that ran; the newest payload sent runs last; no job is left undelivered and no successor pending. The invariants are those of
 * docs/architecture.md ("Invariants", "Coalescing"). `PROPERTY_RUNS` (default 20) sets the number
 * of runs, `FC_SEED` the seed (printed by each run).
 */
import fc from 'fast-check';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { IdempotencyKeys, KeyedJobRunner, identityFromWireContract, resolveWorkerTiming, toWireJobData, type JobIdentity, type RunOutcome } from '../src/index.js';
import { Janitor } from '../src/process/index.js';
import { PostgresKeyStore } from '../src/store/index.js';
import { CoalescingModel } from './support/coalescing-model.js';
import { faultingKeyStore, type CallFault, type CallObserver } from './support/faulting-key-store.js';
import { createEffectsTable } from './support/protocol-fixtures.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const RUNS = Number(process.env.PROPERTY_RUNS ?? 20);
const SCOPE = 'prop';
const MINUTES_10 = 10 * 60_000;
/** Producers: a clock right, ten minutes ahead, ten minutes behind, or no send time at all (RabbitMQ). */
const SKEW = { right: 0, ahead: MINUTES_10, behind: -MINUTES_10, unstamped: undefined } as const;
type Producer = keyof typeof SKEW;

let env: TestEnv;
let store: PostgresKeyStore;
const silent = pino({ level: 'silent' });

beforeAll(async () => {
  env = await createTestEnv('coalescing_property');
  await createEffectsTable(env.db, env.schema);
  store = new PostgresKeyStore(env.db, env.schema);
});
afterAll(async () => {
  await env?.teardown();
});

/** A fault at the `nth` call of `method` within one delivery. */
interface Fault extends CallFault {
  readonly method: 'coalesceArrive' | 'claim' | 'completeAndCommit' | 'coalesceNext' | 'get';
  readonly nth: number;
}

type Command =
  | { readonly kind: 'send'; readonly key: number; readonly producer: Producer; readonly brief: boolean }
  | { readonly kind: 'deliver'; readonly pick: number; readonly fault: Fault | null }
  /** A delivery whose handler waits while other deliveries run: arrivals during a run in flight. */
  | { readonly kind: 'overlap'; readonly pick: number; readonly fault: Fault | null; readonly during: ReadonlyArray<{ readonly pick: number; readonly fault: Fault | null }> }
  | { readonly kind: 'janitor' }
  | { readonly kind: 'idle-janitor' }
  | { readonly kind: 'expire' };

// Mostly the statements of coalescing (arrival, hand-over) and of a generation's run (claim,
// completion); the read that resolves an interrupted commit or replays a finished one, less.
const fault: fc.Arbitrary<Fault | null> = fc.option(
  fc.record({
    method: fc.constantFrom('coalesceArrive', 'coalesceArrive', 'claim', 'completeAndCommit', 'completeAndCommit', 'coalesceNext', 'coalesceNext', 'get'),
    nth: fc.constantFrom(1, 1, 1, 2),
    kind: fc.constantFrom('transient', 'crash'),
    timing: fc.constantFrom('before', 'after'),
  }) as fc.Arbitrary<Fault>,
  { freq: 2 },
);

const command: fc.Arbitrary<Command> = fc.oneof(
  { weight: 5, arbitrary: fc.record({ kind: fc.constant('send' as const), key: fc.integer({ min: 0, max: 1 }), producer: fc.constantFrom<Producer>('right', 'right', 'ahead', 'behind', 'unstamped'), brief: fc.boolean() }) },
  { weight: 5, arbitrary: fc.record({ kind: fc.constant('deliver' as const), pick: fc.nat(), fault }) },
  { weight: 3, arbitrary: fc.record({ kind: fc.constant('overlap' as const), pick: fc.nat(), fault, during: fc.array(fc.record({ pick: fc.nat(), fault }), { minLength: 1, maxLength: 3 }) }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'janitor' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'idle-janitor' as const }) },
  { weight: 1, arbitrary: fc.constant({ kind: 'expire' as const }) },
);

/** A job in the broker's queue. */
interface Job {
  readonly id: string;
  readonly key: string;
  readonly v: number;
  readonly sentAtMs: number | undefined;
  readonly brief: boolean;
  deferrals: number;
}

interface Message {
  readonly id: string;
  readonly data: unknown;
}

let lastStep = 0;
/** Waits for the clock to move 2 ms past the last step: no two steps' times meet (see the model's clamp). */
async function tick(): Promise<void> {
  while (Date.now() < lastStep + 2) await new Promise((resolve) => setTimeout(resolve, 1));
}

const covered = { deliveries: 0, overlaps: 0, faults: 0, crashes: 0, keysDeleted: 0, rowsDeleted: 0, runs: 0, coalesced: 0 };
let run = 0;

it('coalescing keys behave as the reference model under random arrivals, skewed clocks, faults, crashes and janitors', { timeout: 600_000 }, async () => {
  const seed = Number(process.env.FC_SEED ?? Math.floor(Math.random() * 2 ** 31));
  console.log(`coalescing property: fast-check seed ${seed} (reproduce with FC_SEED=${seed}), ${RUNS} runs (PROPERTY_RUNS)`);
  await fc.assert(
    fc.asyncProperty(fc.array(command, { minLength: 4, maxLength: 40 }), async (commands) => {
      await scenario(commands);
    }),
    { numRuns: RUNS, seed },
  );
  console.log(`coalescing property covered: ${JSON.stringify(covered)}`);
});

async function scenario(commands: readonly Command[]): Promise<void> {
  run++;
  const keyNames = [`r${run}-a`, `r${run}-b`];
  const { rows: floorRows } = await sql<{ generation: string }>`select generation from ${sql.id(env.schema, 'coalescing_generation_floor')}`.execute(env.db);
  const model = new CoalescingModel(Number(floorRows[0]!.generation));
  const problems: string[] = [];
  const queue: Job[] = [];
  const sent: Job[] = [];
  /** Per job: its effective send time (clamped to the clock at its first arrival). */
  const arrived = new Map<string, { effective: number }>();
  /** Per key: how many runs had committed when the janitor deleted its row. */
  const deletions = new Map<string, Array<{ sentBefore: number; runsBefore: number }>>();
  const ranWith = new Map<string, unknown>();
  let arrivalNow = 0;

  const observer: CallObserver = {
    before(method) {
      if (method === 'coalesceArrive') arrivalNow = Date.now();
    },
    applied(method, args, answer) {
      const compare = (what: string, real: unknown, expected: unknown) => {
        if (JSON.stringify(real) !== JSON.stringify(expected)) problems.push(`${what}: Postgres answered ${JSON.stringify(real)}, the model ${JSON.stringify(expected)}`);
      };
      switch (method) {
        case 'coalesceArrive': {
          const input = args[0] as { key: string; jobId: string; payloadJson: string; sentAtMs?: number };
          const job = sent.find((j) => j.id === input.jobId)!;
          if (!arrived.has(job.id)) arrived.set(job.id, { effective: Math.min(job.sentAtMs ?? arrivalNow, arrivalNow) });
          if ((answer as { action: string }).action === 'coalesced') covered.coalesced++;
          compare(`arrival of ${input.jobId}`, answer, model.arrive(input.key, input.jobId, JSON.parse(input.payloadJson), input.sentAtMs, arrivalNow));
          break;
        }
        case 'coalesceNext': {
          const input = args[0] as { key: string; jobId: string; generation: number };
          compare(`hand-over of ${input.jobId} after #${input.generation}`, answer ?? null, model.next(input.key, input.jobId, input.generation) ?? null);
          break;
        }
        case 'claim': {
          const input = args[1] as { key: string };
          const kind = (answer as { kind: string }).kind;
          compare(`claim of ${input.key}`, kind === 'claimed' || kind === 'taken-over' ? 'held' : kind, model.claim(input.key));
          break;
        }
        case 'completeAndCommit': {
          const claim = args[1] as { key: string };
          if (answer !== true) break;
          const wrong = model.complete(claim.key, ranWith.get(claim.key), (args[3] as number) < 1_000);
          if (wrong) problems.push(wrong);
          break;
        }
        case 'release': {
          if (answer === true) model.release((args[0] as { key: string }).key);
          break;
        }
        case 'get':
          break;
        default:
          problems.push(`unexpected store call ${method}`);
      }
    },
  };

  /** Delivers `job`; `during`, when given, runs while its first handler waits (or after the run, if no handler ran). */
  const deliver = async (job: Job, planned: Fault | null, during?: () => Promise<void>): Promise<RunOutcome | undefined> => {
    await tick();
    let handlerStarted!: () => void;
    const started = new Promise<'started'>((resolve) => (handlerStarted = () => resolve('started')));
    let openGate!: () => void;
    const gate = new Promise<void>((resolve) => (openGate = resolve));
    let gated = during === undefined;
    const faulty = faultingKeyStore(store, (method, call) => (planned && method === planned.method && call === planned.nth ? planned : undefined), observer);
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema, groupCommit: false }, faulty);
    const runner = new KeyedJobRunner<{ v: number }, unknown, Message>({
      keys,
      timing: resolveWorkerTiming({}, keys.options.leaseMs),
      identityOf: (message) => identityFromWireContract({ id: message.id, name: 'sync', data: message.data }) as JobIdentity<{ v: number }>,
      handler: async (ctx) => {
        if (!gated) {
          gated = true;
          handlerStarted();
          await gate;
        }
        ranWith.set(ctx.key, ctx.data);
        return ctx.transaction(async (tx) => {
          await sql`insert into ${sql.id(env.schema, 'effects')} (scope, key, fence, worker) values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${`v${ctx.data.v}`})`.execute(tx);
          return ctx.data.v;
        });
      },
      logger: silent,
    });
    const data = { ...toWireJobData(SCOPE, job.key, { v: job.v }, job.brief ? { retention: { resultMs: 1 } } : {}), coalesce: true };
    let outcome: RunOutcome | undefined;
    covered.deliveries++;
    const running = runner.run({ message: { id: job.id, data }, id: job.id, label: `Job ${job.id}`, queue: 'q', name: 'sync', lastAttempt: false, deferrals: job.deferrals, ...(job.sentAtMs === undefined ? {} : { sentAtMs: job.sentAtMs }) });
    const first = await Promise.race([started, running.then(() => 'ended' as const, () => 'ended' as const)]);
    if (first === 'started') {
      covered.overlaps++;
      await during!();
      openGate();
    }
    try {
      outcome = await running;
    } catch (error) {
      if (!faulty.crashed()) throw error;
    }
    if (first === 'ended' && during) await during();
    lastStep = Date.now();
    const crashed = faulty.crashed();
    if (planned && (faulty.calls().get(planned.method) ?? 0) >= planned.nth) covered[crashed ? 'crashes' : 'faults']++;
    const acknowledged = !crashed && outcome !== undefined && ['completed', 'replayed', 'replayed-failure'].includes(outcome.kind);
    if (!crashed && outcome && !acknowledged && !['store-unavailable', 'deferred'].includes(outcome.kind)) problems.push(`job ${job.id} came to ${outcome.kind}`);
    if (acknowledged) queue.splice(queue.indexOf(job), 1);
    else job.deferrals++;
    return crashed ? undefined : outcome;
  };

  const expireLeases = async () => {
    await sql`update ${sql.id(env.schema, 'idempotency_keys')} set locked_until = now() - interval '1 second'
               where scope = ${SCOPE} and status = 'processing'`.execute(env.db);
    model.expireLeases();
  };

  let n = 0;
  for (const step of commands) {
    await tick();
    switch (step.kind) {
      case 'send': {
        n++;
        const key = keyNames[step.key]!;
        const skew = SKEW[step.producer];
        const job: Job = { id: `${key}-j${n}`, key, v: n, sentAtMs: skew === undefined ? undefined : Date.now() + skew, brief: step.brief, deferrals: 0 };
        queue.push(job);
        sent.push(job);
        break;
      }
      case 'deliver':
        if (queue.length > 0) await deliver(queue[step.pick % queue.length]!, step.fault);
        break;
      case 'overlap': {
        if (queue.length === 0) break;
        const first = queue[step.pick % queue.length]!;
        await deliver(first, step.fault, async () => {
          for (const other of step.during) {
            const others = queue.filter((job) => job !== first);
            if (others.length > 0) await deliver(others[other.pick % others.length]!, other.fault);
          }
        });
        break;
      }
      case 'janitor': {
        const report = await new Janitor({ db: env.db, schema: env.schema, logger: silent }).runOnce();
        covered.keysDeleted += report.keysDeleted;
        model.deleteBriefKeys();
        break;
      }
      case 'idle-janitor': {
        // Keys with nothing queued, idle (as if) two hours, past a retention of one: the bound
        // the janitor keeps for rows is respected (nothing of theirs is held back).
        const idle = keyNames.filter((key) => !queue.some((job) => job.key === key));
        if (idle.length === 0) break;
        await sql`update ${sql.id(env.schema, 'coalescing_keys')} set assigned_at = assigned_at - interval '2 hours'
                   where scope = ${SCOPE} and key in (${sql.join(idle)})`.execute(env.db);
        const report = await new Janitor({ db: env.db, schema: env.schema, retentionMs: 3_600_000, logger: silent }).runOnce();
        model.deleteBriefKeys();
        const deleted = model.deleteIdleRows(idle);
        if (report.coalescingKeysDeleted !== deleted.length) problems.push(`the janitor deleted ${report.coalescingKeysDeleted} rows, the model ${deleted.length}`);
        covered.rowsDeleted += report.coalescingKeysDeleted;
        for (const key of deleted) deletions.set(key, [...(deletions.get(key) ?? []), { sentBefore: n, runsBefore: model.runs.length }]);
        break;
      }
      case 'expire':
        await expireLeases();
        break;
    }
    lastStep = Date.now();
  }
  // The broker delivers every job left until none is: no faults now, leases run out when a job waits on one.
  for (let round = 0; queue.length > 0; round++) {
    if (round === 300) {
      problems.push(`jobs never acknowledged: ${queue.map((job) => job.id).join(', ')}`);
      break;
    }
    const outcome = await deliver(queue[0]!, null);
    if (outcome?.kind === 'deferred' || outcome?.kind === 'store-unavailable') await expireLeases();
  }
  covered.runs += model.runs.length;
  expect(problems).toEqual([]);

  // The runs and the rows are the model's.
  const { rows: effects } = await sql<{ key: string; worker: string }>`
    select key, worker from ${sql.id(env.schema, 'effects')} where scope = ${SCOPE} and key like ${`r${run}-%`} order by id`.execute(env.db);
  expect(effects.map((e) => [e.key, e.worker])).toEqual(model.runs.map((r) => [r.key, `v${(r.payload as { v: number }).v}`]));
  const { rows } = await sql<{ key: string; generation: string; running_job: string | null; pending_payload: unknown; newest_job: string | null }>`
    select key, generation, running_job, pending_payload, newest_job from ${sql.id(env.schema, 'coalescing_keys')}
     where scope = ${SCOPE} and key in (${sql.join(keyNames)}) order by key`.execute(env.db);
  expect(rows.map((r) => [r.key, Number(r.generation), r.running_job, r.pending_payload, r.newest_job])).toEqual(
    keyNames.filter((key) => model.rows.has(key)).map((key) => {
      const row = model.rows.get(key)!;
      return [key, row.generation, row.runningJob, row.pending, row.newestJob];
    }),
  );
  // Nothing left pending, no generation twice.
  for (const row of model.rows.values()) expect(row.pending).toBeNull();
  expect(new Set(effects.map((e) => e.key)).size).toBe(effects.length);

  // Within an epoch of a key (a deleted row starts one; the jobs sent before the deletion were
  // all delivered before it, the janitor's bound): the newest payload sent (by its send time,
  // clamped to its first arrival) runs last, and every other one ran or was superseded by a
  // payload at least as new that ran.
  const jobOf = (payload: unknown) => sent.find((job) => job.v === (payload as { v: number }).v)!;
  const effective = (job: Job) => arrived.get(job.id)!.effective;
  for (const job of sent) expect(arrived.has(job.id), `job ${job.id} never arrived`).toBe(true);
  for (const key of keyNames) {
    const bounds = [...(deletions.get(key) ?? []), { sentBefore: n, runsBefore: model.runs.length }];
    let from = { sent: 0, runs: 0 };
    for (const bound of bounds) {
      const jobs = sent.filter((job) => job.key === key && job.v > from.sent && job.v <= bound.sentBefore);
      const ran = model.runs.slice(from.runs, bound.runsBefore).filter((r) => r.key.startsWith(`${key}#`)).map((r) => jobOf(r.payload));
      if (jobs.length > 0) {
        const newest = jobs.reduce((a, b) => (effective(b) > effective(a) ? b : a));
        expect(ran.at(-1)?.id ?? 'nothing', `the newest payload of ${key} did not run last`).toBe(newest.id);
        for (const job of jobs) expect(ran.some((other) => other === job || effective(other) >= effective(job)), `job ${job.id} lost`).toBe(true);
      }
      from = { sent: bound.sentBefore, runs: bound.runsBefore };
    }
  }
}
