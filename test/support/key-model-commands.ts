/**
 * The real side of the model-based property tests: each command runs one operation of the claim
 * protocol on Postgres (through `IdempotencyKeys` and the `Janitor`), runs it on the reference
 * model (./key-model.ts), and checks that both answered alike and that the whole keys table,
 * its steps, its tombstones and the committed effects equal the model's afterwards. The test
 * files pick the commands of their feature (`fc.commands`) and run them with `fc.asyncModelRun`.
 */
import { createHash } from 'node:crypto';
import fc from 'fast-check';
import { sql, type Kysely } from 'kysely';
import { pino } from 'pino';
import { expect, vi } from 'vitest';
import { IdempotencyKeys, LeaseLostError, isHeld, type Claim, type ClaimOutcome } from '../../src/index.js';
import { Janitor } from '../../src/process/index.js';
import { KeyModel, type ModelClaimAnswer, type ModelConfig, type ModelRetention } from './key-model.js';

/** Where the real side runs: a schema of the test file's, with an `effects` table (./protocol-fixtures.ts). */
export interface RealKeys {
  readonly db: Kysely<any>;
  readonly schema: string;
  readonly keys: IdempotencyKeys;
  readonly scope: string;
  /** The claims Postgres handed out, by the model's handle number. */
  readonly handles: Claim[];
  /** Owner token → the model's claim number. */
  readonly owners: Map<string, number>;
}

export type ModelCommand = fc.AsyncCommand<KeyModel, RealKeys>;

/** The keys configuration both sides run with, and an `IdempotencyKeys` on `db` with it. */
export function keysFor(db: Kysely<any>, schema: string, config: ModelConfig): IdempotencyKeys {
  return new IdempotencyKeys({ db, schema, groupCommit: false, ...config });
}

/** Empties the schema's tables for a fresh run and returns both sides. */
export async function freshRun(db: Kysely<any>, schema: string, keys: IdempotencyKeys, config: ModelConfig): Promise<{ model: KeyModel; real: RealKeys }> {
  await sql`truncate ${sql.id(schema, 'idempotency_keys')}, ${sql.id(schema, 'key_tombstones')}, ${sql.id(schema, 'effects')} cascade`.execute(db);
  return { model: new KeyModel(config), real: { db, schema, keys, scope: 'model', handles: [], owners: new Map() } };
}

const HOLDS_A_HANDLE = (model: KeyModel) => model.handles.length > 0;

/** The handle a command's `h` names: counted back from the newest, which is the likeliest to hold its key. */
const handleIndex = (model: KeyModel, h: number) => model.handles.length - 1 - (h % model.handles.length);

/** Handle numbers for commands, the newest handles most often. */
export const handleArbitrary: fc.Arbitrary<number> = fc.oneof({ weight: 4, arbitrary: fc.constant(0) }, { weight: 3, arbitrary: fc.nat({ max: 3 }) }, { weight: 1, arbitrary: fc.nat({ max: 20 }) });

/** A leased claim of `key` with fingerprint `fingerprint` and, perhaps, a retention of the run's own. */
export class ClaimCommand implements ModelCommand {
  constructor(
    readonly key: string,
    readonly fingerprint: string,
    readonly retention?: ModelRetention,
  ) {}
  check = () => true;
  async run(model: KeyModel, real: RealKeys): Promise<void> {
    const expected = model.claim(this.key, this.fingerprint, this.retention);
    const actual = await real.keys.claim(real.scope, this.key, this.fingerprint, this.retention ? { retention: this.retention } : {});
    expectSameAnswer(actual, expected, this.toString());
    if (isHeld(actual)) remember(real, actual);
    await expectSameState(model, real, this.toString());
  }
  toString = () => `claim(${this.key}, ${this.fingerprint}${this.retention ? `, ${JSON.stringify(this.retention)}` : ''})`;
}

