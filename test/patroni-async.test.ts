/**
 * The private Patroni cluster with asynchronous replication (`synchronous: false`): commits the
 * leader acknowledged while its standby received nothing are gone after the leader crashes and
 * the standby takes over. This is the loss that synchronous replication prevents
 * (test/patroni-cluster.test.ts: there the same commit waits instead).
 */
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PatroniCluster } from './support/patroni-cluster.js';
import { systemToolForTests } from './support/system-tools.js';

// Outside CI a missing program skips the file (the run's set-up says which, and how to install
// it); under CI=true it fails the file.
const programs = [systemToolForTests('patroni'), systemToolForTests('etcd'), systemToolForTests('haproxy')];

async function connect(url: string): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 5_000 });
  client.on('error', () => {});
  await client.connect();
  return client;
}

describe.skipIf(programs.includes(undefined))('PatroniCluster (asynchronous replication)', () => {
  let cluster: PatroniCluster;

  beforeAll(async () => {
    cluster = await PatroniCluster.start({ synchronous: false });
  }, PatroniCluster.START_HOOK_TIMEOUT_MS);

  afterAll(async () => {
    await cluster?.stop();
  });

  it('replicates asynchronously: no synchronous standby', async () => {
    expect((await cluster.members()).map((m) => m.role).sort()).toEqual(['leader', 'replica']);
    const client = await connect(cluster.url);
    try {
      expect((await client.query(`select current_setting('synchronous_standby_names') as names`)).rows[0].names).toBe('');
    } finally {
      await client.end();
    }
  });

  it('a failover loses the commits the leader acknowledged while the standby received nothing', async () => {
    const client = await connect(cluster.url);
    await client.query('create table acked (n int primary key)');
    await client.query('insert into acked select generate_series(1, 100)');
    const leader = (await cluster.leader())!;
    const standby = cluster.memberNames.find((name) => name !== leader)!;
    // The standby has the first 100 before its stream is frozen.
    await waitForReplay(cluster.memberUrl(standby), 100);
    await cluster.pauseReplication(standby);
    for (let n = 101; n <= 150; n++) await client.query('insert into acked values ($1)', [n]);
    await client.end();

    await cluster.crashLeader();
    cluster.resumeReplication(standby);
    expect(await cluster.waitForLeader({ notMember: leader })).toBe(standby);
    const after = await connect(cluster.url);
    try {
      const { rows } = await after.query('select count(*)::int as n, max(n) as max from acked');
      // 150 commits were acknowledged; the 50 made while the standby was frozen are gone.
      expect(rows[0]).toEqual({ n: 100, max: 100 });
    } finally {
      await after.end();
    }
  }, 60_000);
});

async function waitForReplay(url: string, rows: number): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const client = await connect(url);
    try {
      const { rows: [row] } = await client.query(`select count(*)::int as n from acked`).catch(() => ({ rows: [{ n: 0 }] }));
      if (row.n === rows) return;
    } finally {
      await client.end();
    }
    if (Date.now() > deadline) throw new Error(`the standby did not replay ${rows} rows within 10 s`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
