/**
 * The check that a data layer's transaction meets the keys in one database
 * (src/store/foreign-transaction.ts `whyElsewhere`): told apart by what each connection read.
 */
import { describe, expect, it } from 'vitest';
import { whyElsewhere } from '../src/store/foreign-transaction.js';
import type { DatabaseIdentity } from '../src/store/sql/database-identity.js';

const keys: DatabaseIdentity = { system_identifier: '7300000000000000001', started_at: '2026-12-02 04:00:00+00', database: 'app', database_oid: '16384', keys_table: '40000' };

describe('whyElsewhere', () => {
  it('the same cluster, database and keys table: not elsewhere', () => {
    expect(whyElsewhere({ ...keys }, keys, 'idempotent_jobs')).toBeUndefined();
  });

  it('a server restarted (or failed over) since the keys were read is the same cluster when both read its system identifier', () => {
    expect(whyElsewhere({ ...keys, started_at: '2026-12-02 05:00:00+00' }, keys, 'idempotent_jobs')).toBeUndefined();
  });

  it('another cluster, another database, or no keys table is elsewhere, and says which', () => {
    expect(whyElsewhere({ ...keys, system_identifier: '7300000000000000002' }, keys, 'idempotent_jobs')).toMatch(/another Postgres server/);
    expect(whyElsewhere({ ...keys, database: 'other', database_oid: '16385' }, keys, 'idempotent_jobs')).toMatch(/database "other"/);
    expect(whyElsewhere({ ...keys, keys_table: null }, keys, 'idempotent_jobs')).toMatch(/does not exist or cannot be seen/);
  });

  it('without the system identifier (a role that cannot read it), the start time tells servers apart', () => {
    const unread = { ...keys, system_identifier: null };
    expect(whyElsewhere(unread, unread, 'idempotent_jobs')).toBeUndefined();
    expect(whyElsewhere({ ...unread, started_at: '2026-12-02 05:00:00+00' }, unread, 'idempotent_jobs')).toMatch(/another Postgres server/);
  });
});
