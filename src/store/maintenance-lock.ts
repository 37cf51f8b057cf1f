import { sql, type Kysely } from 'kysely';

/** Which periodic task a lock serialises; each has its own lock per schema. */
export type MaintenanceTask = 'janitor' | 'sweeper' | 'stats';

// Fixed advisory-lock class ids, ASCII "ijja", "ijsw", "ijst"; the second key is hashtext(scope),
// the schema by default, so the same task in two schemas does not contend. (Migrations use "idem".)
const LOCK_CLASS: Record<MaintenanceTask, number> = { janitor: 0x696a6a61, sweeper: 0x696a7377, stats: 0x696a7374 };

/** What `withMaintenanceLock` returns: the task's result, or that another process holds the lock. */
export type LockedRun<T> =
  | {
      /** This process held the lock and ran the task. */
      readonly ran: true;
      /** What the task returned. */
      readonly result: T;
    }
  | {
      /** Another process holds the lock: the task was skipped this round. */
      readonly ran: false;
    };

/**
 * Runs `fn` only if no other process is running the same task on the same schema right now.
 *
 * A session-level `pg_try_advisory_lock` on one pooled connection, held for the run and
 * released in `finally`: never waits (a process that loses simply skips this round), costs no
 * row or table lock, and vanishes with the session if the process dies mid-run, so a crashed
 * leader never blocks the others. `fn` receives the locked connection and should run its
 * statements on it (each statement its own short transaction), so a run uses one connection.
 *
 * Needs a real session: behind PgBouncer in transaction mode the lock and the unlock may land
 * on different server connections, and a lock left on a pooled server connection holds off
 * every other process. So `db` reaches Postgres itself (`DATABASE_DIRECT_URL` in the worker and
 * maintenance processes); see docs/operations.md.
 */
export async function withMaintenanceLock<T>(
  db: Kysely<any>,
  schema: string,
  task: MaintenanceTask,
  fn: (connection: Kysely<any>) => Promise<T>,
  /** What the lock covers, if narrower than the schema (e.g. the sweeper's queue list). @defaultValue `schema` */
  scope: string = schema,
): Promise<LockedRun<T>> {
  return db.connection().execute(async (connection) => {
    const { rows } = await sql<{ locked: boolean }>`
      select pg_try_advisory_lock(${LOCK_CLASS[task]}, hashtext(${scope})) as locked`.execute(connection);
    if (!rows[0]?.locked) return { ran: false } as const;
    try {
      return { ran: true, result: await fn(connection) } as const;
    } finally {
      await sql`select pg_advisory_unlock(${LOCK_CLASS[task]}, hashtext(${scope}))`.execute(connection);
    }
  });
}
