import { sql, type Kysely } from 'kysely';
import type { ScheduleInput, ScheduleRow } from '../records.js';

/**
 * Schedules (see ops/scheduler.ts). A schedule's `cursor` is the time up to which its ticks have
 * been enqueued: every tick at or before it is done, every later tick is still to come. It only
 * moves forward ({@link advanceScheduleCursor}), by the database's clock, so no scheduler — racing,
 * restarted, or with a skewed clock — makes a tick due twice. A removed schedule keeps its row (and
 * its cursor) with `removed_at` set, so that adding it again cannot bring back a tick it had fired.
 */

/** Columns read by the scheduler and the CLI, with the database's `now()` the tick times are measured against. */
const selected = sql`name, kind, spec, timezone, queue, job_name, payload, missed, max_missed,
  cursor, last_tick, created_at, updated_at, now() as db_now`;

/**
 * Creates the schedule or changes it, in one statement (`INSERT … ON CONFLICT DO UPDATE`: two
 * racing upserts both succeed, the later one's definition wins). A new schedule's cursor is
 * `now()`: no tick before its creation is due. Changing a live schedule keeps its cursor; adding a
 * removed one again moves its cursor to `now()` if it was behind, so the ticks it missed while
 * removed do not fire, and those it had fired never fire again.
 */
export async function upsertSchedule(db: Kysely<any>, schema: string, input: ScheduleInput): Promise<ScheduleRow> {
  const table = sql.id(schema, 'schedules');
  const { rows } = await sql<ScheduleRow>`
    insert into ${table} as s (name, kind, spec, timezone, queue, job_name, payload, missed, max_missed, cursor)
    values (${input.name}, ${input.kind}, ${input.spec}, ${input.timezone}, ${input.queue}, ${input.jobName},
            ${input.payloadJson}::jsonb, ${input.missed}, ${input.maxMissed}, now())
    on conflict (name) do update
       set kind = excluded.kind, spec = excluded.spec, timezone = excluded.timezone, queue = excluded.queue,
           job_name = excluded.job_name, payload = excluded.payload, missed = excluded.missed,
           max_missed = excluded.max_missed, updated_at = now(), removed_at = null,
           cursor = case when s.removed_at is null then s.cursor else greatest(s.cursor, now()) end
    returning ${selected}`.execute(db);
  return rows[0]!;
}

/** Marks the schedule removed, keeping its cursor (see the file's comment); false if there was no live schedule of that name. */
export async function removeSchedule(db: Kysely<any>, schema: string, name: string): Promise<boolean> {
  const result = await sql`
    update ${sql.id(schema, 'schedules')} set removed_at = now(), updated_at = now()
     where name = ${name} and removed_at is null`.execute(db);
  return Number(result.numAffectedRows ?? 0) > 0;
}

/** The live schedules by name (or the one named), each with the database's `now()`. */
export async function listSchedules(db: Kysely<any>, schema: string, name?: string): Promise<ScheduleRow[]> {
  const { rows } = await sql<ScheduleRow>`
    select ${selected} from ${sql.id(schema, 'schedules')}
     where removed_at is null ${name === undefined ? sql`` : sql`and name = ${name}`}
     order by name`.execute(db);
  return rows;
}

/**
 * Moves each schedule's cursor forward to its `cursor` (the database's `now()` of the round that
 * enqueued its ticks) and its last tick to the latest tick enqueued, never back: `greatest` makes
 * racing schedulers' updates commute. One statement for a whole round (`unnest` of the names):
 * a round that dies before it only repeats its ticks, under the same keys. Not conditioned on
 * the definition: a tick enqueued under an earlier definition is done either way.
 */
export async function advanceScheduleCursors(
  db: Kysely<any>,
  schema: string,
  entries: readonly { readonly name: string; readonly cursor: Date; readonly lastTick: Date | null }[],
): Promise<void> {
  if (entries.length === 0) return;
  await sql`
    update ${sql.id(schema, 'schedules')} as s
       set cursor = greatest(s.cursor, a.cursor),
           last_tick = case when a.last_tick is null then s.last_tick else greatest(s.last_tick, a.last_tick) end
      from unnest(${entries.map((e) => e.name)}::text[], ${entries.map((e) => e.cursor.toISOString())}::timestamptz[],
                  ${entries.map((e) => e.lastTick?.toISOString() ?? null)}::timestamptz[]) as a(name, cursor, last_tick)
     where s.name = a.name`.execute(db);
}

/** DDL of `schedules`, for migration `020_schedules`. */
export function schedulesDdl(schema: string) {
  return [
    sql`create table ${sql.id(schema, 'schedules')} (
      name        text        primary key,
      kind        text        not null check (kind in ('cron', 'interval')),
      spec        text        not null,
      timezone    text        not null default 'UTC',
      queue       text        not null,
      job_name    text        not null,
      payload     jsonb       not null default 'null',
      missed      text        not null check (missed in ('latest', 'all')),
      max_missed  int         not null check (max_missed >= 1),
      cursor      timestamptz not null,
      last_tick   timestamptz,
      created_at  timestamptz not null default now(),
      updated_at  timestamptz not null default now(),
      removed_at  timestamptz
    )`,
  ];
}