/** The fast path: `executeOnce`, whose effect is one row of `effects`. */
export class ExecuteOnceCommand implements ModelCommand {
  constructor(
    readonly key: string,
    readonly fingerprint: string,
    readonly value: number,
    readonly retention?: ModelRetention,
  ) {}
  check = () => true;
  async run(model: KeyModel, real: RealKeys): Promise<void> {
    const expected = model.executeOnce(this.key, this.fingerprint, { n: this.value }, this.retention);
    const actual = await real.keys.executeOnce(
      real.scope,
      this.key,
      this.fingerprint,
      async (tx, claim) => {
        await insertEffect(tx, real, claim.key, claim.fence, 'effect');
        return { n: this.value };
      },
      this.retention ? { retention: this.retention } : {},
    );
    if (actual.kind === 'executed') {
      expect({ kind: actual.kind, fence: actual.claim.fence }, this.toString()).toEqual(expected);
      remember(real, actual.claim);
    } else {
      expectSameAnswer(actual, expected as ModelClaimAnswer, this.toString());
    }
    await expectSameState(model, real, this.toString());
  }
  toString = () => `executeOnce(${this.key}, ${this.fingerprint}, ${this.value}${this.retention ? `, ${JSON.stringify(this.retention)}` : ''})`;
}

/** A heartbeat of handle `h` (modulo the handles held). */
export class ExtendCommand implements ModelCommand {
  constructor(readonly h: number) {}
  check = HOLDS_A_HANDLE;
  async run(model: KeyModel, real: RealKeys): Promise<void> {
    const i = handleIndex(model, this.h);
    const expected = model.extend(model.handles[i]!);
    const answer = await real.keys.extend(real.handles[i]!);
    expect(answer instanceof Date ? 'extended' : answer === 'completed' ? 'completed' : 'lost', `${this} of handle ${i}`).toBe(expected);
    await expectSameState(model, real, this.toString());
  }
  toString = () => `extend(#${this.h})`;
}

/** The effect and the fenced completion of handle `h`, storing `{ n: value }`. */
export class CompleteCommand implements ModelCommand {
  constructor(
    readonly h: number,
    readonly value: number,
  ) {}
  check = HOLDS_A_HANDLE;
  async run(model: KeyModel, real: RealKeys): Promise<void> {
    const i = handleIndex(model, this.h);
    const expected = model.complete(model.handles[i]!, { n: this.value });
    const claim = real.handles[i]!;
    const actual = await real.keys
      .runEffect(claim, async (tx) => {
        await insertEffect(tx, real, claim.key, claim.fence, 'effect');
        return { n: this.value };
      })
      .then(
        () => 'completed',
        (error: unknown) => {
          if (error instanceof LeaseLostError) return 'lease-lost';
          throw error;
        },
      );
    expect(actual, `${this} of handle ${i}`).toBe(expected);
    await expectSameState(model, real, this.toString());
  }
  toString = () => `complete(#${this.h}, ${this.value})`;
}

/** A release (retryable failure) or a failure for good of handle `h`. */
export class ReleaseOrFailCommand implements ModelCommand {
  constructor(
    readonly h: number,
    readonly action: 'release' | 'fail',
  ) {}
  check = HOLDS_A_HANDLE;
  async run(model: KeyModel, real: RealKeys): Promise<void> {
    const i = handleIndex(model, this.h);
    const message = `${this.action} by #${i}`;
    const expected = this.action === 'release' ? model.release(model.handles[i]!, message) : model.fail(model.handles[i]!, message);
    const actual = await real.keys[this.action](real.handles[i]!, new Error(message));
    expect(actual, `${this} of handle ${i}`).toBe(expected);
    await expectSameState(model, real, this.toString());
  }
  toString = () => `${this.action}(#${this.h})`;
}

