import { sql, type Kysely, type Migration } from 'kysely';
import { claimKeyFunctionDdl } from './sql/claim.js';
import { claimKeysFunctionDdl } from './sql/claim-batch.js';
import { claimNewKeyFunctionDdl } from './sql/claim-new-key.js';
import { claimNewKeysFunctionDdl } from './sql/claim-new-keys.js';
import { completeKeyFunctionDdl, storeFastPathResultFunctionDdl } from './sql/complete-and-commit.js';
import { extendLeaseFunctionDdl } from './sql/extend.js';
import { groupSettingsFunctionsDdl, groupStateFunctionsDdl } from './sql/group-settings.js';
import { insertCompletedKeysFunctionDdl } from './sql/insert-completed-keys.js';
import { recordStepFunctionDdl } from './sql/record-step.js';
import { startStepFunctionDdl } from './sql/start-step.js';
import { keysTableLayout } from './sql/keys-table-layout.js';
import { perKeyRetentionDdl, tombstonesDdl } from './sql/tombstones.js';
import { acquireConcurrencySlotFunctionDdl, concurrencyLimitSetsDdl, concurrencySlotLockKeyDdl, concurrencySlotsDdl, keyConcurrencyLimitsDdl } from './sql/concurrency-slots.js';
import { concurrencySlotWakesDdl } from './sql/concurrency-slot-wakes.js';
import { concurrencySlotsInTransactionDdl, wakeConcurrencyWaitersDdl } from './sql/concurrency-slots-in-transaction.js';
import { coalescingDdl, coalescingEndsDdl, coalescingSendOrderDdl } from './sql/coalescing.js';
import { schedulesDdl } from './sql/schedules.js';

/** How a new schema's tables are laid out (see {@link migrationsFor}). */
export interface SchemaLayout {
  /**
   * Hash partitions of a new keys table, on its primary key (scope, key); unset or 0: one plain
   * table. Read only when the table is created: an existing table keeps its layout.
   */
  readonly keysPartitions?: number;
}

/**
 * The schema's history, oldest first. Each migration takes the schema name because the
 * schema is configurable; never edit a migration that has shipped, add a new one.
 *
 * The PL/pgSQL functions are the exception, kept as "repeatable" definitions: every migration
 * that changes a function's body installs its current definition (`create or replace`), so a
 * fresh database (which runs them all) and an upgraded one end with the same body. Installing
 * a body that names a column a later migration adds is fine: PL/pgSQL resolves names at the
 * first call, not at `create function`.
 *
 * A hash-partitioned keys table (`layout.keysPartitions`) is the same table in meaning: the
 * partition key is the primary key (scope, key), so the primary key, every `ON CONFLICT` on it
 * and the job_steps foreign key stay as they are, and each statement by (scope, key) reads one
 * partition. Migrations that change the table's storage apply it to each partition. (001 and
 * 007 take the layout into account; for a plain table they run the statements they always ran,
 * so a database migrated before the option existed is in the state a new one reaches.)
 */
