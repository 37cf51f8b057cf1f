/**
 * The demo payments domain: a charge job makes two effects.
 *
 * 1. An external effect: a call to a (simulated) payment provider that, like Stripe, takes an
 *    idempotency key and returns the same charge for the same key. Every call is logged in
 *    `provider_calls`, so a repeated call (possible only after a takeover) is visible.
 * 2. A transactional effect: a ledger row, committed together with the key's completion.
 *    `ledger` has no unique constraint on the key on purpose: a duplicate would show up as a
 *    second row, which the demo's summary counts (it must be 0).
 */
import { randomUUID } from 'node:crypto';
import { sql, type Kysely } from 'kysely';
import type { JobContext } from '../../src/index.js';

export interface ChargePayload {
  readonly orderId: string;
  readonly cents: number;
  readonly currency?: string;
}

export interface ChargeResult {
  readonly chargeId: string;
  readonly ledgerId: string;
}

/** Creates the demo tables in `schema` (idempotent). */
export async function createPaymentsTables(db: Kysely<any>, schema: string): Promise<void> {
  const t = (name: string) => sql.id(schema, name);
  await sql`create table if not exists ${t('ledger')} (
    id bigint generated always as identity primary key,
    scope text not null, key text not null, order_id text not null,
    cents integer not null, charge_id text not null, fence bigint not null, worker_pid integer not null,
    created_at timestamptz not null default now())`.execute(db);
  await sql`create table if not exists ${t('provider_charges')} (
    idempotency_key text primary key, charge_id text not null, cents integer not null,
    created_at timestamptz not null default now())`.execute(db);
  await sql`create table if not exists ${t('provider_calls')} (
    id bigint generated always as identity primary key, idempotency_key text not null, fence bigint not null,
    created_at timestamptz not null default now())`.execute(db);
}

/**
 * A stand-in for a payment provider's API: deduplicates charges by idempotency key, as real
 * providers do. It lives in the same database only for the demo's convenience; it is called
 * outside the effect transaction, like any remote API.
 */
export class SimulatedPaymentProvider {
  constructor(
    private readonly db: Kysely<any>,
    private readonly schema: string,
  ) {}

  async charge(request: { idempotencyKey: string; cents: number; fence: number }): Promise<{ chargeId: string }> {
    await new Promise((resolve) => setTimeout(resolve, 2 + Math.random() * 8)); // network latency
    await sql`insert into ${sql.id(this.schema, 'provider_calls')} (idempotency_key, fence)
              values (${request.idempotencyKey}, ${request.fence})`.execute(this.db);
    const { rows } = await sql<{ charge_id: string }>`
      with inserted as (
        insert into ${sql.id(this.schema, 'provider_charges')} (idempotency_key, charge_id, cents)
        values (${request.idempotencyKey}, ${`ch_${randomUUID()}`}, ${request.cents})
        on conflict (idempotency_key) do nothing
        returning charge_id)
      select charge_id from inserted
      union all
      select charge_id from ${sql.id(this.schema, 'provider_charges')} where idempotency_key = ${request.idempotencyKey}
      limit 1`.execute(this.db);
    return { chargeId: rows[0]!.charge_id };
  }
}

/** The charge handler: provider call (key passed downstream), then the ledger row in the key's transaction. */
export function chargeHandler(provider: SimulatedPaymentProvider, schema: string) {
  return async (ctx: JobContext<ChargePayload>): Promise<ChargeResult> => {
    const { chargeId } = await provider.charge({ idempotencyKey: `${ctx.scope}:${ctx.key}`, cents: ctx.data.cents, fence: ctx.fence });
    return ctx.transaction(async (tx) => {
      const { rows } = await sql<{ id: string }>`
        insert into ${sql.id(schema, 'ledger')} (scope, key, order_id, cents, charge_id, fence, worker_pid)
        values (${ctx.scope}, ${ctx.key}, ${ctx.data.orderId}, ${ctx.data.cents}, ${chargeId}, ${ctx.fence}, ${process.pid})
        returning id`.execute(tx);
      return { chargeId, ledgerId: String(rows[0]!.id) };
    });
  };
}
