import pg from 'pg';

/**
 * Connects to Postgres once, with a short timeout, and runs `select 1`: undefined when it
 * answered, else the error. A connection of its own, closed before returning.
 */
export async function postgresAnswerProblem(databaseUrl: string, timeoutMs: number): Promise<unknown> {
  const client = new pg.Client({ connectionString: databaseUrl, connectionTimeoutMillis: timeoutMs });
  client.on('error', () => {});
  try {
    await client.connect();
    await client.query('select 1');
    return undefined;
  } catch (error) {
    return error;
  } finally {
    await client.end().catch(() => {});
  }
}
