/**
 * A database clock of a test's own, for what must read the database's `now()` (the scheduler):
 * sessions that connect with {@link clockedUrl}'s `search_path` find the schema's `now()` before
 * `pg_catalog.now()`, so the store's unchanged SQL reads the test's time, while every other
 * session keeps Postgres's own clock. The time is a piecewise function of Postgres's real clock,
 * one row of `pieces` per piece (the latest piece whose `from_real` has passed holds):
 * `clock_at + (pg_catalog.now() − from_real) × rate`. Rate 0 holds the clock at `clock_at`
 * ({@link DatabaseClock.set}); rate 60 runs it a minute a second; two pieces make it jump.
 *
 * Unqualified calls only: `current_timestamp` and `pg_catalog.now()` still read the real clock.
 * The store's scheduler statements call `now()`.
 */
import { sql, type Kysely } from 'kysely';
import { createPostgresDb } from '../../src/store/create-postgres-db.js';

/** One piece of the clock: from real time `fromReal` on, the clock reads `clockAt` moving at `rate` × real time. */
export interface ClockPiece {
  /** Real time (Postgres's `pg_catalog.now()`) the piece starts at; `'now'` for the moment it is written. */
  readonly fromReal: Date | 'now';
  /** What the clock reads at `fromReal`. */
  readonly clockAt: Date;
  /** Clock seconds per real second (0: held). */
  readonly rate: number;
}

/** The `search_path` of a clocked session: the clock's schema before `pg_catalog`. */
export function clockedSearchPath(clockSchema: string): string {
  return `${clockSchema},pg_catalog,public`;
}

/** `url` with the startup option that puts `clockSchema` first on the search path (a direct Postgres URL: a pooler drops startup options). */
export function clockedUrl(url: string, clockSchema: string): string {
  const clocked = new URL(url);
  const own = clocked.searchParams.get('options');
  clocked.searchParams.set('options', `${own ? `${own} ` : ''}-c search_path=${clockedSearchPath(clockSchema)}`);
  return clocked.toString();
}

/** Creates the clock's schema, table and `now()` in the database `db` reaches (real clock until a piece is written). */
export async function createClockSchema(db: Kysely<any>, clockSchema: string): Promise<void> {
  const schema = sql.id(clockSchema);
  await sql`create schema if not exists ${schema}`.execute(db);
  await sql`create table if not exists ${sql.id(clockSchema, 'pieces')} (
              from_real timestamptz not null primary key,
              clock_at  timestamptz not null,
              rate      float8      not null)`.execute(db);
  // STABLE, as pg_catalog.now(): one value per statement, so a statement reads one time.
  await sql`create or replace function ${sql.id(clockSchema, 'now')}() returns timestamptz
              language sql stable as ${sql.lit(`
                select coalesce(
                  (select p.clock_at + (pg_catalog.now() - p.from_real) * p.rate
                     from ${clockSchema}.pieces p where p.from_real <= pg_catalog.now()
                    order by p.from_real desc limit 1),
                  pg_catalog.now())`)}`.execute(db);
}

/** Replaces the clock's pieces. */
export async function setClockPieces(db: Kysely<any>, clockSchema: string, pieces: readonly ClockPiece[]): Promise<void> {
  const table = sql.id(clockSchema, 'pieces');
  await db.transaction().execute(async (tx) => {
    await sql`delete from ${table}`.execute(tx);
    for (const piece of pieces) {
      const fromReal = piece.fromReal === 'now' ? sql`pg_catalog.now()` : sql`${piece.fromReal}::timestamptz`;
      await sql`insert into ${table} (from_real, clock_at, rate) values (${fromReal}, ${piece.clockAt}::timestamptz, ${piece.rate})`.execute(tx);
    }
  });
}

/** A clock held at instants the test sets, and a pool whose sessions read it. */
export interface DatabaseClock {
  /** Sessions of this pool read the clock's `now()`. */
  readonly db: Kysely<any>;
  /** Holds the clock at `at` (the database's `now()` for the clocked sessions from now on). */
  set(at: Date): Promise<void>;
  /** What the clocked sessions read as `now()`. */
  now(): Promise<Date>;
  /** Closes the pool and drops the clock's schema. */
  close(): Promise<void>;
}

/**
 * A held clock in schema `<schema>_clock` of the database `directUrl` names (Postgres itself:
 * startup options do not pass a pooler); `admin` creates and drops it.
 */
export async function createDatabaseClock(admin: Kysely<any>, directUrl: string, schema: string): Promise<DatabaseClock> {
  const clockSchema = `${schema}_clock`.slice(0, 63);
  await createClockSchema(admin, clockSchema);
  const db = createPostgresDb({ connectionString: clockedUrl(directUrl, clockSchema), maxConnections: 4, applicationName: 'test:database-clock' }, () => {});
  return {
    db,
    set: (at) => setClockPieces(admin, clockSchema, [{ fromReal: 'now', clockAt: at, rate: 0 }]),
    async now() {
      const { rows } = await sql<{ now: Date }>`select now() as now`.execute(db);
      return rows[0]!.now;
    },
    async close() {
      await db.destroy();
      await sql`drop schema if exists ${sql.id(clockSchema)} cascade`.execute(admin);
    },
  };
}
