/** A Kysely instance whose every Postgres round trip (BEGIN and COMMIT included) is counted. */
import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import { kyselyOverPool } from '../../src/store/pipelining-pool.js';

/**
 * `kind: 'library'` builds the instance as `createPostgresDb` does (statements can share a
 * round trip); `'plain'` is a plain Kysely over the pool, as a user might pass in.
 * `preparedStatements` as `createPostgresDb`'s: false behind a pooler that keeps none
 * (the test environment's `preparedStatements`), where a named statement would be found missing
 * on another server connection and its job's statements sent again.
 */
export function createCountingDb(connectionString: string, kind: 'library' | 'plain' = 'library', preparedStatements = true) {
  const counter = { roundTrips: 0, statements: [] as string[] };
  const pool = new pg.Pool({ connectionString, max: 2 });
  pool.on('connect', (client) => {
    const query = client.query.bind(client) as (...args: unknown[]) => unknown;
    (client as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
      counter.roundTrips++;
      const text = typeof args[0] === 'string' ? args[0] : (args[0] as { text?: string })?.text ?? '';
      counter.statements.push(text.trim());
      return query(...args);
    };
  });
  const db = kind === 'library' ? kyselyOverPool(pool, { preparedStatements }) : new Kysely<any>({ dialect: new PostgresDialect({ pool }) });
  return {
    db,
    counter,
    /** Round trips made by `fn`. */
    async count(fn: () => Promise<unknown>): Promise<{ roundTrips: number; statements: string[] }> {
      const before = counter.roundTrips;
      const first = counter.statements.length;
      await fn();
      return { roundTrips: counter.roundTrips - before, statements: counter.statements.slice(first) };
    },
  };
}