/** Time passes for the database: every timestamp of the schema moves `ms` into the past. */
export class AdvanceCommand implements ModelCommand {
  constructor(readonly ms: number) {}
  check = () => true;
  async run(model: KeyModel, real: RealKeys): Promise<void> {
    await shiftTimestamps(real.db, real.schema, this.ms);
    model.advance(this.ms);
    await expectSameState(model, real, this.toString());
  }
  toString = () => `advance(${this.ms} ms)`;
}

/** The worker's clock jumps `ms` away from the database's: no answer may change (leases are `now()`'s). */
export class SkewWorkerClockCommand implements ModelCommand {
  constructor(readonly ms: number) {}
  check = () => true;
  async run(model: KeyModel, real: RealKeys): Promise<void> {
    vi.setSystemTime(performance.timeOrigin + performance.now() + this.ms);
    await expectSameState(model, real, this.toString());
  }
  toString = () => `skew worker clock(${this.ms} ms)`;
}

/** A janitor run with tombstone window `tombstoneMs`. */
export class JanitorCommand implements ModelCommand {
  constructor(readonly tombstoneMs: number) {}
  check = () => true;
  async run(model: KeyModel, real: RealKeys): Promise<void> {
    const expected = model.janitor(this.tombstoneMs);
    const janitor = new Janitor({ db: real.db, schema: real.schema, tombstoneMs: this.tombstoneMs, logger: pino({ level: 'silent' }) });
    const { keysDeleted, tombstonesDeleted } = await janitor.runOnce();
    expect({ keysDeleted, tombstonesDeleted }, this.toString()).toEqual(expected);
    await expectSameState(model, real, this.toString());
  }
  toString = () => `janitor(tombstoneMs ${this.tombstoneMs})`;
}

/** The step names the step commands use, at their positions. */
export const STEP_NAMES = ['a', 'b', 'c'] as const;
const positionOf = (name: string) => STEP_NAMES.indexOf(name as (typeof STEP_NAMES)[number]) + 1;

/** An external step's start, an external step's record, or a database step (its writes and record) by handle `h`. */
export class StepCommand implements ModelCommand {
  constructor(
    readonly h: number,
    readonly action: 'start' | 'record' | 'database',
    readonly name: string,
    readonly value: number,
  ) {}
  check = HOLDS_A_HANDLE;
  async run(model: KeyModel, real: RealKeys): Promise<void> {
    const i = handleIndex(model, this.h);
    const handle = model.handles[i]!;
    const claim = real.handles[i]!;
    const place = { name: this.name, position: positionOf(this.name) };
    const leaseLost = (error: unknown) => {
      if (error instanceof LeaseLostError) return 'lease-lost' as const;
      throw error;
    };
    if (this.action === 'start') {
      const expected = model.startStep(handle, place.name, place.position);
      const actual = await real.keys.startStep(claim, place).catch(leaseLost);
      expect(actual, `${this} of handle ${i}`).toBe(expected);
    } else {
      const database = this.action === 'database';
      const expected = model.recordStep(handle, place.name, place.position, { v: this.value }, database);
      const actual = await (database
        ? real.keys.runDatabaseStep(claim, place, async (tx) => {
            await insertEffect(tx, real, claim.key, claim.fence, `step:${place.name}`);
            return { v: this.value };
          })
        : real.keys.recordStep(claim, place, { v: this.value })
      ).then((stored) => {
        expect(stored).toEqual({ v: this.value });
        return 'recorded' as const;
      }, leaseLost);
      expect(actual, `${this} of handle ${i}`).toBe(expected);
    }
    await expectSameState(model, real, this.toString());
  }
  toString = () => `${this.action} step ${this.name}(#${this.h}, ${this.value})`;
}

function remember(real: RealKeys, claim: Claim): void {
  real.owners.set(claim.owner, real.handles.length + 1);
  real.handles.push(claim);
}

async function insertEffect(tx: Kysely<any>, real: RealKeys, key: string, fence: number, worker: string): Promise<void> {
  await sql`insert into ${sql.id(real.schema, 'effects')} (scope, key, fence, worker) values (${real.scope}, ${key}, ${fence}, ${worker})`.execute(tx);
}

