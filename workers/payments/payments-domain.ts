/**
 * The demo payments domain: a charge job is a multi-step payment, each step a `ctx.step`.
 *
 * 1. `reserve` (database step): a row in `reservations`, committed with the step's record.
 * 2. `charge` (external step): a call to a (simulated) payment provider that, like Stripe,
 *    takes an idempotency key (the step's `stepKey`) and returns the same charge for the same
 *    key. Every call is logged in `provider_calls`, so a repeated call is visible.
 * 3. `ledger` (database step): a row in `ledger`.
 * 4. `email` (external step): a receipt through a (simulated) mailer that knows nothing of
 *    idempotency keys: every call sends an e-mail, logged in `emails`.
 * 5. Completion (`ctx.transaction`): a row in `payments`, committed with the key's completion.
 *
 * The effect tables have no unique constraint on the key on purpose: a database effect that
 * ran twice would show up as a second row, which the demo's summary counts (it must be 0).
 * Each database step also logs its run in `step_calls`, outside its transaction, so a run that
 * rolled back (its worker died before the COMMIT) still shows as a call; and each run starts by
 * logging itself there (step `run`), so a worker killed before its first step is still known.
 * Every row carries the fence and the worker's pid, so the demo can tell which run did what.
 */
import { randomUUID } from 'node:crypto';
import { sql, type Kysely } from 'kysely';
import type { JobContext, StepContext } from '../../src/index.js';

export interface ChargePayload {
  readonly orderId: string;
  readonly cents: number;
  readonly currency?: string;
}

export interface ChargeResult {
  readonly reservationId: string;
  readonly chargeId: string;
  readonly ledgerId: string;
  readonly emailId: string;
}

/** The steps of a payment, in order, and which kind each is. */
export const PAYMENT_STEPS = [
  { name: 'reserve', kind: 'database' },
  { name: 'charge', kind: 'external' },
  { name: 'ledger', kind: 'database' },
  { name: 'email', kind: 'external' },
] as const;

/** Creates the demo tables in `schema` (idempotent). */
export async function createPaymentsTables(db: Kysely<any>, schema: string): Promise<void> {
  const t = (name: string) => sql.id(schema, name);
  const effectColumns = sql.raw('scope text not null, key text not null, fence bigint not null, worker_pid integer not null');
  await sql`create table if not exists ${t('reservations')} (
    id bigint generated always as identity primary key, ${effectColumns},
    order_id text not null, cents integer not null, created_at timestamptz not null default now())`.execute(db);
  await sql`create table if not exists ${t('ledger')} (
    id bigint generated always as identity primary key, ${effectColumns},
    order_id text not null, cents integer not null, charge_id text not null, created_at timestamptz not null default now())`.execute(db);
  await sql`create table if not exists ${t('payments')} (
    id bigint generated always as identity primary key, ${effectColumns},
    order_id text not null, charge_id text not null, ledger_id bigint not null, email_id text not null,
    created_at timestamptz not null default now())`.execute(db);
  await sql`create table if not exists ${t('step_calls')} (
    id bigint generated always as identity primary key, ${effectColumns},
    step text not null, created_at timestamptz not null default now())`.execute(db);
  await sql`create table if not exists ${t('provider_charges')} (
    idempotency_key text primary key, charge_id text not null, cents integer not null,
    created_at timestamptz not null default now())`.execute(db);
  await sql`create table if not exists ${t('provider_calls')} (
    id bigint generated always as identity primary key, idempotency_key text not null, ${effectColumns},
    created_at timestamptz not null default now())`.execute(db);
  await sql`create table if not exists ${t('emails')} (
    id text primary key, ${effectColumns}, recipient text not null, subject text not null,
    created_at timestamptz not null default now())`.execute(db);
}

/** Waits `min` to `min + spread` ms: a simulated network leg. */
const latency = (min: number, spread: number) => new Promise((resolve) => setTimeout(resolve, min + Math.random() * spread));

/** Who is calling, for the logs of the simulated systems (a real provider keeps it as metadata). */
interface Caller {
  readonly scope: string;
  readonly key: string;
  readonly fence: number;
}

/**
 * A stand-in for a payment provider's API: deduplicates charges by idempotency key, as real
 * providers do. It lives in the same database only for the demo's convenience; it is called
 * outside any transaction of the job's, like any remote API.
 */
