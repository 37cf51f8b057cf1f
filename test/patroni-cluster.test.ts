/**
 * The private Patroni cluster (test/support/patroni-cluster.ts) with synchronous replication:
 * HAProxy routes to the leader, a standby is in recovery and refuses writes with 25006, and
 * each nemesis operation does what it says — a switchover ends the old leader's sessions and
 * makes it a standby, a crashed leader is replaced once its lock expires and rejoins, a killed
 * Postgres is restarted in place, a manual failover moves the leader — losing nothing that was
 * committed. A commit waits while the synchronous standby receives nothing.
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PatroniCluster } from './support/patroni-cluster.js';
import { systemToolForTests } from './support/system-tools.js';

// Outside CI a missing program skips the file (the run's set-up says which, and how to install
// it); under CI=true it fails the file.
const programs = [systemToolForTests('patroni'), systemToolForTests('etcd'), systemToolForTests('haproxy')];

/** A session the test keeps open, and the error that ended it, if one did. */
async function openSession(url: string): Promise<{ client: pg.Client; ended: Promise<Error> }> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 5_000 });
  const ended = new Promise<Error>((resolve) => client.on('error', resolve));
  await client.connect();
  return { client, ended };
}

async function query<T = Record<string, unknown>>(url: string, text: string, values: unknown[] = []): Promise<T[]> {
  const { client } = await openSession(url);
  try {
    return (await client.query(text, values)).rows as T[];
  } finally {
    await client.end().catch(() => {});
  }
}

/** The SQLSTATE a statement fails with (`undefined` when it succeeds). */
async function sqlState(url: string, text: string): Promise<string | undefined> {
  try {
    await query(url, text);
    return undefined;
  } catch (error) {
    return (error as { code?: string }).code;
  }
}

async function committedRows(url: string): Promise<number[]> {
  return (await query<{ n: number }>(url, 'select n from committed order by n')).map((row) => row.n);
}

describe.skipIf(programs.includes(undefined))('PatroniCluster (synchronous replication)', () => {
  let cluster: PatroniCluster;
  let next = 1;

  /** Commits one more row through HAProxy; returns every row committed so far. */
  async function commitOne(): Promise<number[]> {
    await query(cluster.url, 'insert into committed values ($1)', [next++]);
    return Array.from({ length: next - 1 }, (_, i) => i + 1);
  }

  beforeAll(async () => {
    cluster = await PatroniCluster.start({ synchronous: true });
    await query(cluster.url, 'create table committed (n int primary key)');
  }, PatroniCluster.START_HOOK_TIMEOUT_MS);

  afterAll(async () => {
    await cluster?.stop();
  });

  it('routes the HAProxy port to the leader, which replicates synchronously; the replica port reaches a standby', async () => {
    const members = await cluster.members();
    const leader = members.find((m) => m.role === 'leader')!;
    expect(members.map((m) => m.role).sort()).toEqual(['leader', 'sync_standby']);
    const [primary] = await query<{ port: number; recovery: boolean; standbys: string }>(
      cluster.url,
      `select inet_server_port() as port, pg_is_in_recovery() as recovery, current_setting('synchronous_standby_names') as standbys`,
    );
    expect(primary).toEqual({ port: Number(new URL(cluster.memberUrl(leader.name)).port), recovery: false, standbys: expect.stringMatching(/pg\d/) });
    const [replica] = await query<{ recovery: boolean }>(cluster.replicaUrl, 'select pg_is_in_recovery() as recovery');
    expect(replica!.recovery).toBe(true);
  });

  it('a standby is in recovery, read-only, and refuses a write with 25006', async () => {
    const standby = (await cluster.members()).find((m) => m.role !== 'leader')!.name;
    const url = cluster.memberUrl(standby);
    const [state] = await query(url, `select pg_is_in_recovery() as recovery, current_setting('transaction_read_only') as read_only`);
    expect(state).toEqual({ recovery: true, read_only: 'on' });
    expect(await sqlState(url, 'insert into committed values (-1)')).toBe('25006');
  });

  it('switchover: the old leader ends its sessions (57P01) and becomes a read-only standby; HAProxy routes to the new leader; nothing committed is lost', async () => {
    const committed = await commitOne();
    const oldLeader = (await cluster.leader())!;
    const session = await openSession(cluster.memberUrl(oldLeader));
    const change = await cluster.switchover();
    expect(change.from).toBe(oldLeader);
    expect(change.to).not.toBe(oldLeader);
    expect((await session.ended as { code?: string }).code).toBe('57P01');
    await cluster.waitForHealthy();
    expect(await cluster.leader()).toBe(change.to);
    expect(await sqlState(cluster.memberUrl(oldLeader), 'insert into committed values (-1)')).toBe('25006');
    expect(await committedRows(cluster.url)).toEqual(committed);
  });

  it('a commit waits while the synchronous standby receives nothing, and completes once it does', async () => {
    await cluster.waitForHealthy();
    const standby = (await cluster.members()).find((m) => m.role === 'sync_standby')!.name;
    await cluster.pauseReplication(standby);
    let done = false;
    const commit = commitOne().finally(() => (done = true));
    await new Promise((resolve) => setTimeout(resolve, 1_500));
    expect(done).toBe(false);
    cluster.resumeReplication(standby);
    const committed = await commit;
    expect(await committedRows(cluster.url)).toEqual(committed);
  });

  it('crash of the leader (Patroni and Postgres killed): a standby takes over after the lock expires; the crashed member rejoins as a standby', async () => {
    const committed = await commitOne();
    const crashed = await cluster.crashLeader();
    const leader = await cluster.waitForLeader({ notMember: crashed });
    expect(leader).not.toBe(crashed);
    expect(await committedRows(cluster.url)).toEqual(committed);
    await cluster.restartMember(crashed);
    await cluster.waitForHealthy(60_000);
    expect((await cluster.members()).find((m) => m.name === crashed)?.role).toMatch(/standby|replica/);
  }, 90_000);

  it('SIGKILL of the leader\'s Postgres: Patroni restarts it in place and it stays the leader', async () => {
    const committed = await commitOne();
    const leader = await cluster.killLeaderPostgres();
    expect(await cluster.waitForLeader()).toBe(leader);
    expect(await committedRows(cluster.url)).toEqual(committed);
  });

  it('manual failover moves the leader to the standby', async () => {
    await cluster.waitForHealthy();
    const committed = await commitOne();
    const change = await cluster.failover();
    expect(change.to).not.toBe(change.from);
    expect(await cluster.leader()).toBe(change.to);
    expect(await committedRows(cluster.url)).toEqual(committed);
  });
});