/** Moves every timestamp of the schema's keys and tombstones `ms` into the past: `ms` of the database's time passed. */
export async function shiftTimestamps(db: Kysely<any>, schema: string, ms: number): Promise<void> {
  const by = sql`${ms}::bigint * interval '1 millisecond'`;
  await sql`update ${sql.id(schema, 'idempotency_keys')}
               set locked_until = locked_until - ${by}, completed_at = completed_at - ${by}, expires_at = expires_at - ${by},
                   updated_at = updated_at - ${by}, created_at = created_at - ${by}`.execute(db);
  await sql`update ${sql.id(schema, 'key_tombstones')} set finished_at = finished_at - ${by}, expires_at = expires_at - ${by}`.execute(db);
}

function expectSameAnswer(actual: ClaimOutcome, expected: ModelClaimAnswer, what: string): void {
  const seen = (() => {
    switch (actual.kind) {
      case 'claimed':
      case 'taken-over':
        return { kind: actual.kind, fence: actual.fence, attempts: actual.attempts };
      case 'completed':
        return { kind: actual.kind, result: actual.result, expired: actual.resultExpired !== undefined };
      case 'failed':
        return { kind: actual.kind, errorMessage: actual.resultExpired ? null : (actual.error as { message?: string }).message, expired: actual.resultExpired !== undefined };
      case 'in-progress':
        return { kind: actual.kind, retryAfterMs: expected.kind === 'in-progress' && Math.abs(actual.retryAfterMs - expected.retryAfterMs) <= TOLERANCE_MS ? expected.retryAfterMs : actual.retryAfterMs };
      case 'key-reused':
        return { kind: actual.kind };
    }
  })();
  expect(seen, what).toEqual(expected);
}

/** How far a duration read from Postgres may be from the model's: the time between the two reads. */
const TOLERANCE_MS = 2_000;

/** `actual`, or `expected` when the two are within {@link TOLERANCE_MS}. */
const near = (actual: number | null, expected: number | null) => (actual !== null && expected !== null && Math.abs(actual - expected) <= TOLERANCE_MS ? expected : actual);

const hex = (text: string) => createHash('sha256').update(text, 'utf8').digest('hex');