export function migrationsFor(schema: string, layout: SchemaLayout = {}): Record<string, Migration> {
  const t = (table: string) => sql.id(schema, table);
  const partitions = layout.keysPartitions ?? 0;
  return {
    '001_idempotency_keys': {
      async up(db: Kysely<any>) {
        const partitioning = partitions > 0 ? sql` partition by hash (scope, key)` : sql``;
        await sql`
          create table ${t('idempotency_keys')} (
            scope         text        not null,
            key           text        not null,
            fingerprint   text        not null,
            status        text        not null check (status in ('processing', 'completed', 'failed')),
            owner         uuid,
            fence         bigint      not null default 1,
            attempts      integer     not null default 1,
            locked_until  timestamptz,
            result        jsonb,
            error         jsonb,
            job_id        text,
            queue         text,
            job_name      text,
            payload       jsonb,
            created_at    timestamptz not null default now(),
            updated_at    timestamptz not null default now(),
            completed_at  timestamptz,
            expires_at    timestamptz,
            primary key (scope, key)
          )${partitioning}`.execute(db);
        for (let remainder = 0; remainder < partitions; remainder++) {
          await sql`create table ${t(keysPartitionName(remainder, partitions))}
            partition of ${t('idempotency_keys')}
            for values with (modulus ${sql.lit(partitions)}, remainder ${sql.lit(remainder)})`.execute(db);
        }
        // Indexes on a partitioned table are created on each partition (and on any attached later).
        // Takeover candidates and the sweeper: processing keys ordered by lease expiry.
        await sql`create index idempotency_keys_processing_lease
          on ${t('idempotency_keys')} (locked_until) where status = 'processing'`.execute(db);
        // The janitor: finished keys ordered by expiry.
        await sql`create index idempotency_keys_expiry
          on ${t('idempotency_keys')} (expires_at) where expires_at is not null`.execute(db);
      },
    },
    '002_outbox': {
      async up(db: Kysely<any>) {
        await sql`
          create table ${t('outbox')} (
            id          bigint generated always as identity primary key,
            queue       text        not null,
            job_name    text        not null,
            job_id      text        not null,
            data        jsonb       not null,
            opts        jsonb       not null default '{}'::jsonb,
            created_at  timestamptz not null default now(),
            sent_at     timestamptz
          )`.execute(db);
        // The relay reads unsent rows oldest first.
        await sql`create index outbox_unsent on ${t('outbox')} (id) where sent_at is null`.execute(db);
      },
    },
    // The claim as a PL/pgSQL function: planned once per session instead of once per job.
    '003_claim_key_function': installing(claimKeyFunctionDdl),
    // Several leased claims in one statement and one commit (the claim batcher).
    '004_claim_keys_function': installing(claimKeysFunctionDdl),
    '005_notify_only_waiters': {
      // NOTIFY at commit takes a database-wide lock and halves commit throughput, so a key
      // notifies only when a waiter asked for it (see key-settled-listener.ts).
      async up(db: Kysely<any>) {
        await sql`alter table ${t('idempotency_keys')} add column has_waiters boolean not null default false`.execute(db);
        await claimKeyFunctionDdl(schema).execute(db);
        await claimKeysFunctionDdl(schema).execute(db);
      },
    },
    // The fenced completion as a function: planned once per connection instead of parsed and
    // planned from literal text on every job (a sixth of Postgres's time under load).
    '006_complete_key_function': installing(completeKeyFunctionDdl),
    '007_fast_path_result_function': {
      // The fast path's result UPDATE as a function, and room on each page so that this
      // UPDATE, which changes no indexed column, can be HOT.
      async up(db: Kysely<any>) {
        await storeFastPathResultFunctionDdl(schema).execute(db);
        // Storage parameters belong to tables with storage: a partitioned table has none (Postgres
        // refuses them there), its partitions do.
        const { partitions: partitionNames } = await keysTableLayout(db, schema);
        for (const table of partitionNames.length > 0 ? partitionNames : ['idempotency_keys']) {
          await sql`alter table ${t(table)} set (fillfactor = 85)`.execute(db);
        }
      },
    },
    // Group commit's fast path claims all of a group's new keys in one statement.
    '008_claim_new_keys_function': installing(claimNewKeysFunctionDdl),
    // store_fast_path_result in PL/pgSQL: Postgres plans a `language sql` body (as migration 007 installed it) again on every call.
    '009_fast_path_result_in_plpgsql': installing(storeFastPathResultFunctionDdl),
    // claim_keys inserts a batch's new keys in one statement instead of one claim_key call each.
    '010_claim_keys_set_based': installing(claimKeysFunctionDdl),
    // The fast path's claim of one new key without claim_key's generality (see claim-new-key.ts).
    '011_claim_new_key_function': installing(claimNewKeyFunctionDdl),
    // A takeover records the new job's id, queue and name (the sweeper asks that queue), and a
    // claim finds a row held under its own owner token to be its own (a lost reply of a commit).
    '012_claim_key_takeover_records_job': installing(claimKeyFunctionDdl),
    // The heartbeat's extension bounded by a lock timeout, telling its own completion from a loss.
    '013_extend_lease_function': installing(extendLeaseFunctionDdl),
    '014_job_steps': {
      // The steps of multi-step jobs (`ctx.step`), one row per step under its key and name.
      // The primary key makes a step record once (see record-step.ts); the foreign key deletes
      // a key's steps with the key (janitor, `keys purge`), so a key claimed anew never finds
      // an earlier life's steps. `fence` is the claim that last started or recorded the step,
      // `starts` how many times an external step started; `result` and `recorded_at` stay null
      // until it is recorded.
      async up(db: Kysely<any>) {
        await sql`
          create table ${t('job_steps')} (
            scope        text        not null,
            key          text        not null,
            name         text        not null,
            position     integer     not null,
            fence        bigint      not null,
            starts       integer     not null default 1,
            result       jsonb,
            started_at   timestamptz not null default now(),
            recorded_at  timestamptz,
            primary key (scope, key, name),
            foreign key (scope, key) references ${t('idempotency_keys')} (scope, key) on delete cascade
          )`.execute(db);
        await startStepFunctionDdl(schema).execute(db);
        await recordStepFunctionDdl(schema).execute(db);
      },
    },
    '015_key_audit': {
      // What operators did to keys (the key inspector's and the CLI's release): who, when, why.
      // No foreign key to the key: the record outlives the key (the janitor deletes keys, not
      // their history), and a key claimed anew still shows what was done to its earlier life.
      async up(db: Kysely<any>) {
        await sql`
          create table ${t('key_audit')} (
            id      bigint      generated always as identity primary key,
            scope   text        not null,
            key     text        not null,
            action  text        not null,
            actor   text        not null,
            reason  text        not null,
            detail  jsonb,
            at      timestamptz not null default now()
          )`.execute(db);
        // A key's page lists its entries newest first.
        await sql`create index key_audit_by_key on ${t('key_audit')} (scope, key, id)`.execute(db);
      },
    },
    '016_group_end_functions': {
      // A group's end (see protocol/group-transaction.ts): its new keys inserted by one call
      // that names the keys that had a row, and the check that no job changed a watched setting.
      // claim_new_keys (migration 008) is no longer called; it stays for workers of earlier
      // versions still running during a rolling upgrade.
      async up(db: Kysely<any>) {
        await insertCompletedKeysFunctionDdl(schema).execute(db);
        await groupSettingsFunctionsDdl(schema).execute(db);
      },
    },
    '017_key_tombstones': {
      // What is left of a finished key after its retention, and the trigger that refuses a new
      // insert of a tombstoned key (see sql/tombstones.ts). Empty, and checked only by inserts of
      // brand-new keys, until the janitor is given a tombstone window.
      async up(db: Kysely<any>) {
        for (const statement of tombstonesDdl(schema)) await statement.execute(db);
      },
    },
    '018_concurrency_slots': {
      // Per-key concurrency limits: a group's slots, its waiters and the one function that takes
      // a slot (see sql/concurrency-slots.ts). Untouched by jobs that name no concurrency key.
      async up(db: Kysely<any>) {
        for (const statement of concurrencySlotsDdl(schema)) await statement.execute(db);
      },
    },
    '019_coalescing': {
      // Coalescing keys: the generation running and the pending successor's payload per key (see sql/coalescing.ts).
      async up(db: Kysely<any>) {
        for (const statement of coalescingDdl(schema)) await statement.execute(db);
      },
    },
    '020_schedules': {
      // Schedules: one row per schedule, with the cursor its ticks have been enqueued up to (see sql/schedules.ts).
      async up(db: Kysely<any>) {
        for (const statement of schedulesDdl(schema)) await statement.execute(db);
      },
    },
    '021_key_concurrency_limits': {
      // The concurrency key and limit each key took a slot under, recorded by the slot's own
      // statement, so the sweeper adds a lost job again under its limit (see sql/concurrency-slots.ts).
      async up(db: Kysely<any>) {
        for (const statement of keyConcurrencyLimitsDdl(schema)) await statement.execute(db);
        await acquireConcurrencySlotFunctionDdl(schema).execute(db);
      },
    },
    // A starving waiter holds the free slots of its group only while it keeps coming back (seen
    // within the starvation bound); before, one that did not come back held them for nobody.
    '022_concurrency_waiters_seen': installing(acquireConcurrencySlotFunctionDdl),
    '023_per_key_retention': {
      // A job's own retention (see sql/tombstones.ts): the key keeps its tombstone window, which
      // the completion, the failure and a group's fast-path insert write. Each of those three
      // functions gains a last parameter that defaults to null, so workers of an earlier version
      // still call them as they did; the old signatures are dropped first, since beside the new
      // ones they would make such a call ambiguous.
      async up(db: Kysely<any>) {
        for (const statement of perKeyRetentionDdl(schema)) await statement.execute(db);
        await sql`drop function if exists ${t('complete_key')}(text, text, uuid, bigint, jsonb, bigint, text)`.execute(db);
        await completeKeyFunctionDdl(schema).execute(db);
        await sql`drop function if exists ${t('store_fast_path_result')}(text, text, uuid, jsonb)`.execute(db);
        await storeFastPathResultFunctionDdl(schema).execute(db);
        await sql`drop function if exists ${t('insert_completed_keys')}(text[], text[], text[], uuid[], bigint[], int, text[], text[], text[], jsonb[], jsonb[])`.execute(db);
        await insertCompletedKeysFunctionDdl(schema).execute(db);
      },
    },
    '024_concurrency_limit_sets': {
      // A job may name several concurrency keys (a tenant's limit and one in all): a key records
      // each, and the slot's function drops records of keys its job no longer names (see
      // sql/concurrency-slots.ts). Its old signature goes first, as in 023.
      async up(db: Kysely<any>) {
        for (const statement of concurrencyLimitSetsDdl(schema)) await statement.execute(db);
      },
    },
    '025_coalescing_send_order': {
      // Coalescing orders payloads by when they were sent, where the broker says: an arrival sent
      // before a payload the key already took is superseded (see sql/coalescing.ts).
      async up(db: Kysely<any>) {
        for (const statement of coalescingSendOrderDdl(schema)) await statement.execute(db);
      },
    },
    '026_group_state_check': {
      // Group commit compares the shared transaction's whole state (settings, temporary objects,
      // cursors, prepared statements) with its start after each job, not only its settings at its
      // end (see sql/group-settings.ts); this function names what differs. check_group_settings
      // stays for workers of earlier versions still running during a rolling upgrade.
      async up(db: Kysely<any>) {
        await groupStateFunctionsDdl(schema).execute(db);
      },
    },
    '027_coalescing_ends': {
      // A generation's end outlives its key (the key's deletion records it on the coalescing
      // row), send times ahead of the database clock count as that clock, and idle coalescing
      // rows can be deleted, a key's new row starting past its old generations (see sql/coalescing.ts).
      async up(db: Kysely<any>) {
        for (const statement of coalescingEndsDdl(schema)) await statement.execute(db);
      },
    },
    '028_concurrency_slot_wakes': {
      // A waiter of a concurrency key names its job and queue, so that a freed slot wakes the
      // oldest one (a notification its worker promotes it on) instead of leaving it to its backoff
      // (see sql/concurrency-slot-wakes.ts). Its old signature goes first, as in 024.
      async up(db: Kysely<any>) {
        for (const statement of concurrencySlotWakesDdl(schema)) await statement.execute(db);
      },
    },
    // A slot is taken under a lock of its own, not one of its whole group, so a group's
    // acquisitions no longer wait on each other's commits (see sql/concurrency-slots.ts).
    '029_concurrency_slot_locks': installing(acquireConcurrencySlotFunctionDdl),
    // The same acquisition in fewer statements, none planned as a join over every slot: the
    // held slots are read once and walked (see sql/concurrency-slots.ts).
    '030_concurrency_slot_walk': installing(acquireConcurrencySlotFunctionDdl),
    // A slot is held by its time alone (the run's heartbeat renews it), not also by its key's
    // lease, which would keep a row an earlier attempt left behind held through the key's next run.
    '031_concurrency_slot_time': installing(acquireConcurrencySlotFunctionDdl),
    '032_retention_from_commit': {
      // A key's retention window starts at its completion's commit, not at its transaction's
      // start (`now()`): a transaction longer than the window committed a key already expired.
      // (A fast-path key's window is moved by a statement of its own: sql/complete-and-commit.ts.)
      async up(db: Kysely<any>) {
        await completeKeyFunctionDdl(schema).execute(db);
        await insertCompletedKeysFunctionDdl(schema).execute(db);
      },
    },
    '033_concurrency_slots_in_transaction': {
      // A run that is one transaction holds its slots by their locks for as long as that
      // transaction (no row, no commit of its own: sql/concurrency-slots-in-transaction.ts); a
      // slot's lock has a 64-bit key, and a refusal by a slot held so asks again within a second
      // (sql/concurrency-slots.ts).
      async up(db: Kysely<any>) {
        await concurrencySlotLockKeyDdl(schema).execute(db);
        await concurrencySlotsInTransactionDdl(schema).execute(db);
        await wakeConcurrencyWaitersDdl(schema).execute(db);
        await acquireConcurrencySlotFunctionDdl(schema).execute(db);
      },
    },
    // The take of a run's slots in its transaction, safe in a transaction its group shares: it
    // skips the slots its transaction took already, whose locks the session holds (see
    // sql/concurrency-slots.ts); and the wake of several waiters of a key at once, for the runs
    // of a group that end together (store/wake-batcher.ts). 033's stay for the workers of that release.
    '034_concurrency_slots_in_groups': {
      async up(db: Kysely<any>) {
        await concurrencySlotsInTransactionDdl(schema, { sharedTransaction: true }).execute(db);
        await wakeConcurrencyWaitersDdl(schema, { counted: true }).execute(db);
      },
    },
    // Every taker of a slot walks the slots from one drawn at random, not from 0 up through the
    // locks of the slots in use (see sql/concurrency-slots.ts).
    '035_concurrency_slot_walk_from_random': {
      async up(db: Kysely<any>) {
        await acquireConcurrencySlotFunctionDdl(schema).execute(db);
        await concurrencySlotsInTransactionDdl(schema).execute(db);
        await concurrencySlotsInTransactionDdl(schema, { sharedTransaction: true }).execute(db);
      },
    },
    // A take of a slot row never waits for another transaction's row lock: the stale waiters'
    // sweep and the take of a row whose time ran out skip locked rows, so batches of takes and
    // of releases (store/slot-batcher.ts) cannot wait on each other in a cycle.
    '036_concurrency_slot_takes_never_wait': installing(acquireConcurrencySlotFunctionDdl),
    // Every take of a slot first looks for any waiter of its concurrency key, and one that finds
    // none (a key below its limit) skips the waiters' sweep and reads (sql/concurrency-slots.ts).
    '037_concurrency_takes_without_waiters': {
      async up(db: Kysely<any>) {
        await acquireConcurrencySlotFunctionDdl(schema).execute(db);
        await concurrencySlotsInTransactionDdl(schema).execute(db);
        await concurrencySlotsInTransactionDdl(schema, { sharedTransaction: true }).execute(db);
      },
    },
    '038_concurrency_takes_tell_waiters': {
      async up(db: Kysely<any>) {
        await acquireConcurrencySlotFunctionDdl(schema).execute(db);
      },
    },
  };

  /** A migration that only installs (the current body of) one function. */
  function installing(ddl: (schema: string) => { execute(db: Kysely<any>): Promise<unknown> }): Migration {
    return {
      async up(db: Kysely<any>) {
        await ddl(schema).execute(db);
      },
    };
  }
}

/** Name of the keys table's partition with this remainder: `idempotency_keys_p07` of 16. */
export function keysPartitionName(remainder: number, partitions: number): string {
  return `idempotency_keys_p${String(remainder).padStart(String(partitions - 1).length, '0')}`;
}
