/**
 * Helpers shared by the protocol tests: an effects table with NO unique constraint (so a
 * duplicate effect is visible as a second row), lease backdating, and a gate promise.
 */
import { sql, type Kysely } from 'kysely';
import type { GroupStatements, KeyStore } from '../../src/store/key-store.js';
import type { PostgresKeyStore } from '../../src/store/postgres-key-store.js';

/** Creates `<schema>.effects`: one row per committed effect; duplicates are allowed on purpose. */
export async function createEffectsTable(db: Kysely<any>, schema: string): Promise<void> {
  await sql`create table if not exists ${sql.id(schema, 'effects')} (
    id bigint generated always as identity primary key,
    scope text not null,
    key text not null,
    fence bigint not null,
    worker text not null,
    created_at timestamptz not null default now()
  )`.execute(db);
}

/** Inserts one effect row in `tx` (the effect of the tests). */
export async function insertEffect(
  tx: Kysely<any>,
  schema: string,
  row: { scope: string; key: string; fence: number; worker: string },
): Promise<void> {
  await sql`insert into ${sql.id(schema, 'effects')} (scope, key, fence, worker)
            values (${row.scope}, ${row.key}, ${row.fence}, ${row.worker})`.execute(tx);
}

/** Committed effects of one key. */
export async function effectsOf(db: Kysely<any>, schema: string, scope: string, key: string) {
  const { rows } = await sql<{ fence: string; worker: string }>`
    select fence, worker from ${sql.id(schema, 'effects')} where scope = ${scope} and key = ${key} order by id`.execute(db);
  return rows.map((r) => ({ fence: Number(r.fence), worker: r.worker }));
}

/** Makes a key's lease look expired, by the database clock. */
export async function expireLease(db: Kysely<any>, schema: string, scope: string, key: string): Promise<void> {
  await sql`update ${sql.id(schema, 'idempotency_keys')}
            set locked_until = now() - interval '1 second'
            where scope = ${scope} and key = ${key}`.execute(db);
}

/** A promise opened from outside: hold a handler on `gate.wait`, then `gate.open()`. */
export function createGate() {
  let open!: () => void;
  const wait = new Promise<void>((resolve) => (open = resolve));
  return { wait, open };
}

/**
 * `store` with its group statements replaced (a fault injected, what it reports of the
 * database fixed): every other member is the store's own, bound to it.
 */
export function withGroupStatements(store: PostgresKeyStore, groupStatements: GroupStatements): KeyStore {
  return new Proxy(store, {
    get: (target, name) => {
      if (name === 'groupStatements') return groupStatements;
      const value = Reflect.get(target, name, target) as unknown;
      return typeof value === 'function' ? (value as (...args: unknown[]) => unknown).bind(target) : value;
    },
  });
}