/** Checks that the keys, steps, tombstones and effects in Postgres are the model's. */
export async function expectSameState(model: KeyModel, real: RealKeys, after: string): Promise<void> {
  const { db, schema, scope } = real;
  const ms = (column: string) => sql.raw(`(extract(epoch from (${column} - now())) * 1000)::float8`);
  const [keys, steps, tombstones, effects, sessions] = await Promise.all([
    sql<any>`select key, fingerprint, status, owner::text as owner, fence::int as fence, attempts, result, error->>'message' as error_message,
                    tombstone_ms::float8 as tombstone_ms, ${ms('locked_until')} as lease_left, ${ms('expires_at')} as expires_in,
                    case when status = 'processing' then null else ${ms('completed_at')} end as finished
               from ${sql.id(schema, 'idempotency_keys')} where scope = ${scope} order by key`.execute(db),
    sql<any>`select key, name, position, fence::int as fence, starts, recorded_at is not null as recorded, result
               from ${sql.id(schema, 'job_steps')} where scope = ${scope} order by key, name`.execute(db),
    sql<any>`select encode(key_hash, 'hex') as key_hash, encode(fingerprint_hash, 'hex') as fingerprint_hash, failed,
                    ${ms('finished_at')} as finished, ${ms('expires_at')} as expires_in
               from ${sql.id(schema, 'key_tombstones')} where scope = ${scope} order by 1`.execute(db),
    sql<any>`select key, worker from ${sql.id(schema, 'effects')} where scope = ${scope} order by id`.execute(db),
    // What the protocol's functions set for themselves (`set_config(…, true)`) ends with their statement.
    Promise.all(
      [1, 2, 3].map(() =>
        sql<any>`select array_agg(name order by name) filter (where setting is distinct from reset_val) as changed,
                        current_setting('transaction_isolation') as isolation
                   from pg_settings where name in ('lock_timeout', 'synchronous_commit', 'statement_timeout')`.execute(db),
      ),
    ),
  ]);
  for (const session of sessions) {
    expect(session.rows[0], `a session's settings after ${after}`).toEqual({ changed: null, isolation: 'read committed' });
  }
  const now = model.now();
  const modelKeys = [...model.keys.entries()].sort(([a], [b]) => (a < b ? -1 : 1));
  const ownerOf = (token: string | null) => (token === null ? null : (real.owners.get(token) ?? `unknown ${token}`));
  expect(
    keys.rows.map((r: any) => {
      const expected = model.keys.get(r.key);
      return {
        key: r.key,
        fingerprint: r.fingerprint,
        status: r.status,
        owner: ownerOf(r.owner),
        fence: r.fence,
        attempts: r.attempts,
        result: r.result,
        errorMessage: r.error_message,
        tombstoneMs: r.tombstone_ms,
        leaseLeft: near(r.lease_left, expected?.lockedUntil == null ? null : expected.lockedUntil - now),
        expiresIn: near(r.expires_in, expected?.expiresAt == null ? null : expected.expiresAt - now),
        finished: near(r.finished, expected?.finishedAt == null ? null : expected.finishedAt - now),
      };
    }),
    `the keys after ${after}`,
  ).toEqual(
    modelKeys.map(([key, k]) => ({
      key,
      fingerprint: k.fingerprint,
      status: k.status,
      owner: k.owner,
      fence: k.fence,
      attempts: k.attempts,
      result: k.status === 'completed' ? k.result : null,
      errorMessage: k.errorMessage,
      tombstoneMs: k.tombstoneMs,
      leaseLeft: k.lockedUntil === null ? null : k.lockedUntil - now,
      expiresIn: k.expiresAt === null ? null : k.expiresAt - now,
      finished: k.finishedAt === null ? null : k.finishedAt - now,
    })),
  );
  expect(steps.rows, `the steps after ${after}`).toEqual(
    modelKeys.flatMap(([key, k]) =>
      [...k.steps.entries()]
        .sort(([a], [b]) => (a < b ? -1 : 1))
        .map(([name, s]) => ({ key, name, position: s.position, fence: s.fence, starts: s.starts, recorded: s.recorded, result: s.recorded ? s.result : null })),
    ),
  );
  expect(
    tombstones.rows.map((t: any) => {
      const key = [...model.tombstones.keys()].find((k) => hex(k) === t.key_hash);
      const expected = key === undefined ? undefined : model.tombstones.get(key)!;
      return {
        key: key ?? t.key_hash,
        fingerprint: t.fingerprint_hash,
        failed: t.failed,
        finished: near(t.finished, expected ? expected.finishedAt - now : null),
        expiresIn: near(t.expires_in, expected ? expected.expiresAt - now : null),
      };
    }),
    `the tombstones after ${after}`,
  ).toEqual(
    [...model.tombstones.entries()]
      .sort(([a], [b]) => (hex(a) < hex(b) ? -1 : 1))
      .map(([key, t]) => ({ key, fingerprint: hex(t.fingerprint), failed: t.failed, finished: t.finishedAt - now, expiresIn: t.expiresAt - now })),
  );
  const effectsByKey = new Map<string, string[]>();
  for (const e of effects.rows as Array<{ key: string; worker: string }>) effectsByKey.set(e.key, [...(effectsByKey.get(e.key) ?? []), e.worker]);
  expect(Object.fromEntries(effectsByKey), `the committed effects after ${after}`).toEqual(Object.fromEntries(model.effects));
}
