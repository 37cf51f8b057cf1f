import { randomBytes } from 'node:crypto';
import { sql } from 'kysely';
import { pino } from 'pino';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { ConfigError, IdempotencyKeys, migrate } from '../src/index.js';
import { Janitor } from '../src/process/index.js';
import { keysTableLayout } from '../src/store/sql/keys-table-layout.js';
import { createTestEnv, type TestEnv } from './support/test-env.js';

const PARTITIONS = 4;
const silent = pino({ level: 'silent' });

// This file's own schema is partitioned whatever TEST_KEYS_PARTITIONS says; other schemas it
// creates are named after it and dropped at teardown.
let env: TestEnv;
const otherSchemas: string[] = [];

beforeAll(async () => {
  env = await createTestEnv('keys_partitions', { keysPartitions: PARTITIONS });
});
afterAll(async () => {
  for (const schema of otherSchemas) await sql`drop schema if exists ${sql.id(schema)} cascade`.execute(env.db);
  await env?.teardown();
});
beforeEach(async () => {
  await sql`truncate ${sql.id(env.schema, 'idempotency_keys')}, ${sql.id(env.schema, 'outbox')} cascade`.execute(env.db);
});

function anotherSchema(label: string): string {
  const schema = `${env.schema.slice(0, 40)}_${label}_${randomBytes(2).toString('hex')}`;
  otherSchemas.push(schema);
  return schema;
}

const keysTable = () => sql.id(env.schema, 'idempotency_keys');

/** Rows per partition of this file's keys table, by partition name. */
async function rowsPerPartition(): Promise<Map<string, number>> {
  const { rows } = await sql<{ partition: string; n: string }>`
    select tableoid::regclass::text as partition, count(*) as n from ${keysTable()} group by 1`.execute(env.db);
  return new Map(rows.map((r) => [r.partition.split('.').pop()!, Number(r.n)]));
}

async function appliedMigrations(schema: string): Promise<string[]> {
  const { rows } = await sql<{ name: string }>`select name from ${sql.id(schema, 'idempotent_jobs_migration')} order by name`.execute(env.db);
  return rows.map((r) => r.name);
}

