/**
 * Faults a database-only job brings with it (`--job-faults`): bugs of the job's own that fail
 * it, and statements that change what the rest of its transaction sees. Under group commit a
 * job shares its transaction with others; the outcome must still be that of running the jobs
 * one after another, each in a transaction of its own:
 *
 * - a job with a **failing** fault fails (and only it: no group-mate is failed for it), and
 *   commits nothing;
 * - a job with a **state** fault completes, and no other job sees the state it set.
 *
 * The producer marks a seeded share of keys ({@link jobFaultFor}); the fault travels in the
 * job's payload, so every add of a key carries the same one. Each fault's jobs have a job name
 * of their own ({@link jobNameFor}): the library makes a job kind that sent a statement which
 * cannot share a transaction run alone from then on, and with one name for all, the first such
 * job would end grouping for every job of its worker.
 */
import { sql, type Kysely } from 'kysely';
import { seededRandom } from './random.js';

/** Faults that fail the job, wherever it runs: it must end `failed`, with no effect. */
export const FAILING_JOB_FAULTS = [
  /** Kysely compiles `.where(x, 'in', [])` to `in ()`: 42601, found when Postgres parses it. */
  'syntax',
  /** A text parameter holding a NUL: 22021, when Postgres binds it. */
  'nul',
  /** A row whose `deferrable initially deferred` foreign key points at no row: 23503 at COMMIT. */
  'deferred-fk',
  /** The job sends `commit` itself: refused by the library (TransactionControlError), failed for good. */
  'transaction-control',
] as const;

/** Faults that change transaction-scoped state and complete: nobody else may see the state. */
export const STATE_JOB_FAULTS = [
  /** `set local synchronous_commit = off` (the statement screen sees it). */
  'set-local',
  /** `select set_config('app.tenant', <scope/key>, true)` (the statement screen sees it). */
  'set-tenant',
  /** The same through a PL/pgSQL function: invisible to the screen, caught by the group's settings check. */
  'set-tenant-quietly',
] as const;

export type FailingJobFault = (typeof FAILING_JOB_FAULTS)[number];
export type StateJobFault = (typeof STATE_JOB_FAULTS)[number];
export type JobFault = FailingJobFault | StateJobFault;

export const JOB_FAULTS: readonly JobFault[] = [...FAILING_JOB_FAULTS, ...STATE_JOB_FAULTS];

/** Share of keys that carry a fault. */
export const JOB_FAULT_RATIO = 0.1;

/** The custom setting the tenant faults set and every job reads (the workers watch it: `GROUP_COMMIT_WATCH_SETTINGS`). */
export const TENANT_SETTING = 'app.tenant';

/** Job name of jobs without a fault. */
export const PLAIN_JOB_NAME = 'charge';

export function isFailingJobFault(fault: JobFault | undefined): fault is FailingJobFault {
  return (FAILING_JOB_FAULTS as readonly string[]).includes(fault as string);
}

/**
 * The fault of the producer's `n`-th key under `seed` (undefined for most): a pure function of
 * both, so a run's poisoned keys are known from its seed.
 */
export function jobFaultFor(seed: number, n: number): JobFault | undefined {
  const random = seededRandom(seed ^ 0x5eed_fa17, n + 1);
  if (random.next() >= JOB_FAULT_RATIO) return undefined;
  return random.pick(JOB_FAULTS);
}

/** The BullMQ job name of a key's jobs: `charge`, or `charge-<fault>`. */
export function jobNameFor(fault: JobFault | undefined): string {
  return fault === undefined ? PLAIN_JOB_NAME : `${PLAIN_JOB_NAME}-${fault}`;
}

/** Creates what the faults need in `schema`: the deferred foreign key's tables, the NUL's table, the quiet setter. */
export async function createJobFaultObjects(db: Kysely<any>, schema: string): Promise<void> {
  await sql`create table ${sql.id(schema, 'fault_parents')} (id integer primary key)`.execute(db);
  await sql`create table ${sql.id(schema, 'fault_children')} (
    id bigint generated always as identity primary key,
    scope text not null,
    key text not null,
    parent_id integer not null references ${sql.id(schema, 'fault_parents')} (id) deferrable initially deferred
  )`.execute(db);
  await sql`create table ${sql.id(schema, 'fault_notes')} (scope text not null, key text not null, note text not null)`.execute(db);
  // What a handler calls, not what it sends: the statement screen cannot see inside it.
  await sql`create function ${sql.id(schema, 'set_tenant_quietly')}(p_tenant text) returns void
    language plpgsql as $$ begin perform set_config(${sql.lit(TENANT_SETTING)}, p_tenant, true); end $$`.execute(db);
}

/** Whom the job is: its tenant value. */
export function tenantOf(job: { readonly scope: string; readonly key: string }): string {
  return `${job.scope}/${job.key}`;
}

/**
 * What a failed job of each failing fault says (its BullMQ `failedReason`, which carries the
 * error's message, also when a later add replays the stored failure).
 */
export const JOB_FAULT_ERRORS: Readonly<Record<FailingJobFault, RegExp>> = {
  syntax: /syntax error/,
  nul: /invalid byte sequence for encoding "UTF8": 0x00/,
  'deferred-fk': /violates foreign key constraint/,
  'transaction-control': /which would end its transaction/,
};

/**
 * Errors the faults make Postgres log, by what caused them: each failing fault's own, and the
 * group's settings check refusing a COMMIT (a setting changed inside a function, in a group).
 * More than one per key with a fault means the key's jobs also met groups that then rolled back.
 */
export const SERVER_ERRORS_OF_FAULTS: Readonly<Record<string, RegExp>> = {
  'syntax error': /ERROR: {2}syntax error at or near/g,
  'NUL (22021)': /ERROR: {2}invalid byte sequence for encoding "UTF8": 0x00/g,
  'foreign key at COMMIT (23503)': /ERROR: {2}insert or update on table "fault_children" violates foreign key constraint/g,
  'setting changed in a group (IJ003)': /ERROR: {2}a job of this group changed/g,
};

/** Counts {@link SERVER_ERRORS_OF_FAULTS} in a Postgres server log. */
export function countServerErrorsOfFaults(log: string): Record<string, number> {
  return Object.fromEntries(Object.entries(SERVER_ERRORS_OF_FAULTS).map(([name, pattern]) => [name, log.match(pattern)?.length ?? 0]));
}