export class SimulatedPaymentProvider {
  constructor(
    private readonly db: Kysely<any>,
    private readonly schema: string,
  ) {}

  async charge(request: { idempotencyKey: string; cents: number; caller: Caller }): Promise<{ chargeId: string }> {
    const { scope, key, fence } = request.caller;
    await latency(1, 4); // the request's way there
    await sql`insert into ${sql.id(this.schema, 'provider_calls')} (idempotency_key, scope, key, fence, worker_pid)
              values (${request.idempotencyKey}, ${scope}, ${key}, ${fence}, ${process.pid})`.execute(this.db);
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
    await latency(1, 4); // the answer's way back: the charge exists, the caller does not know yet
    return { chargeId: rows[0]!.charge_id };
  }
}

/**
 * A stand-in for a mailer without idempotency keys (plain SMTP): every call sends an e-mail.
 * A call repeated after a takeover is a second e-mail to the customer.
 */
export class SimulatedMailer {
  constructor(
    private readonly db: Kysely<any>,
    private readonly schema: string,
  ) {}

  async send(message: { to: string; subject: string; caller: Caller }): Promise<{ emailId: string }> {
    const { scope, key, fence } = message.caller;
    await latency(3, 7); // connecting, greeting, envelope
    const emailId = `em_${randomUUID()}`;
    await sql`insert into ${sql.id(this.schema, 'emails')} (id, scope, key, fence, worker_pid, recipient, subject)
              values (${emailId}, ${scope}, ${key}, ${fence}, ${process.pid}, ${message.to}, ${message.subject})`.execute(this.db);
    await latency(3, 7); // the server's reply to DATA and QUIT: the e-mail is out, the caller does not know yet
    return { emailId };
  }
}

/**
 * The payment handler: reserve → charge → ledger → e-mail → completion. `db` logs the database
 * steps' runs in `step_calls` on a connection of its own, outside their transactions.
 */
export function paymentHandler(db: Kysely<any>, provider: SimulatedPaymentProvider, mailer: SimulatedMailer, schema: string) {
  const t = (name: string) => sql.id(schema, name);
  const logCall = (ctx: JobContext<ChargePayload>, step: StepContext) =>
    sql`insert into ${t('step_calls')} (scope, key, fence, worker_pid, step)
        values (${ctx.scope}, ${ctx.key}, ${step.fence}, ${process.pid}, ${step.name})`.execute(db);

  return async (ctx: JobContext<ChargePayload>): Promise<ChargeResult> => {
    await sql`insert into ${t('step_calls')} (scope, key, fence, worker_pid, step)
              values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${process.pid}, 'run')`.execute(db);
    const { orderId, cents } = ctx.data;
    const caller = { scope: ctx.scope, key: ctx.key, fence: ctx.fence };
    const { reservationId } = await ctx.step('reserve', {
      transaction: async (tx, step) => {
        await logCall(ctx, step);
        const { rows } = await sql<{ id: string }>`
          insert into ${t('reservations')} (scope, key, fence, worker_pid, order_id, cents)
          values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${process.pid}, ${orderId}, ${cents})
          returning id`.execute(tx);
        return { reservationId: String(rows[0]!.id) };
      },
    });
    const { chargeId } = await ctx.step('charge', (step) => provider.charge({ idempotencyKey: step.stepKey, cents, caller }));
    const { ledgerId } = await ctx.step('ledger', {
      transaction: async (tx, step) => {
        await logCall(ctx, step);
        const { rows } = await sql<{ id: string }>`
          insert into ${t('ledger')} (scope, key, fence, worker_pid, order_id, cents, charge_id)
          values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${process.pid}, ${orderId}, ${cents}, ${chargeId})
          returning id`.execute(tx);
        return { ledgerId: String(rows[0]!.id) };
      },
    });
    const { emailId } = await ctx.step('email', () =>
      mailer.send({ to: `customer+${orderId}@example.com`, subject: `Receipt for order ${orderId}`, caller }),
    );
    return ctx.transaction(async (tx) => {
      await sql`insert into ${t('payments')} (scope, key, fence, worker_pid, order_id, charge_id, ledger_id, email_id)
                values (${ctx.scope}, ${ctx.key}, ${ctx.fence}, ${process.pid}, ${orderId}, ${chargeId}, ${ledgerId}, ${emailId})`.execute(tx);
      return { reservationId, chargeId, ledgerId, emailId };
    });
  };
}