describe('migrate with keysPartitions', () => {
  it('creates the keys table hash-partitioned on its primary key, each partition with the indexes and the fillfactor', async () => {
    const layout = await keysTableLayout(env.db, env.schema);
    expect(layout).toEqual({ exists: true, partitions: ['idempotency_keys_p0', 'idempotency_keys_p1', 'idempotency_keys_p2', 'idempotency_keys_p3'] });
    const { rows: key } = await sql<{ key: string }>`
      select pg_get_partkeydef(${`${env.schema}.idempotency_keys`}::regclass) as key`.execute(env.db);
    expect(key[0]!.key).toBe('HASH (scope, key)');
    const { rows: partitions } = await sql<{ relname: string; reloptions: string[] | null; indexes: string }>`
      select c.relname, c.reloptions, (select count(*) from pg_index i where i.indrelid = c.oid) as indexes
        from pg_inherits h join pg_class c on c.oid = h.inhrelid
       where h.inhparent = ${`${env.schema}.idempotency_keys`}::regclass order by c.relname`.execute(env.db);
    expect(partitions.map((p) => [p.relname, p.reloptions, Number(p.indexes)])).toEqual(
      layout.partitions.map((name) => [name, ['fillfactor=85'], 3]),
    );
  });

  it('claims, completes and deduplicates keys spread over every partition, and job_steps follow their key', async () => {
    const keys = new IdempotencyKeys({ db: env.db, schema: env.schema });
    const names = Array.from({ length: 40 }, (_, i) => `spread-${i}`);
    for (const name of names) {
      const claim = await keys.claim('partitions', name, 'fp');
      expect(claim.kind).toBe('claimed');
      if (claim.kind !== 'claimed') continue;
      await keys.runEffect(claim, async () => `done ${name}`);
    }
    const again = await keys.claim('partitions', 'spread-7', 'fp');
    expect(again).toMatchObject({ kind: 'completed', result: 'done spread-7' });
    // A takeover (the leased path's second claim of a key) and the fenced completion, on a partition.
    const taken = await keys.claim('partitions', 'takeover', 'fp');
    await sql`update ${keysTable()} set locked_until = now() - interval '1 second' where key = 'takeover'`.execute(env.db);
    const second = await keys.claim('partitions', 'takeover', 'fp');
    expect([taken.kind, second.kind]).toEqual(['claimed', 'taken-over']);
    if (second.kind === 'taken-over') await keys.runEffect(second, async () => 'second');
    await expect(keys.claim('partitions', 'takeover', 'fp')).resolves.toMatchObject({ kind: 'completed', result: 'second' });
    const counts = await rowsPerPartition();
    expect(counts.size).toBe(PARTITIONS);
    expect([...counts.values()].reduce((a, b) => a + b, 0)).toBe(names.length + 1);

    await sql`insert into ${sql.id(env.schema, 'job_steps')} (scope, key, name, position, fence)
              values ('partitions', 'spread-3', 'charge', 1, 1)`.execute(env.db);
    await expect(
      sql`insert into ${sql.id(env.schema, 'job_steps')} (scope, key, name, position, fence)
          values ('partitions', 'no-such-key', 'charge', 1, 1)`.execute(env.db),
    ).rejects.toMatchObject({ code: '23503' });
    await sql`delete from ${keysTable()} where key = 'spread-3'`.execute(env.db);
    const { rows } = await sql`select 1 from ${sql.id(env.schema, 'job_steps')}`.execute(env.db);
    expect(rows).toHaveLength(0);
  });

  it('refuses an existing unpartitioned keys table with a clear error and changes nothing', async () => {
    const schema = anotherSchema('plain');
    await migrate(env.db, { schema });
    const before = await appliedMigrations(schema);
    const refusal = migrate(env.db, { schema, keysPartitions: 16 });
    await expect(refusal).rejects.toBeInstanceOf(ConfigError);
    await expect(refusal).rejects.toThrow(
      new RegExp(`Schema "${schema}" has one plain \\(unpartitioned\\) keys table, but keysPartitions \\(KEYS_PARTITIONS\\) asks for 16 hash partitions.*docs/operations.md`),
    );
    expect(await keysTableLayout(env.db, schema)).toEqual({ exists: true, partitions: [] });
    expect(await appliedMigrations(schema)).toEqual(before);
    // Unset: the table is used as it is; 0 asks for what is there.
    await expect(migrate(env.db, { schema })).resolves.toMatchObject({ results: [] });
    await expect(migrate(env.db, { schema, keysPartitions: 0 })).resolves.toMatchObject({ results: [] });
  });

  it('refuses another partition count or a plain table against a partitioned one, and accepts it unset', async () => {
    await expect(migrate(env.db, { schema: env.schema, keysPartitions: 8 })).rejects.toThrow(/has a keys table in 4 hash partitions, but .* asks for 8 hash partitions/);
    await expect(migrate(env.db, { schema: env.schema, keysPartitions: 0 })).rejects.toThrow(/asks for one plain table/);
    await expect(migrate(env.db, { schema: env.schema })).resolves.toMatchObject({ results: [] });
    await expect(migrate(env.db, { schema: env.schema, keysPartitions: PARTITIONS })).resolves.toMatchObject({ results: [] });
  });

  it('refuses partition counts it does not create, before touching the database', async () => {
    const schema = anotherSchema('bad');
    for (const keysPartitions of [1, -2, 2.5, 1025]) {
      await expect(migrate(env.db, { schema, keysPartitions })).rejects.toThrow(/must be 0 \(one plain keys table\) or an integer from 2 to 1024/);
    }
    const { rows } = await sql`select 1 from pg_namespace where nspname = ${schema}`.execute(env.db);
    expect(rows).toHaveLength(0);
  });
});

