/**
 * The chaos suite's private Postgres cluster: what the nemesis does to it must be what it says
 * (a crash is recovered from the WAL and keeps every committed row; a fast restart terminates
 * sessions; a pause freezes the server until resumed), and nothing of it is left afterwards.
 * The shared server is not involved.
 */
import { existsSync, readFileSync } from 'node:fs';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PrivatePostgres } from './chaos/private-postgres.js';

async function query(url: string, text: string): Promise<unknown[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query(text)).rows;
  } finally {
    await client.end();
  }
}

/** A session that stays open across a fault, and the error that ended it, if one did. */
async function openSession(url: string): Promise<{ client: pg.Client; ended: Promise<string> }> {
  const client = new pg.Client({ connectionString: url });
  const ended = new Promise<string>((resolve) => client.on('error', (error) => resolve(error.message)));
  await client.connect();
  return { client, ended };
}

describe('PrivatePostgres', () => {
  let server: PrivatePostgres;

  beforeAll(async () => {
    server = await PrivatePostgres.start({ maxConnections: 20 });
    await query(server.url, 'create table committed (n int)');
  });

  afterAll(async () => {
    await server?.destroy(); // already done by the last test, unless it failed
  });

  it('runs durably, on its own port, with the connections asked for', async () => {
    expect(server.port).not.toBe(5432);
    const rows = await query(server.url, `select current_setting('fsync') as fsync, current_setting('synchronous_commit') as sync, current_setting('max_connections') as max`);
    expect(rows).toEqual([{ fsync: 'on', sync: 'on', max: '20' }]);
  });

  it('crash: kills the postmaster and every backend; the next start recovers and keeps what was committed', async () => {
    await query(server.url, 'insert into committed values (1)');
    const session = await openSession(server.url);
    const before = server.pid;
    await server.crashAndRecover(200);
    expect(await session.ended).toMatch(/terminat|unexpected/i);
    expect(server.pid).not.toBe(before);
    expect(server.recoveries).toBe(1);
    expect(readFileSync(`${server.dir}/postgres.log`, 'utf8')).toMatch(/database system was (interrupted|not properly shut down)/);
    expect(await query(server.url, 'select n from committed')).toEqual([{ n: 1 }]);
  });

  it('fast restart: terminates sessions as an administrator would, with no recovery', async () => {
    const session = await openSession(server.url);
    await server.fastRestart(200);
    expect(await session.ended).toMatch(/terminating connection due to administrator command/);
    expect(server.recoveries).toBe(1);
    expect(await query(server.url, 'select n from committed')).toEqual([{ n: 1 }]);
  });

  it('pause: a query waits until the server is resumed', async () => {
    server.pause();
    expect(server.paused).toBe(true);
    let answered = false;
    const pending = query(server.url, 'select 2 as n').then((rows) => {
      answered = true;
      return rows;
    });
    await new Promise((resolve) => setTimeout(resolve, 300));
    expect(answered).toBe(false);
    server.resume();
    expect(await pending).toEqual([{ n: 2 }]);
  });

  it('destroy stops the server, frozen or not, and deletes its directory', async () => {
    const pid = server.pid!;
    server.pause();
    await server.destroy();
    expect(existsSync(server.dir)).toBe(false);
    expect(() => process.kill(pid, 0)).toThrow();
  });
});
