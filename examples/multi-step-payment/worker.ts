/**
 * A payment in three steps and a completion. A retry or a takeover skips the steps already
 * recorded; the provider call gets the step's own idempotency key, so a repeat after a crash
 * mid-call is a no-op at the provider too.
 */
import { sql, type Kysely } from 'kysely';
import { IdempotencyKeys, createIdempotentWorker, createPostgresDb, migrate } from 'idempotent-jobs';
import { loadEnvConfig } from 'idempotent-jobs/process';

const config = loadEnvConfig();
const db = createPostgresDb({ connectionString: config.DATABASE_URL, maxConnections: 4 });
await migrate(db, { schema: config.SCHEMA });
const t = (name: string) => sql.id(config.SCHEMA, name);
await sql`create table if not exists ${t('reservations')} (order_id text primary key, cents integer not null)`.execute(db);
await sql`create table if not exists ${t('provider_charges')} (idempotency_key text primary key, cents integer not null)`.execute(db);
await sql`create table if not exists ${t('payments')} (order_id text primary key, charge_id text not null)`.execute(db);

/** Stands in for a payment provider that deduplicates by idempotency key (as Stripe does). */
async function chargeAtProvider(provider: Kysely<any>, idempotencyKey: string, cents: number): Promise<{ chargeId: string }> {
  await sql`insert into ${t('provider_charges')} (idempotency_key, cents) values (${idempotencyKey}, ${cents}) on conflict do nothing`.execute(provider);
  return { chargeId: `ch_${idempotencyKey.slice(4, 16)}` };
}

const worker = createIdempotentWorker<{ orderId: string; cents: number }>({
  queue: 'payments',
  connection: { url: config.REDIS_URL },
  prefix: config.REDIS_PREFIX,
  keys: new IdempotencyKeys({ db, schema: config.SCHEMA }),
  handler: async (ctx) => {
    const { orderId, cents } = ctx.data;
    // Database step: its row and its record commit together, exactly once.
    await ctx.step('reserve', {
      transaction: (tx) => sql`insert into ${t('reservations')} (order_id, cents) values (${orderId}, ${cents})`.execute(tx).then(() => ({ reserved: cents })),
    });
    // External step: at most once per lease; step.stepKey is the same on every run.
    const { chargeId } = await ctx.step('charge', (step) => chargeAtProvider(db, step.stepKey, cents));
    // Completion: the payment row and the key's completion commit together.
    return ctx.transaction(async (tx) => {
      await sql`insert into ${t('payments')} (order_id, charge_id) values (${orderId}, ${chargeId})`.execute(tx);
      return { orderId, chargeId };
    });
  },
});
console.log('payment worker running');

for (const signal of ['SIGINT', 'SIGTERM'] as const) {
  process.once(signal, async () => {
    await worker.close();
    await db.destroy();
  });
}