describe('converting a plain keys table (docs/operations.md, "A partitioned keys table")', () => {
  it('moves every key and step into a partitioned table the same schema\'s functions then use', async () => {
    const live = anotherSchema('live');
    const scratch = anotherSchema('new');
    const old = anotherSchema('old');
    await migrate(env.db, { schema: live });
    const before = new IdempotencyKeys({ db: env.db, schema: live });
    const done = await before.claim('convert', 'done', 'fp');
    if (done.kind !== 'claimed') throw new Error(done.kind);
    await before.runEffect(done, async () => 'before');
    await sql`insert into ${sql.id(live, 'job_steps')} (scope, key, name, position, fence) values ('convert', 'done', 'charge', 1, 1)`.execute(env.db);
    await sql`insert into ${sql.id(live, 'idempotency_keys')} (scope, key, fingerprint, status)
              select 'convert', 'k-' || n, 'fp', 'completed' from generate_series(1, 200) as n`.execute(env.db);

    await migrate(env.db, { schema: scratch, keysPartitions: PARTITIONS });
    // The documented statements, with the schema names of this test.
    await env.db.transaction().execute(async (tx) => {
      const [l, n, o] = [sql.id(live), sql.id(scratch), sql.id(old)];
      await sql`create schema ${o}`.execute(tx);
      await sql`alter table ${l}.job_steps set schema ${o}`.execute(tx);
      await sql`alter table ${l}.idempotency_keys set schema ${o}`.execute(tx);
      await sql`insert into ${n}.idempotency_keys select * from ${o}.idempotency_keys`.execute(tx);
      await sql`insert into ${n}.job_steps select * from ${o}.job_steps`.execute(tx);
      await sql`alter table ${n}.idempotency_keys set schema ${l}`.execute(tx);
      await sql.raw(`do $$
        declare p text;
        begin
          for p in select c.relname from pg_inherits i join pg_class c on c.oid = i.inhrelid
                    where i.inhparent = '${live}.idempotency_keys'::regclass loop
            execute format('alter table ${scratch}.%I set schema ${live}', p);
          end loop;
        end $$`).execute(tx);
      await sql`alter table ${n}.job_steps set schema ${l}`.execute(tx);
      await sql`drop trigger idempotency_keys_tombstone_check on ${l}.idempotency_keys`.execute(tx);
      await sql`create trigger idempotency_keys_tombstone_check after insert on ${l}.idempotency_keys
                  for each row execute function ${l}.refuse_tombstoned_key()`.execute(tx);
    });
    // The scratch schema goes; the tombstone check must not go with it, and must read this schema's tombstones.
    await sql`drop schema ${sql.id(scratch)} cascade`.execute(env.db);
    await sql`insert into ${sql.id(live, 'key_tombstones')} (scope, key_hash, fingerprint_hash, failed, finished_at, expires_at)
              values ('convert', sha256(convert_to('buried', 'UTF8')), sha256(convert_to('fp', 'UTF8')), false, now(), now() + interval '1 day')`.execute(env.db);

    expect((await keysTableLayout(env.db, live)).partitions).toHaveLength(PARTITIONS);
    await expect(migrate(env.db, { schema: live, keysPartitions: PARTITIONS })).resolves.toMatchObject({ results: [] });
    const after = new IdempotencyKeys({ db: env.openDb(2), schema: live });
    await expect(after.claim('convert', 'done', 'fp')).resolves.toMatchObject({ kind: 'completed', result: 'before' });
    await expect(after.claim('convert', 'buried', 'fp')).resolves.toMatchObject({ kind: 'completed', resultExpired: {} });
    const fresh = await after.claim('convert', 'fresh', 'fp');
    if (fresh.kind !== 'claimed') throw new Error(fresh.kind);
    await after.runEffect(fresh, async () => 'after');
    const { rows } = await sql<{ partitioned: string; steps: string }>`
      select (select count(*) from ${sql.id(live, 'idempotency_keys')}) as partitioned,
             (select count(*) from ${sql.id(live, 'job_steps')} where key = 'done') as steps`.execute(env.db);
    expect(rows[0]).toEqual({ partitioned: '202', steps: '1' });
    // The steps' foreign key points at the partitioned table: deleting a key there deletes its steps.
    await sql`delete from ${sql.id(live, 'idempotency_keys')} where key = 'done'`.execute(env.db);
    const { rows: steps } = await sql`select 1 from ${sql.id(live, 'job_steps')}`.execute(env.db);
    expect(steps).toHaveLength(0);
  });
});

describe('Janitor on a partitioned keys table', () => {
  async function insertKeys(prefix: string, count: number, status: 'completed' | 'processing', expiresIn: string | null): Promise<void> {
    const expires = expiresIn === null ? sql`null::timestamptz` : sql`now() + ${expiresIn}::interval`;
    await sql`
      insert into ${keysTable()} (scope, key, fingerprint, status, owner, locked_until, completed_at, expires_at)
      select 'janitor', ${prefix} || '-' || n, 'fp', ${status},
             case when ${status} = 'processing' then gen_random_uuid() end,
             case when ${status} = 'processing' then now() + interval '1 minute' end,
             case when ${status} = 'completed' then now() - interval '1 day' end, ${expires}
        from generate_series(1, ${count}) as n`.execute(env.db);
  }

  it('deletes the expired keys of every partition and only those', async () => {
    await insertKeys('expired', 500, 'completed', '-1 hour');
    await insertKeys('live', 120, 'completed', '1 hour');
    await insertKeys('running', 80, 'processing', null);
    const janitor = new Janitor({ db: env.db, schema: env.schema, batchSize: 50, maxBatchesPerRun: 1_000, logger: silent });
    expect(await janitor.runOnce()).toMatchObject({ keysDeleted: 500, more: false });
    const { rows } = await sql<{ key: string }>`select key from ${keysTable()}`.execute(env.db);
    expect(rows.filter((r) => r.key.startsWith('expired-'))).toEqual([]);
    expect(rows).toHaveLength(200);
    expect([...(await rowsPerPartition()).keys()]).toHaveLength(PARTITIONS);
  });

  it('shares maxBatchesPerRun among the partitions and starts the next run where the last one stopped', async () => {
    await insertKeys('expired', 400, 'completed', '-1 minute');
    const janitor = new Janitor({ db: env.db, schema: env.schema, batchSize: 20, maxBatchesPerRun: 3, logger: silent });
    const first = await janitor.runOnce();
    expect(first).toMatchObject({ keysDeleted: 60, more: true });
    let total = first.keysDeleted;
    for (let run = 0; run < 100; run++) {
      const report = await janitor.runOnce();
      total += report.keysDeleted;
      expect(report.keysDeleted).toBeLessThanOrEqual(60);
      if (!report.more) break;
    }
    expect(total).toBe(400);
    expect((await rowsPerPartition()).size).toBe(0);
  });
});
