import type { Kysely } from 'kysely';
import type { ScheduleInput, ScheduleRow } from './records.js';
import { advanceScheduleCursors, listSchedules, removeSchedule, upsertSchedule } from './sql/schedules.js';

/**
 * The schedules' statements, for the scheduler and the `schedules` command; each statement and
 * why it is written so is in `sql/schedules.ts`.
 */
export class ScheduleStore {
  constructor(
    readonly db: Kysely<any>,
    /** Schema holding the `schedules` table. */
    readonly schema: string,
  ) {}

  /** Creates or changes a schedule; a new one's ticks start after the database's `now()`. */
  upsert(input: ScheduleInput): Promise<ScheduleRow> {
    return upsertSchedule(this.db, this.schema, input);
  }

  /** Removes a live schedule (its cursor is kept); false if there was none of that name. */
  remove(name: string): Promise<boolean> {
    return removeSchedule(this.db, this.schema, name);
  }

  /** The live schedules (or the one named), each with the database's `now()`. */
  list(name?: string): Promise<ScheduleRow[]> {
    return listSchedules(this.db, this.schema, name);
  }

  /** Moves schedules' cursors (and last ticks) forward, never back, in one statement. */
  advance(entries: readonly { readonly name: string; readonly cursor: Date; readonly lastTick: Date | null }[]): Promise<void> {
    return advanceScheduleCursors(this.db, this.schema, entries);
  }
}
