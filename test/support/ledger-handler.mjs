// A database-only handler module as `idempotent-jobs worker --handler` loads it: plain
// JavaScript, default export `{ transaction: async (tx, ctx) => result }`. It writes one row of
// SCHEMA's `ledger` (the test creates it) through `tx`, and nothing else.
import { sql } from 'kysely';

export default {
  async transaction(tx, ctx) {
    await sql`insert into ${sql.id(process.env.SCHEMA, 'ledger')} (key, amount) values (${ctx.key}, ${ctx.data.amount})`.execute(tx);
    return { booked: ctx.data.amount, key: ctx.key };
  },
};
